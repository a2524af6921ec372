//! Queueing a payment for the worker again: the outbox row of a payment that goes back to `pending`
//! because the reconciler found the provider has no charge, or an operator retried a dead letter.
//!
//! The api queues each new payment inside its accept statement (`sql/accept.sql`). The worker's
//! claim and finish live in the worker, the sweeper's lease takeover in [`crate::leases`].

use sqlx::PgConnection;
use time::OffsetDateTime;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_service::telemetry::TraceContext;

use crate::StoreError;

/// Queues a payment for sending at `available_at` and wakes the workers (at commit). A payment that
/// is already queued keeps its row. The send starts a trace of its own.
pub async fn enqueue(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    available_at: OffsetDateTime,
) -> Result<(), StoreError> {
    enqueue_in_trace(conn, tenant_id, payment_id, available_at, None).await
}

/// [`enqueue`], with the worker's send continuing `trace`: a resend the reconciler decided stays in
/// the payment's trace.
pub async fn enqueue_in_trace(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    available_at: OffsetDateTime,
    trace: Option<&TraceContext>,
) -> Result<(), StoreError> {
    sqlx::query!(
        r#"
        WITH queued AS (
            INSERT INTO outbox (tenant_id, payment_id, available_at, traceparent, tracestate)
            VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (tenant_id, payment_id) DO NOTHING
            RETURNING payment_id
        )
        SELECT pg_notify('oncepay_outbox', '') AS "notified!: ()" FROM queued
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
        available_at,
        trace.map(|t| t.traceparent.as_str()),
        trace.and_then(|t| t.tracestate.as_deref()),
    )
    .fetch_optional(conn)
    .await?;
    Ok(())
}
