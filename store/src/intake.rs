//! Intake: replaying a known idempotency key, or accepting a payment request under a new one, in one
//! round trip.
//!
//! [`accept`] runs `sql/accept.sql`, a call of the `intake` function
//! (`migrations/0060_intake_function.sql`, as `0110_payment_method.sql` redefines it). A new key is
//! written with its payment (`pending`), its outbox row and its first audit row in one statement, so
//! either all of it exists or none of it does ([`Intake::Created`]). A known key comes back with
//! nothing written, for the caller to replay or refuse ([`Intake::Existing`]).
//!
//! The SQL lives in files so the benchmark runs the same statements under pgbench; `sql/replay.sql`
//! is the function's replay read on its own, the benchmark's raw replay baseline.

use std::time::Duration;

use serde_json::value::RawValue;
use sqlx::PgConnection;
use sqlx::types::Json;
use time::OffsetDateTime;

use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::payment_method::PaymentMethod;
use oncepay_domain::payment_request::PaymentRequest;
use oncepay_domain::status::PaymentStatus;
use oncepay_service::telemetry::TraceContext;

use crate::StoreError;
use crate::payments::Payment;

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
    /// The terminal response, once the payment is terminal: status and body, the JSON text as
    /// stored (a replay sends it on without parsing it into values and writing it out again).
    pub stored_response: Option<(u16, Box<RawValue>)>,
}

/// What intake found or did.
#[derive(Debug, Clone)]
pub enum Intake {
    /// The key was new: the payment is accepted.
    Created(Created),
    /// The key exists: nothing was written.
    Existing(ExistingKey),
}

impl Intake {
    /// The accepted payment, if this request created it.
    pub fn created(self) -> Option<Created> {
        match self {
            Self::Created(created) => Some(created),
            Self::Existing(_) => None,
        }
    }
}

/// Accepts a payment and wakes the workers when it commits, or returns the key as it exists.
///
/// A key that a concurrent request committed meanwhile is waited for and read again inside the
/// function, so every concurrent duplicate names the same payment.
#[tracing::instrument(name = "store.intake", skip_all, fields(tenant.id = %new.tenant_id))]
pub async fn accept(conn: &mut PgConnection, new: &NewPayment<'_>) -> Result<Intake, StoreError> {
    intake(conn, new, true).await
}

/// [`accept`] without the wake-up: the caller must wake the workers (`NOTIFY oncepay_outbox`) after
/// an accept has committed, or leave the payment to their polling.
///
/// For a caller that folds many accepts into one `NOTIFY`: a `NOTIFY` in every accept serialises
/// their commits (see `sql/accept.sql` and [`crate::notify::Notifier`]). The wake-up is only a hint
/// either way: workers also poll.
#[tracing::instrument(name = "store.intake", skip_all, fields(tenant.id = %new.tenant_id))]
pub async fn accept_deferring_wakeup(conn: &mut PgConnection, new: &NewPayment<'_>) -> Result<Intake, StoreError> {
    intake(conn, new, false).await
}

async fn intake(conn: &mut PgConnection, new: &NewPayment<'_>, wake: bool) -> Result<Intake, StoreError> {
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
        request.payment_method.as_ref().map(PaymentMethod::as_str),
    )
    .fetch_optional(conn)
    .await?
    // The function returns one row unless the key vanished between its insert and its second read.
    .ok_or_else(|| StoreError::Unexpected(sqlx::Error::RowNotFound))?;
    if !row.created {
        let fingerprint = Fingerprint::from_slice(&row.fingerprint).ok_or_else(|| {
            StoreError::Unexpected(sqlx::Error::Decode("a stored fingerprint is not 32 bytes".into()))
        })?;
        let stored_response = match (row.response_status, row.response_body) {
            (Some(status), Some(Json(body))) => Some((u16::try_from(status).unwrap_or(200), body)),
            _ => None,
        };
        return Ok(Intake::Existing(ExistingKey {
            fingerprint,
            payment_id: row.payment_id,
            expires_at: row.expires_at,
            stored_response,
        }));
    }
    let (Some(created_at), Some(updated_at)) = (row.created_at, row.updated_at) else {
        return Err(StoreError::Unexpected(sqlx::Error::Decode("an accepted payment without its timestamps".into())));
    };
    Ok(Intake::Created(Created {
        payment: Payment {
            tenant_id: new.tenant_id,
            payment_id,
            status: PaymentStatus::Pending,
            amount: request.amount,
            currency: request.currency,
            customer_id: request.customer_id.clone(),
            description: request.description.clone(),
            metadata: Json(request.metadata.clone()),
            payment_method: request.payment_method.clone(),
            provider_charge_id: None,
            failure_code: None,
            failure_message: None,
            send_attempts: 0,
            first_sent_at: None,
            created_at,
            updated_at,
        },
        key_expires_at: row.expires_at,
    }))
}
