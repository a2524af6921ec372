//! Recording the drainer's verdicts, each payment guarded twice: by its fencing token on the outbox
//! row, and by the status compare-and-set of the shared transitions.
//!
//! A recording commits whole or not at all. No token on the row means the sweeper took the lease
//! over, and nothing at all is recorded for that payment. Locks are taken outbox row first, payment
//! second, like the claim and the sweeper. This module never calls the provider and announces
//! nothing: the drainer announces moved payments after the commit.

use std::collections::HashMap;
use std::sync::Arc;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_service::telemetry;
use oncepay_store::merchant_deliveries::{ClaimedDelivery, WriterLease};
use oncepay_store::transitions::{self, Change, Settlement, TransitionError};
use oncepay_store::{StoreError, payments, unknown_queue};
use serde_json::json;
use sqlx::{Postgres, Transaction};
use time::OffsetDateTime;

use crate::verdict::SendVerdict;
use oncepay_store::sending::{self, Claimed};

/// What recording did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The payment moved to this status.
    Moved(PaymentStatus),
    /// The lease had been taken over (the fencing token was gone): nothing was written.
    LeaseLost,
    /// Someone else (a webhook or a poll) had already moved the payment to this status while the
    /// lease was held; only the obsolete outbox row was removed.
    Superseded(PaymentStatus),
}

/// Recording failed; the transaction was rolled back.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The database failed, or a transition was refused.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// The payment is in a status no other actor can give it while this worker holds the lease.
    #[error("the payment is `{}` although this worker holds its lease", .0.as_str())]
    Inconsistent(PaymentStatus),
    /// The task recording this payment together with others stopped before it finished (the
    /// shutdown's grace period ran out): whether it committed is unknown. The lease expires and the
    /// sweeper takes the payment over.
    #[error("the recording of this payment's batch was abandoned midway")]
    Abandoned,
    /// The payment was recorded together with others, and that recording failed.
    #[error("recording it together with other sends failed")]
    Together(#[source] Arc<RecordError>),
}

impl From<StoreError> for RecordError {
    fn from(error: StoreError) -> Self {
        Self::Transition(TransitionError::Store(error))
    }
}

impl From<sqlx::Error> for RecordError {
    fn from(error: sqlx::Error) -> Self {
        StoreError::from(error).into()
    }
}

impl RecordError {
    /// Whether a retry may succeed (the database was unreachable, a deadlock, a timeout).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transition(TransitionError::Store(error)) => error.is_unavailable(),
            Self::Together(error) => error.is_transient(),
            Self::Transition(_) | Self::Inconsistent(_) | Self::Abandoned => false,
        }
    }
}

/// Records `verdict` for `claimed` in `tx`, and commits it unless the lease was lost.
///
/// First ends the send on the outbox row (deletes it, or for a retry releases it with a backoff) if
/// the token is still on it; then moves the payment (`transitions::apply_deferring_wakeup`), and for
/// `unknown` queues it for the reconciler. A terminal verdict goes through [`record_settlements`],
/// with `lease`; the deliveries it leased are returned beside what happened.
pub async fn record(
    mut tx: Transaction<'_, Postgres>,
    actor: &str,
    claimed: &Claimed,
    verdict: &SendVerdict,
    lease: Option<&WriterLease<'_>>,
) -> Result<(Recorded, Vec<ClaimedDelivery>), RecordError> {
    let (held, transition, reason) = match verdict {
        SendVerdict::Settle { transition, settlement, reason } => {
            let send = SettledSend { claimed, transition: *transition, settlement, reason };
            let (recorded, leased) = record_settlements(tx, actor, &[send], lease).await?;
            return Ok((recorded.into_iter().next().unwrap_or(Recorded::LeaseLost), leased));
        }
        SendVerdict::Retry { delay, reason } => {
            (sending::release(&mut tx, claimed, *delay).await?, Transition::NotSentRetry, reason)
        }
        SendVerdict::Uncertain { reason, .. } => {
            (sending::take(&mut tx, claimed).await?, Transition::Uncertain, reason)
        }
    };
    if !held {
        tx.rollback().await?;
        return Ok((Recorded::LeaseLost, Vec::new()));
    }

    let (code, refusal) = match verdict {
        SendVerdict::Uncertain { code, refusal, .. } => (Some(*code), refusal.as_ref()),
        SendVerdict::Settle { .. } | SendVerdict::Retry { .. } => (None, None),
    };
    let change = change(claimed, actor, transition, reason, code);
    let status = match transitions::apply_deferring_wakeup(&mut tx, &change).await? {
        transitions::Recorded::Moved(status) => status,
        transitions::Recorded::LostRace => return Ok((superseded(tx, claimed).await?, Vec::new())),
    };
    if let Some(code) = code {
        let evidence = json!({
            "source": actor,
            "reason": code,
            "detail": reason,
            "attempt": claimed.attempt,
            "send_attempts": claimed.send_attempts,
            "fencing_token": claimed.fencing_token,
            "observed_at": OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).ok(),
        });
        // The outbox row, which carried the payment's trace, is gone: the reconciler's resolution
        // continues the trace from this recording span instead.
        let trace = telemetry::trace_context_of(&tracing::Span::current());
        let (tenant_id, payment_id) = (claimed.tenant_id, claimed.payment_id);
        unknown_queue::enqueue(&mut tx, tenant_id, payment_id, code, evidence, trace.as_ref(), refusal).await?;
    }
    tx.commit().await?;
    Ok((Recorded::Moved(status), Vec::new()))
}

