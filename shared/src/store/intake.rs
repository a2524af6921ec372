//! Intake: accepting a payment request under an idempotency key, and reading a key back for a replay.
//!
//! [`accept`] writes the key, the payment (`pending`), its outbox row, its first audit row and the
//! workers' wake-up in one statement (`sql/accept.sql`), so either all of it exists or none of it
//! does. [`accept_deferring_wakeup`] writes the same rows without the wake-up, for a caller that
//! wakes the workers itself once the statement has committed, coalescing many accepts into one
//! `NOTIFY` (a `NOTIFY` in every accept serialises their commits; see `sql/accept.sql`). The
//! notification is only a hint either way: workers also poll. [`find_key`] is the replay read
//! (`sql/replay.sql`). The SQL lives in files so the benchmark can run the very same statements
//! under pgbench.

use std::time::Duration;

use serde_json::Value;
use sqlx::PgConnection;
use sqlx::types::Json;
use time::OffsetDateTime;

use crate::fingerprint::Fingerprint;
use crate::idempotency_key::IdempotencyKey;
use crate::ids::{PaymentId, TenantId};
use crate::payment::Payment;
use crate::payment_request::PaymentRequest;
use crate::status::PaymentStatus;
use crate::store::StoreError;
use crate::telemetry::TraceContext;

/// A request to accept.
#[derive(Debug)]
pub struct NewPayment<'a> {
    /// The authenticated tenant.
    pub tenant_id: TenantId,
    /// The client's key.
    pub key: &'a IdempotencyKey,
    /// The request's fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// The validated body.
    pub request: &'a PaymentRequest,
    /// How long the key is kept after creation (at least; the reaper never removes a key whose
    /// payment is not terminal).
    pub retention: Duration,
    /// The trace the request belongs to, for the worker to continue.
    pub trace: Option<&'a TraceContext>,
}

/// A freshly accepted payment.
#[derive(Debug, Clone)]
pub struct Created {
    /// The new payment, `pending`.
    pub payment: Payment,
    /// When its key may be reaped.
    pub key_expires_at: OffsetDateTime,
}

/// A key that already exists.
#[derive(Debug, Clone)]
pub struct ExistingKey {
    /// The fingerprint of the request that created it.
    pub fingerprint: Fingerprint,
    /// The payment it created.
    pub payment_id: PaymentId,
    /// When it may be reaped.
    pub expires_at: OffsetDateTime,
    /// The terminal response, once the payment is terminal: status and body.
    pub stored_response: Option<(u16, Value)>,
}

/// Accepts a payment and wakes the workers when it commits, or returns `None` if the key exists
/// (possibly just committed by a concurrent request with the same key, which this waited for).
#[tracing::instrument(name = "store.accept", skip_all, fields(tenant.id = %new.tenant_id))]
pub async fn accept(conn: &mut PgConnection, new: &NewPayment<'_>) -> Result<Option<Created>, StoreError> {
    insert(conn, new, true).await
}

/// [`accept`] without the wake-up: the caller must wake the workers (`NOTIFY oncepay_outbox`) after
/// the statement has committed, or leave the payment to their polling.
#[tracing::instrument(name = "store.accept", skip_all, fields(tenant.id = %new.tenant_id))]
pub async fn accept_deferring_wakeup(
    conn: &mut PgConnection,
    new: &NewPayment<'_>,
) -> Result<Option<Created>, StoreError> {
    insert(conn, new, false).await
}

async fn insert(conn: &mut PgConnection, new: &NewPayment<'_>, wake: bool) -> Result<Option<Created>, StoreError> {
    let payment_id = PaymentId::generate();
    let request = new.request;
    let metadata = Json(&request.metadata);
    let row = sqlx::query_file!(
        "sql/accept.sql",
        new.tenant_id.as_uuid(),
        new.key.as_str(),
        new.fingerprint.as_bytes().as_slice(),
        payment_id.as_uuid(),
        new.retention.as_secs_f64(),
        request.amount.minor_units(),
        request.currency.as_str(),
        request.customer_id,
        request.description,
        metadata as _,
        new.trace.map(|t| t.traceparent.as_str()),
        new.trace.and_then(|t| t.tracestate.as_deref()),
        wake,
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|row| Created {
        payment: Payment {
            tenant_id: new.tenant_id,
            payment_id,
            status: PaymentStatus::Pending,
            amount: request.amount,
            currency: request.currency,
            customer_id: request.customer_id.clone(),
            description: request.description.clone(),
            metadata: Json(request.metadata.clone()),
            provider_charge_id: None,
            failure_code: None,
            failure_message: None,
            send_attempts: 0,
            first_sent_at: None,
            created_at: row.created_at,
            updated_at: row.updated_at,
        },
        key_expires_at: row.expires_at,
    }))
}

/// Reads a key for a replay: one primary-key lookup.
#[tracing::instrument(name = "store.find_key", skip_all, fields(tenant.id = %tenant_id))]
pub async fn find_key(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    key: &IdempotencyKey,
) -> Result<Option<ExistingKey>, StoreError> {
    let row = sqlx::query_file!("sql/replay.sql", tenant_id.as_uuid(), key.as_str()).fetch_optional(conn).await?;
    row.map(|row| {
        let fingerprint = Fingerprint::from_slice(&row.fingerprint).ok_or_else(|| {
            StoreError::Unexpected(sqlx::Error::Decode("a stored fingerprint is not 32 bytes".into()))
        })?;
        let stored_response = match (row.response_status, row.response_body) {
            (Some(status), Some(body)) => Some((u16::try_from(status).unwrap_or(200), body)),
            _ => None,
        };
        Ok(ExistingKey {
            fingerprint,
            payment_id: PaymentId::from_uuid(row.payment_id),
            expires_at: row.expires_at,
            stored_response,
        })
    })
    .transpose()
}
