//! Status changes, persisted.
//!
//! Each change is decided by [`oncepay_domain::status::next`] and written as a compare-and-set
//! (`UPDATE payments … WHERE status = <from>`) together with an audit row and, for a change a
//! merchant hears of, its event ([`crate::merchant_events`]). Zero rows updated means
//! another actor moved the payment first: that is [`Recorded::LostRace`], a normal outcome. Callers own
//! the transaction and any guard of their own (the worker's fencing token), and must not hold it
//! across a provider call.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;
use sqlx::PgConnection;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::merchant_event::EventType;
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::payment::PaymentResource;
use oncepay_domain::provider_ref::{PaymentMethod, ProviderAccount, ProviderCustomer};
use oncepay_domain::refund_status::{IllegalRefundTransition, RefundStatus, RefundTransition};
use oncepay_domain::status::{self, IllegalTransition, PaymentStatus, Transition};

use crate::merchant_deliveries::{ClaimedDelivery, WriterLease};
use crate::payments::{self, Payment};
use crate::{StoreError, merchant_events};

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
        amount: Amount,
        /// In which currency.
        currency: Currency,
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
pub enum Recorded<T> {
    /// The payment or refund moved; here is the result.
    Moved(T),
    /// It was no longer in `from`: someone else moved it first. Nothing was written.
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
    /// The refund state machine forbids it: a bug in the caller.
    #[error(transparent)]
    IllegalRefund(#[from] IllegalRefundTransition),
    /// A terminal refund change without a settlement, or a settlement that does not fit the change.
    #[error("{transition:?} from {} leads to {}, which needs a matching settlement", from.as_str(), to.as_str())]
    RefundSettlementMismatch {
        /// What was attempted.
        transition: RefundTransition,
        /// From where.
        from: RefundStatus,
        /// To where.
        to: RefundStatus,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Persists a non-terminal change and wakes long polls when it commits. Returns the new status.
#[tracing::instrument(name = "store.transition", skip_all, fields(payment.id = %change.payment_id, transition = ?change.transition))]
pub async fn apply(conn: &mut PgConnection, change: &Change<'_>) -> Result<Recorded<PaymentStatus>, TransitionError> {
    write_change(conn, change, true).await
}

/// [`apply`] without the wake-up: the caller announces the payment on
/// [`crate::notify::PAYMENT_CHANNEL`] after the transaction has committed, as the worker does
/// ([`crate::notify::Notifier`] says why).
#[tracing::instrument(name = "store.transition", skip_all, fields(payment.id = %change.payment_id, transition = ?change.transition))]
pub async fn apply_deferring_wakeup(
    conn: &mut PgConnection,
    change: &Change<'_>,
) -> Result<Recorded<PaymentStatus>, TransitionError> {
    write_change(conn, change, false).await
}

async fn write_change(
    conn: &mut PgConnection,
    change: &Change<'_>,
    wake: bool,
) -> Result<Recorded<PaymentStatus>, TransitionError> {
    let to = status::next(change.from, change.transition)?;
    if to.is_terminal() {
        return Err(TransitionError::SettlementMismatch { transition: change.transition, from: change.from, to });
    }
    // Three plain statements, each of which Citus plans on the payment's shard or, for the wake-up,
    // on the coordinator where the listeners are (a statement with an INSERT CTE would cross nodes).
    let place = sqlx::query_scalar!(
        r#"
        UPDATE payments
        SET status = $3, updated_at = now(), event_count = event_count + 1,
            -- Once a send may have reached the provider, the payment remembers it for good.
            may_be_charged = may_be_charged OR $5
        WHERE tenant_id = $1 AND payment_id = $2 AND status = $4
        RETURNING event_count
        "#,
        change.tenant_id.as_uuid(),
        change.payment_id.as_uuid(),
        to as PaymentStatus,
        change.from as PaymentStatus,
        change.transition.send_may_have_reached_provider(),
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    let Some(place) = place else {
        return Ok(Recorded::LostRace);
    };
    sqlx::query!(
        r#"
        INSERT INTO payment_events (tenant_id, payment_id, seq, from_status, to_status, actor, reason, detail)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
        "#,
        change.tenant_id.as_uuid(),
        change.payment_id.as_uuid(),
        place,
        change.from as PaymentStatus,
        to as PaymentStatus,
        change.actor,
        change.reason,
        change.detail,
    )
    .execute(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    if EventType::of_payment_change(change.from, to).is_some() {
        let payment = payments::fetch(conn, change.tenant_id, change.payment_id)
            .await?
            .ok_or_else(|| StoreError::Unexpected(sqlx::Error::RowNotFound.into()))?;
        merchant_events::of_payments(conn, change.tenant_id, &[(&payment, change.from)], None).await?;
    }
    if wake {
        wake_long_polls(conn, &[change.payment_id.as_uuid()]).await?;
    }
    Ok(Recorded::Moved(to))
}

/// Wakes the long polls waiting on `payment_ids` when the transaction commits. A statement of its
/// own, on no table: under Citus it runs on the coordinator, where the api listens.
async fn wake_long_polls(conn: &mut PgConnection, payment_ids: &[Uuid]) -> Result<(), StoreError> {
    sqlx::query!("SELECT pg_notify('oncepay_payment', id::text) FROM unnest($1::uuid[]) AS id", payment_ids)
        .execute(conn)
        .await?;
    Ok(())
}

/// Persists a terminal change: status, audit row, ledger entry (success), stored response on the
/// idempotency key, wake-up, all in the caller's transaction. Returns the payment as it now is.
///
/// The stored response makes a replay of the key a single read.
#[tracing::instrument(name = "store.settle", skip_all, fields(payment.id = %change.payment_id, transition = ?change.transition))]
pub async fn settle(
    conn: &mut PgConnection,
    change: &Change<'_>,
    settlement: &Settlement,
) -> Result<Recorded<Payment>, TransitionError> {
    let (recorded, _) = write_settlements(conn, &[(change.clone(), settlement)], None).await?;
    let payment_ids: Vec<Uuid> = recorded.iter().filter_map(moved_id).collect();
    if !payment_ids.is_empty() {
        wake_long_polls(conn, &payment_ids).await?;
    }
    Ok(single(recorded))
}

/// [`settle`] without the wake-up: the caller announces the payment on
/// [`crate::notify::PAYMENT_CHANNEL`] after the transaction has committed ([`crate::notify::Notifier`]
/// says why).
#[tracing::instrument(name = "store.settle", skip_all, fields(payment.id = %change.payment_id, transition = ?change.transition))]
pub async fn settle_deferring_wakeup(
    conn: &mut PgConnection,
    change: &Change<'_>,
    settlement: &Settlement,
) -> Result<Recorded<Payment>, TransitionError> {
    Ok(single(write_settlements(conn, &[(change.clone(), settlement)], None).await?.0))
}

/// What [`settle_all_deferring_wakeup`] wrote.
#[derive(Debug)]
pub struct Settled {
    /// What happened to each change, in order.
    pub recorded: Vec<Recorded<Payment>>,
    /// The deliveries of their events queued leased to the caller ([`WriterLease`]), to send once
    /// the transaction has committed.
    pub leased: Vec<ClaimedDelivery>,
}

/// Persists many terminal changes at once, as [`settle_deferring_wakeup`] persists one: for each
/// tenant, one statement for every compare-and-set, audit row and ledger entry, and one for every
/// stored response. A change whose payment had moved on is [`Recorded::LostRace`] and writes
/// nothing, whatever happens to the others. With a `lease`, the events' deliveries that may be sent
/// at once are queued leased to the caller ([`merchant_events::of_payments`]). The caller
/// announces the moved payments after the transaction has committed.
///
/// For the worker, which settles whatever sends finished together in one transaction.
#[tracing::instrument(name = "store.settle_all", skip_all, fields(settlements = settlements.len()))]
pub async fn settle_all_deferring_wakeup(
    conn: &mut PgConnection,
    settlements: &[(Change<'_>, &Settlement)],
    lease: Option<&WriterLease<'_>>,
) -> Result<Settled, TransitionError> {
    let (recorded, leased) = write_settlements(conn, settlements, lease).await?;
    Ok(Settled { recorded, leased })
}

fn moved_id(recorded: &Recorded<Payment>) -> Option<Uuid> {
    match recorded {
        Recorded::Moved(payment) => Some(payment.payment_id.as_uuid()),
        Recorded::LostRace => None,
    }
}

fn single(recorded: Vec<Recorded<Payment>>) -> Recorded<Payment> {
    recorded.into_iter().next().unwrap_or(Recorded::LostRace)
}

/// One terminal change's columns, checked against its settlement.
struct Row<'a> {
    to: PaymentStatus,
    charge_id: Option<&'a str>,
    failure_code: Option<&'a str>,
    failure_message: Option<&'a str>,
    ledger_amount: Option<i64>,
    ledger_currency: Option<&'a str>,
    charged_at: Option<OffsetDateTime>,
}

impl<'a> Row<'a> {
    fn of(change: &Change<'_>, settlement: &'a Settlement) -> Result<Self, TransitionError> {
        let to = status::next(change.from, change.transition)?;
        let mismatch = || TransitionError::SettlementMismatch { transition: change.transition, from: change.from, to };
        Ok(match (to, settlement) {
            (PaymentStatus::Succeeded, Settlement::Succeeded { charge_id, amount, currency, charged_at }) => Self {
                to,
                charge_id: Some(charge_id),
                failure_code: None,
                failure_message: None,
                ledger_amount: Some(amount.minor_units()),
                ledger_currency: Some(currency.as_str()),
                charged_at: Some(*charged_at),
            },
            (PaymentStatus::Failed, Settlement::Failed { code, message, charge_id }) => Self {
                to,
                charge_id: charge_id.as_deref(),
                failure_code: Some(code),
                failure_message: Some(message),
                ledger_amount: None,
                ledger_currency: None,
                charged_at: None,
            },
            _ => return Err(mismatch()),
        })
    }
}

async fn write_settlements(
    conn: &mut PgConnection,
    settlements: &[(Change<'_>, &Settlement)],
    lease: Option<&WriterLease<'_>>,
) -> Result<(Vec<Recorded<Payment>>, Vec<ClaimedDelivery>), TransitionError> {
    let rows =
        settlements.iter().map(|(change, settlement)| Row::of(change, settlement)).collect::<Result<Vec<_>, _>>()?;
    // One tenant per statement, so that each names its shard under Citus (SCALING.md); usually a
    // batch is one tenant's.
    let mut moved: HashMap<PaymentId, Payment> = HashMap::with_capacity(settlements.len());
    let mut leased = Vec::new();
    let mut tenants: Vec<TenantId> = settlements.iter().map(|(change, _)| change.tenant_id).collect();
    tenants.sort_unstable();
    tenants.dedup();
    for tenant_id in tenants {
        let ours: Vec<(&Change<'_>, &Row<'_>)> = settlements
            .iter()
            .zip(&rows)
            .filter(|((change, _), _)| change.tenant_id == tenant_id)
            .map(|((change, _), row)| (change, row))
            .collect();
        // What the tenants before this one leased counts against the limit.
        let taken = u32::try_from(leased.len()).unwrap_or(u32::MAX);
        let left = lease.map(|lease| WriterLease { limit: lease.limit.saturating_sub(taken), ..*lease });
        let (payments, theirs) = write_tenant_settlements(conn, tenant_id, &ours, left.as_ref()).await?;
        for payment in payments {
            moved.insert(payment.payment_id, payment);
        }
        leased.extend(theirs);
    }
    let recorded = settlements
        .iter()
        .map(|(change, _)| moved.remove(&change.payment_id).map_or(Recorded::LostRace, Recorded::Moved))
        .collect();
    Ok((recorded, leased))
}

/// `sql/settle.sql` and `sql/store_response.sql` for one tenant's changes, and their events; returns
/// the payments that moved and the events' deliveries leased under `lease`. Both statements take
/// arrays, so any number of payments costs the same two round trips. They are files so the
/// benchmark runs the same SQL under pgbench.
async fn write_tenant_settlements(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    changes: &[(&Change<'_>, &Row<'_>)],
    lease: Option<&WriterLease<'_>>,
) -> Result<(Vec<Payment>, Vec<ClaimedDelivery>), TransitionError> {
    let payment_ids: Vec<Uuid> = changes.iter().map(|(c, _)| c.payment_id.as_uuid()).collect();
    let moved = sqlx::query_file_as!(
        Payment,
        "sql/settle.sql",
        tenant_id.as_uuid(),
        &payment_ids,
        &changes.iter().map(|(_, r)| r.to.as_str()).collect::<Vec<_>>() as &[&str],
        &changes.iter().map(|(c, _)| c.from.as_str()).collect::<Vec<_>>() as &[&str],
        &changes.iter().map(|(_, r)| r.charge_id).collect::<Vec<_>>() as &[Option<&str>],
        &changes.iter().map(|(_, r)| r.failure_code).collect::<Vec<_>>() as &[Option<&str>],
        &changes.iter().map(|(_, r)| r.failure_message).collect::<Vec<_>>() as &[Option<&str>],
        &changes.iter().map(|(c, _)| c.actor).collect::<Vec<_>>() as &[&str],
        &changes.iter().map(|(c, _)| c.reason).collect::<Vec<_>>() as &[&str],
        &changes.iter().map(|(c, _)| c.detail.clone()).collect::<Vec<_>>() as &[Option<Value>],
        &changes.iter().map(|(_, r)| r.ledger_amount).collect::<Vec<_>>() as &[Option<i64>],
        &changes.iter().map(|(_, r)| r.ledger_currency).collect::<Vec<_>>() as &[Option<&str>],
        &changes.iter().map(|(_, r)| r.charged_at).collect::<Vec<_>>() as &[Option<OffsetDateTime>],
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(StoreError::from)?;

    let mut leased = Vec::new();
    if !moved.is_empty() {
        let bodies = moved
            .iter()
            .map(|payment| serde_json::to_value(PaymentResource::from(payment)))
            .collect::<Result<Vec<Value>, _>>()
            .map_err(|e| StoreError::Unexpected(sqlx::Error::Encode(Box::new(e)).into()))?;
        let moved_ids: Vec<Uuid> = moved.iter().map(|p| p.payment_id.as_uuid()).collect();
        sqlx::query_file!("sql/store_response.sql", tenant_id.as_uuid(), &moved_ids, &bodies)
            .execute(&mut *conn)
            .await
            .map_err(StoreError::from)?;
        let previous: HashMap<PaymentId, PaymentStatus> =
            changes.iter().map(|(change, _)| (change.payment_id, change.from)).collect();
        let events: Vec<(&Payment, PaymentStatus)> =
            moved.iter().filter_map(|p| previous.get(&p.payment_id).map(|from| (p, *from))).collect();
        leased = merchant_events::of_payments(conn, tenant_id, &events, lease).await?;
    }
    Ok((moved, leased))
}
