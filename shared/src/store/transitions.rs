//! Status changes, persisted.
//!
//! Each change is decided by [`crate::status::next`] and written as a compare-and-set
//! (`UPDATE payments … WHERE status = <from>`) together with an audit row and a `NOTIFY` that wakes
//! long polls. A terminal change ([`settle`]) also, in the same transaction, writes the ledger entry
//! for a success and stores the terminal response on the payment's idempotency key, so a replay is a
//! single read. The worker, which records a change per payment, uses the `_deferring_wakeup` forms
//! and announces the payment after its commit instead (`crate::notify` says why). Zero rows updated means another actor moved the payment first: that is
//! [`Applied::LostRace`], a normal outcome. Callers own the transaction and any guard of their own
//! (the worker's fencing token) and must not hold it across a provider call.
//! The terminal change's statements live in `sql/settle.sql` and `sql/store_response.sql`, so the
//! benchmark runs the very same SQL under pgbench.

use serde_json::Value;
use sqlx::PgConnection;
use time::OffsetDateTime;

use crate::ids::{PaymentId, TenantId};
use crate::payment::{Payment, PaymentResource};
use crate::status::{self, IllegalTransition, PaymentStatus, Transition};
use crate::store::{StoreError, payments};

/// One status change to persist.
#[derive(Debug, Clone)]
pub struct Change<'a> {
    /// The payment's owner.
    pub tenant_id: TenantId,
    /// The payment.
    pub payment_id: PaymentId,
    /// The status the caller saw; the change only happens if it is still current.
    pub from: PaymentStatus,
    /// What happened.
    pub transition: Transition,
    /// Who did it: `worker:<id>`, `sweeper`, `reconciler:<id>`, `webhook`, `operator:<name>`.
    pub actor: &'a str,
    /// Why, in words.
    pub reason: &'a str,
    /// Supporting evidence for the audit trail.
    pub detail: Option<Value>,
}

/// How a payment became terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// The provider charged.
    Succeeded {
        /// The provider's charge id.
        charge_id: String,
        /// What the provider says it charged (the ledger records this, not our request).
        amount: i64,
        /// In which currency.
        currency: String,
        /// When the provider created the charge.
        charged_at: OffsetDateTime,
    },
    /// No money moved.
    Failed {
        /// Stable failure code.
        code: String,
        /// Human-readable reason.
        message: String,
        /// The provider's failed charge, if it made one.
        charge_id: Option<String>,
    },
}

/// What persisting a change did.
#[derive(Debug, Clone)]
pub enum Applied<T> {
    /// The payment moved; here is the result.
    Moved(T),
    /// The payment was no longer in `from`: someone else moved it first. Nothing was written.
    LostRace,
}

/// A change that cannot be persisted.
#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    /// The state machine forbids it: a bug in the caller.
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
    /// A terminal change without a settlement, or a settlement that does not fit the change.
    #[error("{transition:?} from {} leads to {}, which needs a matching settlement", from.as_str(), to.as_str())]
    SettlementMismatch {
        /// What was attempted.
        transition: Transition,
        /// From where.
        from: PaymentStatus,
        /// To where.
        to: PaymentStatus,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Persists a non-terminal change and wakes long polls when it commits. Returns the new status.
#[tracing::instrument(name = "store.transition", skip_all, fields(payment.id = %change.payment_id, transition = ?change.transition))]
pub async fn apply(conn: &mut PgConnection, change: &Change<'_>) -> Result<Applied<PaymentStatus>, TransitionError> {
    write_change(conn, change, true).await
}

/// [`apply`] without the wake-up: the caller announces the payment on
/// [`crate::notify::PAYMENT_CHANNEL`] after the transaction has committed.
#[tracing::instrument(name = "store.transition", skip_all, fields(payment.id = %change.payment_id, transition = ?change.transition))]
pub async fn apply_deferring_wakeup(
    conn: &mut PgConnection,
    change: &Change<'_>,
) -> Result<Applied<PaymentStatus>, TransitionError> {
    write_change(conn, change, false).await
}

async fn write_change(
    conn: &mut PgConnection,
    change: &Change<'_>,
    wake: bool,
) -> Result<Applied<PaymentStatus>, TransitionError> {
    let to = status::next(change.from, change.transition)?;
    if to.is_terminal() {
        return Err(TransitionError::SettlementMismatch { transition: change.transition, from: change.from, to });
    }
    let moved = sqlx::query_scalar!(
        r#"
        WITH moved AS (
            UPDATE payments SET status = $3, updated_at = now()
            WHERE tenant_id = $1 AND payment_id = $2 AND status = $4
            RETURNING tenant_id, payment_id
        ), audit AS (
            INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason, detail)
            SELECT tenant_id, payment_id, $4, $3, $5, $6, $7 FROM moved
        )
        SELECT CASE WHEN $8 THEN pg_notify('oncepay_payment', payment_id::text) END AS "notified: ()" FROM moved
        "#,
        change.tenant_id.as_uuid(),
        change.payment_id.as_uuid(),
        to as PaymentStatus,
        change.from as PaymentStatus,
        change.actor,
        change.reason,
        change.detail,
        wake,
    )
    .fetch_optional(conn)
    .await
    .map_err(StoreError::from)?;
    Ok(if moved.is_some() { Applied::Moved(to) } else { Applied::LostRace })
}