/// A terminal verdict for one claimed payment: what [`record_settlements`] writes.
#[derive(Debug, Clone, Copy)]
pub struct SettledSend<'a> {
    /// The send it ends.
    pub claimed: &'a Claimed,
    /// `Charged`, `Declined` or `NotSentExhausted`.
    pub transition: Transition,
    /// What it stores.
    pub settlement: &'a Settlement,
    /// For the audit trail.
    pub reason: &'a str,
}

impl<'a> SettledSend<'a> {
    /// `verdict` for `claimed`, if it is terminal.
    pub fn of(claimed: &'a Claimed, verdict: &'a SendVerdict) -> Option<Self> {
        match verdict {
            SendVerdict::Settle { transition, settlement, reason } => {
                Some(Self { claimed, transition: *transition, settlement, reason })
            }
            SendVerdict::Retry { .. } | SendVerdict::Uncertain { .. } => None,
        }
    }
}

/// Records every one of `sends` in `tx` and commits: each payment whose token is still on its row
/// is settled (or, if a webhook or a poll settled it first, only its row is removed); the others
/// are [`Recorded::LeaseLost`] and nothing is written for them. Returns what happened to each, in
/// order. If any payment is in a status that no one may give it while this worker holds its lease,
/// nothing at all is written ([`RecordError::Inconsistent`]): record the sends one by one to learn
/// which.
///
/// For each tenant among them, one statement takes the rows, one settles the payments (status, audit
/// row, ledger entry) and one stores their responses, and one commit covers them all: recording them
/// one by one would cost a commit and several round trips per payment.
///
/// With a `lease`, the deliveries of the payments' events that may be sent at once are queued leased
/// to this worker, and returned once the transaction has committed: the caller sends them.
#[tracing::instrument(name = "worker.record_settlements", skip_all, fields(sends = sends.len()))]
pub async fn record_settlements(
    mut tx: Transaction<'_, Postgres>,
    actor: &str,
    sends: &[SettledSend<'_>],
    lease: Option<&WriterLease<'_>>,
) -> Result<(Vec<Recorded>, Vec<ClaimedDelivery>), RecordError> {
    let claims: Vec<&Claimed> = sends.iter().map(|send| send.claimed).collect();
    let held = sending::take_all(&mut tx, &claims).await?;
    if held.is_empty() {
        tx.rollback().await?;
        return Ok((vec![Recorded::LeaseLost; sends.len()], Vec::new()));
    }

    let changes: Vec<(Change<'_>, &Settlement)> = sends
        .iter()
        .filter(|send| held.contains(&send.claimed.payment_id))
        .map(|send| (change(send.claimed, actor, send.transition, send.reason, None), send.settlement))
        .collect();
    let settled = transitions::settle_all_deferring_wakeup(&mut tx, &changes, lease).await?;
    let mut recorded: HashMap<PaymentId, Recorded> = HashMap::with_capacity(changes.len());
    for ((change, _), written) in changes.iter().zip(settled.recorded) {
        let this = match written {
            transitions::Recorded::Moved(payment) => Recorded::Moved(payment.status),
            // Its row is already gone: taken above.
            transitions::Recorded::LostRace => {
                match current_status(&mut tx, change.tenant_id, change.payment_id).await? {
                    status @ (PaymentStatus::Pending | PaymentStatus::Processing) => {
                        tx.rollback().await?;
                        return Err(RecordError::Inconsistent(status));
                    }
                    status => Recorded::Superseded(status),
                }
            }
        };
        recorded.insert(change.payment_id, this);
    }
    tx.commit().await?;
    let recorded =
        sends.iter().map(|send| recorded.remove(&send.claimed.payment_id).unwrap_or(Recorded::LeaseLost)).collect();
    Ok((recorded, settled.leased))
}

/// The move from `processing`, with the attempt and token in the audit detail.
fn change<'a>(
    claimed: &Claimed,
    actor: &'a str,
    transition: Transition,
    reason: &'a str,
    code: Option<&str>,
) -> Change<'a> {
    let mut detail = json!({"attempt": claimed.attempt, "fencing_token": claimed.fencing_token});
    if let Some(code) = code {
        detail["reason"] = json!(code);
    }
    Change {
        tenant_id: claimed.tenant_id,
        payment_id: claimed.payment_id,
        from: PaymentStatus::Processing,
        transition,
        actor,
        reason,
        detail: Some(detail),
    }
}

/// The payment left `processing` while this worker held the lease: only the reconciler can do that
/// (a webhook or a poll settled it), and it leaves the outbox row to the lease holder. A payment that
/// is past sending must not keep a row, so drop it; anything else is a bug elsewhere, and nothing is
/// written.
async fn superseded(mut tx: Transaction<'_, Postgres>, claimed: &Claimed) -> Result<Recorded, RecordError> {
    match current_status(&mut tx, claimed.tenant_id, claimed.payment_id).await? {
        status @ (PaymentStatus::Pending | PaymentStatus::Processing) => {
            tx.rollback().await?;
            Err(RecordError::Inconsistent(status))
        }
        status => {
            sending::discard(&mut tx, claimed).await?;
            tx.commit().await?;
            Ok(Recorded::Superseded(status))
        }
    }
}

async fn current_status(
    conn: &mut sqlx::PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<PaymentStatus, RecordError> {
    Ok(payments::fetch(conn, tenant_id, payment_id)
        .await?
        .ok_or(StoreError::Unexpected(sqlx::Error::RowNotFound.into()))?
        .status)
}
