//! Writing work for the worker: (re)queueing a payment in the outbox.
//!
//! The api queues each new payment inside the accept statement (`sql/accept.sql`); this is for the
//! other ways a payment goes back to `pending`: the reconciler found the provider has no charge, or an
//! operator retried a dead letter. The worker's claim and finish statements, and the sweeper's lease
//! takeover, live with them.

use sqlx::PgConnection;
use time::OffsetDateTime;

use crate::ids::{PaymentId, TenantId};
use crate::store::StoreError;

/// Queues a payment for sending at `available_at` and wakes the workers (at commit). A payment that
/// is already queued keeps its row.
pub async fn enqueue(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    available_at: OffsetDateTime,
) -> Result<(), StoreError> {
    sqlx::query!(
        r#"
        WITH queued AS (
            INSERT INTO outbox (tenant_id, payment_id, available_at, traceparent, tracestate)
            SELECT $1, $2, $3, NULL, NULL
            ON CONFLICT (tenant_id, payment_id) DO NOTHING
            RETURNING payment_id
        )
        SELECT pg_notify('oncepay_outbox', '') AS "notified!: ()" FROM queued
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
        available_at,
    )
    .fetch_optional(conn)
    .await?;
    Ok(())
}
