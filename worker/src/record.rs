//! Recording a decision: one transaction, guarded by the fencing token, using the shared transitions.
//!
//! The transaction first ends the send on the outbox row (deletes it, or for a retry releases it with
//! a backoff), but only if the worker's fencing token is still on it; no such row means the sweeper
//! took the lease over, and nothing at all is recorded. Then it moves the payment with
//! `transitions::settle` (terminal: status, audit row, ledger entry, stored key response) or
//! `transitions::apply` (retry, unknown), whose status compare-and-set is the second guard, and for
//! `unknown` queues the payment for the reconciler. All of it commits together or not at all. The
//! transitions' `_deferring_wakeup` forms are used: the drainer announces the payment after the
//! commit, so that recordings commit together instead of one `NOTIFY` at a time.
//!
//! Locks are taken outbox row first, payment second, like the claim and the sweeper. This module
//! never calls the provider; it records what the drainer decided.

use oncepay_shared::status::{PaymentStatus, Transition};
use oncepay_shared::store::transitions::{self, Applied, Change, TransitionError};
use oncepay_shared::store::{StoreError, payments, unknown_queue};
use oncepay_shared::telemetry;
use serde_json::json;
use sqlx::{Postgres, Transaction};
use time::OffsetDateTime;

use crate::decision::Decision;
use crate::outbox::{self, Claimed};

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
    /// Whether trying again may succeed (the database was unreachable, a deadlock, a timeout).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transition(TransitionError::Store(error)) if error.is_unavailable())
    }
}

/// Records `decision` for `claimed` in `tx`, and commits it unless the lease was lost.
#[tracing::instrument(name = "worker.record", skip_all, fields(payment.id = %claimed.payment_id, decision = decision.label()))]
pub async fn record(
    mut tx: Transaction<'_, Postgres>,
    actor: &str,
    claimed: &Claimed,
    decision: &Decision,
) -> Result<Recorded, RecordError> {
    let held = match decision {
        Decision::Retry { delay, .. } => outbox::release(&mut tx, claimed, *delay).await?,
        Decision::Settle { .. } | Decision::Uncertain { .. } => outbox::take(&mut tx, claimed).await?,
    };
    if !held {
        tx.rollback().await?;
        return Ok(Recorded::LeaseLost);
    }

    let moved = match decision {
        Decision::Settle { transition, settlement, reason } => {
            let change = change(claimed, actor, *transition, reason, None);
            match transitions::settle_deferring_wakeup(&mut tx, &change, settlement).await? {
                Applied::Moved(payment) => Some(payment.status),
                Applied::LostRace => None,
            }
        }
        Decision::Retry { reason, .. } => {
            let change = change(claimed, actor, Transition::NotSentRetry, reason, None);
            match transitions::apply_deferring_wakeup(&mut tx, &change).await? {
                Applied::Moved(status) => Some(status),
                Applied::LostRace => None,
            }
        }
        Decision::Uncertain { code, reason } => {
            let change = change(claimed, actor, Transition::Uncertain, reason, Some(code));
            match transitions::apply_deferring_wakeup(&mut tx, &change).await? {
                Applied::Moved(status) => {
                    let evidence = json!({
                        "source": actor,
                        "reason": code,
                        "detail": reason,
                        "attempt": claimed.attempt,
                        "send_attempts": claimed.send_attempts,
                        "fencing_token": claimed.fencing_token,
                        "observed_at": OffsetDateTime::now_utc()
                            .format(&time::format_description::well_known::Rfc3339)
                            .ok(),
                    });
                    // The outbox row, which carried the payment's trace, is gone: the reconciler's
                    // resolution continues the trace from this recording span instead.
                    let trace = telemetry::trace_context_of(&tracing::Span::current());
                    let (tenant_id, payment_id) = (claimed.tenant_id, claimed.payment_id);
                    unknown_queue::enqueue(&mut tx, tenant_id, payment_id, code, evidence, trace.as_ref()).await?;
                    Some(status)
                }
                Applied::LostRace => None,
            }
        }
    };

    match moved {
        Some(status) => {
            tx.commit().await?;
            Ok(Recorded::Moved(status))
        }
        None => superseded(tx, claimed).await,
    }
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
    let status = payments::fetch(&mut tx, claimed.tenant_id, claimed.payment_id)
        .await?
        .ok_or(StoreError::Unexpected(sqlx::Error::RowNotFound))?
        .status;
    match status {
        PaymentStatus::Pending | PaymentStatus::Processing => {
            tx.rollback().await?;
            Err(RecordError::Inconsistent(status))
        }
        PaymentStatus::Succeeded | PaymentStatus::Failed | PaymentStatus::Unknown | PaymentStatus::DeadLettered => {
            outbox::discard(&mut tx, claimed).await?;
            tx.commit().await?;
            Ok(Recorded::Superseded(status))
        }
    }
}
