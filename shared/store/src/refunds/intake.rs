//! Refund intake: replaying a known idempotency key, or accepting a refund under a new one.
//!
//! [`accept`] writes, in one transaction, the refund (`pending`), its key, its first audit row and
//! its outbox row, after raising what the payment has promised back (`payments.refunds_reserved`)
//! under the payment's row lock. Concurrent refunds of one payment queue on that lock, each sees
//! what the ones before it reserved, and one that asks for more than is left is refused with
//! nothing written ([`RefundIntake::Refused`]). A known key comes back with nothing written
//! ([`RefundIntake::Existing`]), for the caller to replay or refuse.
//!
//! A wait for the payment's lock, or for a concurrent writer of the same key, is bounded by the
//! connection's `lock_timeout`; past it PostgreSQL refuses with 55P03 and nothing is written.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::value::RawValue;
use sqlx::types::Json;
use sqlx::{Acquire, PgConnection};
use time::OffsetDateTime;

use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::refund::RefundRequest;
use oncepay_domain::refund_status::RefundStatus;
use oncepay_domain::status::PaymentStatus;
use oncepay_service::telemetry::TraceContext;

use super::{REFUND_OUTBOX_CHANNEL, Refund};
use crate::StoreError;

/// A refund request to accept.
#[derive(Debug, Clone)]
pub struct NewRefund<'a> {
    /// The authenticated tenant.
    pub tenant_id: TenantId,
    /// The payment to give money back from.
    pub payment_id: PaymentId,
    /// The id the refund gets if it is accepted.
    pub refund_id: RefundId,
    /// The client's key.
    pub key: &'a IdempotencyKey,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// The validated body.
    pub request: &'a RefundRequest,
    /// Who asks: `api`, or `operator:<name>`.
    pub requested_by: &'a str,
    /// How long the key is kept after creation (at least; never while its refund is not terminal).
    pub retention: Duration,
    /// The trace the request belongs to, for the worker to continue.
    pub trace: Option<TraceContext>,
}

/// A key that already exists.
#[derive(Debug, Clone)]
pub struct ExistingRefundKey {
    /// The fingerprint of the request that created it.
    pub fingerprint: Fingerprint,
    /// The refund it created.
    pub refund_id: RefundId,
    /// When it may be reaped.
    pub expires_at: OffsetDateTime,
    /// The terminal response, once the refund is terminal: status and body as stored.
    pub stored_response: Option<(u16, Box<RawValue>)>,
}

/// Why a refund was refused, with nothing written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The tenant has no such payment.
    NoSuchPayment,
    /// Only a `succeeded` payment can be refunded; this one is not (yet, or ever).
    NotRefundable {
        /// Where the payment stands.
        status: PaymentStatus,
    },
    /// The payment's refunds that are not `failed` already add up to its charge.
    NothingLeft,
    /// The request asks for more than is left to refund.
    TooMuch {
        /// What was asked, in minor units.
        asked: i64,
        /// What is left, in minor units.
        left: i64,
        /// The payment's currency.
        currency: Currency,
    },
}

/// What intake found or did.
#[derive(Debug, Clone)]
pub enum RefundIntake {
    /// The key was new: the refund is accepted.
    Created {
        /// The new refund, `pending`.
        refund: Box<Refund>,
        /// When its key may be reaped.
        key_expires_at: OffsetDateTime,
    },
    /// The key exists: nothing was written.
    Existing(ExistingRefundKey),
    /// The refund cannot be made: nothing was written.
    Refused(Refusal),
}

/// Accepts a refund and wakes the workers when it commits, or returns the key as it exists, or
/// refuses with nothing written.
#[tracing::instrument(name = "store.refund_intake", skip_all, fields(tenant.id = %new.tenant_id, payment.id = %new.payment_id))]
pub async fn accept(conn: &mut PgConnection, new: &NewRefund<'_>) -> Result<RefundIntake, StoreError> {
    let mut tx = conn.begin().await?;
    let written = write(&mut tx, new).await;
    // Anything but a commit ends in an explicit rollback, a failed statement too. A dropped
    // transaction would only queue its ROLLBACK, and the payment would stay locked until the
    // connection's next statement.
    match written {
        Ok(Some(created @ RefundIntake::Created { .. })) => {
            tx.commit().await?;
            Ok(created)
        }
        Ok(Some(unwritten)) => {
            tx.rollback().await?;
            Ok(unwritten)
        }
        Ok(None) => {
            // Another request took the key and committed while this one was being written.
            tx.rollback().await?;
            let existing = stored(conn, new.tenant_id, new.key).await?;
            existing.map(RefundIntake::Existing).ok_or_else(vanished)
        }
        Err(error) => {
            // The statement's error is the one to report. If the rollback fails too, the
            // transaction ends when the connection is next used or closed.
            let _ = tx.rollback().await;
            Err(error)
        }
    }
}