/// Persists a terminal change: status, audit row, ledger entry (success), stored response on the
/// idempotency key, wake-up. Returns the payment as it now is.
#[tracing::instrument(name = "store.settle", skip_all, fields(payment.id = %change.payment_id, transition = ?change.transition))]
pub async fn settle(
    conn: &mut PgConnection,
    change: &Change<'_>,
    settlement: &Settlement,
) -> Result<Applied<Payment>, TransitionError> {
    write_settlement(conn, change, settlement, true).await
}

/// [`settle`] without the wake-up: the caller announces the payment on
/// [`crate::notify::PAYMENT_CHANNEL`] after the transaction has committed.
#[tracing::instrument(name = "store.settle", skip_all, fields(payment.id = %change.payment_id, transition = ?change.transition))]
pub async fn settle_deferring_wakeup(
    conn: &mut PgConnection,
    change: &Change<'_>,
    settlement: &Settlement,
) -> Result<Applied<Payment>, TransitionError> {
    write_settlement(conn, change, settlement, false).await
}

async fn write_settlement(
    conn: &mut PgConnection,
    change: &Change<'_>,
    settlement: &Settlement,
    wake: bool,
) -> Result<Applied<Payment>, TransitionError> {
    let to = status::next(change.from, change.transition)?;
    let fits = matches!(
        (to, settlement),
        (PaymentStatus::Succeeded, Settlement::Succeeded { .. }) | (PaymentStatus::Failed, Settlement::Failed { .. })
    );
    if !fits {
        return Err(TransitionError::SettlementMismatch { transition: change.transition, from: change.from, to });
    }
    let (charge_id, failure_code, failure_message) = match settlement {
        Settlement::Succeeded { charge_id, .. } => (Some(charge_id.as_str()), None, None),
        Settlement::Failed { code, message, charge_id } => {
            (charge_id.as_deref(), Some(code.as_str()), Some(message.as_str()))
        }
    };
    let (ledger_amount, ledger_currency, charged_at) = match settlement {
        Settlement::Succeeded { amount, currency, charged_at, .. } => {
            (Some(*amount), Some(currency.as_str()), Some(*charged_at))
        }
        Settlement::Failed { .. } => (None, None, None),
    };

    let moved = sqlx::query_file_scalar!(
        "sql/settle.sql",
        change.tenant_id.as_uuid(),
        change.payment_id.as_uuid(),
        to as PaymentStatus,
        change.from as PaymentStatus,
        charge_id,
        failure_code,
        failure_message,
        change.actor,
        change.reason,
        change.detail,
        ledger_amount,
        ledger_currency,
        charged_at,
        wake,
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    if moved.is_none() {
        return Ok(Applied::LostRace);
    }

    let payment = payments::fetch(&mut *conn, change.tenant_id, change.payment_id)
        .await?
        .ok_or(StoreError::Unexpected(sqlx::Error::RowNotFound))?;
    let body = serde_json::to_value(PaymentResource::from(&payment))
        .map_err(|e| StoreError::Unexpected(sqlx::Error::Encode(Box::new(e))))?;
    sqlx::query_file!("sql/store_response.sql", change.tenant_id.as_uuid(), change.payment_id.as_uuid(), body,)
        .execute(&mut *conn)
        .await
        .map_err(StoreError::from)?;
    Ok(Applied::Moved(payment))
}
