//! Writing work for the reconciler: a payment whose outcome is uncertain.
//!
//! Whoever moves a payment to `unknown` (the worker after a timeout, reset or 5xx; the sweeper after
//! an expired lease past the provider's key window) calls [`enqueue`] in the same transaction, so an
//! `unknown` payment always has its row in `unknown_payments` and the reconciler always finds it.

use serde_json::Value;
use sqlx::PgConnection;

use crate::ids::{PaymentId, TenantId};
use crate::store::StoreError;

/// Queues an `unknown` payment for the reconciler, due now, with the first piece of evidence.
pub async fn enqueue(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    reason: &str,
    evidence: Value,
) -> Result<(), StoreError> {
    sqlx::query!(
        r#"
        INSERT INTO unknown_payments (tenant_id, payment_id, reason, evidence)
        VALUES ($1, $2, $3, jsonb_build_array($4::jsonb))
        ON CONFLICT (tenant_id, payment_id) DO UPDATE
        SET reason = EXCLUDED.reason,
            evidence = unknown_payments.evidence || EXCLUDED.evidence,
            next_poll_at = now()
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
        reason,
        evidence,
    )
    .execute(conn)
    .await?;
    Ok(())
}