/// Intake's statements, in the caller's transaction: the refund, written (to be committed), or the
/// key as it exists, or a refusal (to be rolled back); `None` if a concurrent request took the key.
async fn write(tx: &mut PgConnection, new: &NewRefund<'_>) -> Result<Option<RefundIntake>, StoreError> {
    if let Some(existing) = stored(tx, new.tenant_id, new.key).await? {
        return Ok(Some(RefundIntake::Existing(existing)));
    }
    let Reserved { amount, currency } = match reserve(tx, new).await? {
        Ok(reserved) => reserved,
        Err(refusal) => {
            // A request with the same key may have committed while this one waited for the
            // payment's lock: then it is that request's refund, not a refusal.
            let existing = stored(tx, new.tenant_id, new.key).await?;
            return Ok(Some(existing.map_or(RefundIntake::Refused(refusal), RefundIntake::Existing)));
        }
    };
    let refund = insert_refund(tx, new, amount, &currency).await?;
    let Some(key_expires_at) = insert_key(tx, new).await? else {
        return Ok(None);
    };
    queue(tx, new, amount).await?;
    Ok(Some(RefundIntake::Created { refund: Box::new(refund), key_expires_at }))
}

/// Writes the refund, `pending`, for the `amount` reserved, in the payment's `currency`, with the
/// request's trace to continue for the rest of its life (`migrations/0420_refund_trace.sql`).
async fn insert_refund(
    tx: &mut PgConnection,
    new: &NewRefund<'_>,
    amount: i64,
    currency: &Currency,
) -> Result<Refund, StoreError> {
    let refund = sqlx::query_as!(
        Refund,
        r#"
        INSERT INTO refunds (tenant_id, refund_id, payment_id, amount, currency, reason, metadata, requested_by,
                             traceparent, tracestate)
        VALUES ($1, $2, $3, $4, $8, $5, $6, $7, $9, $10)
        RETURNING tenant_id AS "tenant_id: TenantId", refund_id AS "refund_id: RefundId",
                  payment_id AS "payment_id: PaymentId", status AS "status: RefundStatus",
                  amount AS "amount: Amount", currency AS "currency: Currency", reason,
                  metadata AS "metadata: Json<BTreeMap<String, String>>", provider_refund_id, failure_code, failure_message,
                  send_attempts, first_sent_at, may_have_moved, requested_by, created_at, updated_at, event_count
        "#,
        new.tenant_id.as_uuid(),
        new.refund_id.as_uuid(),
        new.payment_id.as_uuid(),
        amount,
        new.request.reason.map(|reason| reason.as_str()),
        Json(&new.request.metadata) as _,
        new.requested_by,
        currency.as_str(),
        new.trace.as_ref().map(|t| t.traceparent.as_str()),
        new.trace.as_ref().and_then(|t| t.tracestate.as_deref()),
    )
    .fetch_one(&mut *tx)
    .await?;
    Ok(refund)
}

/// Writes the refund's key; returns when it expires, or `None` if a concurrent request took the key.
async fn insert_key(tx: &mut PgConnection, new: &NewRefund<'_>) -> Result<Option<OffsetDateTime>, StoreError> {
    let key_expires_at = sqlx::query_scalar!(
        r#"
        INSERT INTO refund_keys (tenant_id, idempotency_key, fingerprint, refund_id, expires_at)
        VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))
        ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
        RETURNING expires_at
        "#,
        new.tenant_id.as_uuid(),
        new.key.as_str(),
        new.fingerprint.as_bytes().as_slice(),
        new.refund_id.as_uuid(),
        new.retention.as_secs_f64(),
    )
    .fetch_optional(&mut *tx)
    .await?;
    Ok(key_expires_at)
}

