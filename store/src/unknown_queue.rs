//! Writing work for the reconciler: a payment whose outcome is uncertain.
//!
//! Whoever moves a payment to `unknown` (the worker after a timeout, reset or 5xx; the sweeper after
//! an expired lease past the provider's key window) calls [`enqueue`] in the same transaction, so an
//! `unknown` payment always has its row in `unknown_payments` and the reconciler always finds it.
//!
//! The row also keeps the W3C trace context the payment's resolution should continue: the outbox row
//! that carried the payment's trace is deleted when the payment becomes `unknown`, so the caller hands
//! it on here (the worker its recording span, the sweeper the outbox row's context), and the
//! reconciler's poller or webhook that settles the payment joins the same trace.

use serde_json::Value;
use sqlx::PgConnection;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_service::telemetry::TraceContext;

use crate::StoreError;

/// Queues an `unknown` payment for the reconciler, due now, with the first piece of evidence and the
/// trace its resolution continues (`None`: none, or keep the one a queued row already has).
pub async fn enqueue(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    reason: &str,
    evidence: Value,
    trace: Option<&TraceContext>,
) -> Result<(), StoreError> {
    sqlx::query!(
        r#"
        INSERT INTO unknown_payments (tenant_id, payment_id, reason, evidence, traceparent, tracestate)
        VALUES ($1, $2, $3, jsonb_build_array($4::jsonb), $5, $6)
        ON CONFLICT (tenant_id, payment_id) DO UPDATE
        SET reason = EXCLUDED.reason,
            evidence = unknown_payments.evidence || EXCLUDED.evidence,
            next_poll_at = now(),
            traceparent = COALESCE(EXCLUDED.traceparent, unknown_payments.traceparent),
            tracestate = CASE WHEN EXCLUDED.traceparent IS NULL THEN unknown_payments.tracestate
                              ELSE EXCLUDED.tracestate END
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
        reason,
        evidence,
        trace.map(|t| t.traceparent.as_str()),
        trace.and_then(|t| t.tracestate.as_deref()),
    )
    .execute(conn)
    .await?;
    Ok(())
}
