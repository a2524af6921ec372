//! Queueing a payment whose outcome is uncertain for the reconciler.
//!
//! Whoever moves a payment to `unknown` (the worker after a timeout, reset or 5xx, or a refused
//! resend; the sweeper after an expired lease past the provider's key window) calls [`enqueue`] in
//! the same transaction, so an `unknown` payment always has its row in `unknown_payments` and the
//! reconciler always finds it.

use serde_json::Value;
use sqlx::PgConnection;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_service::telemetry::TraceContext;

use crate::StoreError;

/// What the provider said when it refused a resend of a payment that may already have been charged:
/// evidence for the reconciler's lookups and for an operator. An empty lookup does not fail such a
/// payment, since an earlier send may still land (`reconciler/src/poller/payments.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The provider's code, e.g. `provider_rejected`.
    pub code: String,
    /// In oncepay's words.
    pub message: String,
}

/// Queues an `unknown` payment for the reconciler, due now, with the first piece of evidence, the
/// trace its resolution continues (`None`: none, or keep the one a queued row already has) and the
/// provider's refusal, if a refused resend made it `unknown`.
///
/// The trace goes on this row because the outbox row that carried it is deleted when the payment
/// becomes `unknown`. The worker passes its recording span's, the sweeper the outbox row's, and the
/// poller or webhook that settles the payment joins that trace.
pub async fn enqueue(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    reason: &str,
    evidence: Value,
    trace: Option<&TraceContext>,
    refusal: Option<&Refusal>,
) -> Result<(), StoreError> {
    sqlx::query!(
        r#"
        INSERT INTO unknown_payments (tenant_id, payment_id, reason, evidence, traceparent, tracestate, refused_code,
                                      refused_message)
        VALUES ($1, $2, $3, jsonb_build_array($4::jsonb), $5, $6, $7, $8)
        ON CONFLICT (tenant_id, payment_id) DO UPDATE
        SET reason = EXCLUDED.reason,
            refused_code = EXCLUDED.refused_code,
            refused_message = EXCLUDED.refused_message,
            evidence = unknown_payments.evidence || EXCLUDED.evidence,
            -- The new row's default, now(): Citus takes only IMMUTABLE functions in DO UPDATE SET.
            next_poll_at = EXCLUDED.next_poll_at,
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
        refusal.map(|r| r.code.as_str()),
        refusal.map(|r| r.message.as_str()),
    )
    .execute(conn)
    .await?;
    Ok(())
}