/// Writes the refund's first audit row and its outbox row, and wakes the workers when the
/// transaction commits.
async fn queue(tx: &mut PgConnection, new: &NewRefund<'_>, amount: i64) -> Result<(), StoreError> {
    sqlx::query!(
        r#"
        INSERT INTO refund_events (tenant_id, refund_id, seq, from_status, to_status, actor, reason, detail)
        VALUES ($1, $2, 1, NULL, 'pending', $3, 'accepted', jsonb_build_object('amount', $4::bigint))
        "#,
        new.tenant_id.as_uuid(),
        new.refund_id.as_uuid(),
        new.requested_by,
        amount,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"
        INSERT INTO refund_outbox (tenant_id, refund_id, traceparent, tracestate) VALUES ($1, $2, $3, $4)
        "#,
        new.tenant_id.as_uuid(),
        new.refund_id.as_uuid(),
        new.trace.as_ref().map(|t| t.traceparent.as_str()),
        new.trace.as_ref().and_then(|t| t.tracestate.as_deref()),
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!("SELECT pg_notify($1, $2)", REFUND_OUTBOX_CHANNEL, new.tenant_id.to_string())
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// What [`reserve`] set aside on the payment: the refund's amount, in the payment's currency.
struct Reserved {
    amount: i64,
    currency: Currency,
}

/// Locks the payment's row and raises what it has promised back by the refund's amount; returns
/// that amount and the payment's currency (the refund's, written from here rather than read again
/// by the refund's INSERT: Citus cannot plan that INSERT … SELECT with its RETURNING), or why the
/// refund cannot be made.
async fn reserve(conn: &mut PgConnection, new: &NewRefund<'_>) -> Result<Result<Reserved, Refusal>, StoreError> {
    // FOR UPDATE waits for a concurrent refund of the payment to commit, then reads the row as that
    // refund left it.
    let payment = sqlx::query!(
        r#"
        SELECT status AS "status: PaymentStatus", amount, refunds_reserved, currency AS "currency: Currency"
        FROM payments
        WHERE tenant_id = $1 AND payment_id = $2
        FOR UPDATE
        "#,
        new.tenant_id.as_uuid(),
        new.payment_id.as_uuid(),
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(payment) = payment else {
        return Ok(Err(Refusal::NoSuchPayment));
    };
    if payment.status != PaymentStatus::Succeeded {
        return Ok(Err(Refusal::NotRefundable { status: payment.status }));
    }
    let left = payment.amount - payment.refunds_reserved;
    let asked = new.request.amount.map_or(left, |amount| amount.minor_units());
    if left == 0 {
        return Ok(Err(Refusal::NothingLeft));
    }
    if asked > left {
        return Ok(Err(Refusal::TooMuch { asked, left, currency: payment.currency }));
    }
    sqlx::query!(
        "UPDATE payments SET refunds_reserved = refunds_reserved + $3 WHERE tenant_id = $1 AND payment_id = $2",
        new.tenant_id.as_uuid(),
        new.payment_id.as_uuid(),
        asked,
    )
    .execute(&mut *conn)
    .await?;
    Ok(Ok(Reserved { amount: asked, currency: payment.currency }))
}

/// The key as stored, if it is: what [`accept`] would return for a request with it, read without
/// writing. `None` means "not stored yet", never "free to take".
#[tracing::instrument(name = "store.stored_refund_key", skip_all, fields(tenant.id = %tenant_id))]
pub async fn stored(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    key: &IdempotencyKey,
) -> Result<Option<ExistingRefundKey>, StoreError> {
    let row = sqlx::query!(
        r#"
        SELECT fingerprint, refund_id AS "refund_id: RefundId", expires_at, response_status,
               response_body AS "response_body: Json<Box<RawValue>>"
        FROM refund_keys
        WHERE tenant_id = $1 AND idempotency_key = $2
        "#,
        tenant_id.as_uuid(),
        key.as_str(),
    )
    .fetch_optional(conn)
    .await?;
    row.map(|row| {
        let fingerprint = Fingerprint::from_slice(&row.fingerprint).ok_or_else(|| {
            StoreError::Unexpected(sqlx::Error::Decode("a stored fingerprint is not 32 bytes".into()).into())
        })?;
        let stored_response = match (row.response_status, row.response_body) {
            (Some(status), Some(body)) => Some((status.unsigned_abs(), body.0)),
            _ => None,
        };
        Ok(ExistingRefundKey { fingerprint, refund_id: row.refund_id, expires_at: row.expires_at, stored_response })
    })
    .transpose()
}

/// A key that conflicted with this request's insert but cannot be read: reported as unexpected,
/// never as a refusal.
fn vanished() -> StoreError {
    StoreError::Unexpected(sqlx::Error::RowNotFound.into())
}
