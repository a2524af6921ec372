//! Sending refunds: the worker's second queue, drained beside the payments' outbox with the same
//! protocol. A claim (lease, fencing token, `pending → processing`) commits before the provider is
//! called; the provider call runs with no transaction open; the result is recorded only while the
//! fencing token is still on the refund's outbox row. Expired leases are the sweeper's
//! (`oncepay_store::refunds::sending::sweep`, run by the reconciler).
//!
//! [`decide`] is pure and says what an outcome means:
//!
//! | outcome ([`RefundOutcome`]) | verdict |
//! | --- | --- |
//! | refunded, as asked | settle `succeeded` |
//! | refunded, but not as asked | `unknown`: the reconciler dead-letters it with the evidence |
//! | failed, with the refund's own failed object, or nothing sent before | settle `failed` |
//! | failed without one, an earlier send may have refunded | `unknown`: only a lookup can tell |
//! | unfinished (the provider has not finished it) | `unknown`, settled by a lookup or a webhook |
//! | not sent, attempts left | retry after a jittered backoff |
//! | not sent, attempts spent | settle `failed` (`provider_unreachable`), or `unknown` if an earlier send may have refunded |
//! | uncertain | `unknown` |

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::join_all;
use rand::Rng;
use serde_json::json;
use sqlx::postgres::PgListener;
use sqlx::{Connection, PgPool};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use oncepay_domain::refund_status::{RefundStatus, RefundTransition};
use oncepay_provider::{NotSentReason, PaymentProvider, Refund as ProviderRefund, RefundOutcome};
use oncepay_service::telemetry;
use oncepay_store::refunds::REFUND_OUTBOX_CHANNEL;
use oncepay_store::refunds::sending::{self, ClaimedRefund, Release};
use oncepay_store::refunds::settling::{self, Finding, RefundChange, RefundSettlement};
use oncepay_store::transitions::Recorded;

use crate::drainer::DrainerConfig;
use crate::metrics::{self, Kind};
use crate::verdict::{KEY_WINDOW_PASSED, PROVIDER_UNREACHABLE, RetryPolicy, uncertain_code};

/// What to record for one claimed refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundVerdict {
    /// A terminal status.
    Settle {
        /// [`RefundTransition::Refunded`] (the money went back), [`RefundTransition::Refused`] or
        /// [`RefundTransition::NotSentExhausted`].
        transition: RefundTransition,
        /// The result it stores.
        settlement: RefundSettlement,
        /// For the audit trail.
        reason: String,
    },
    /// Provably not sent: back to `pending`, claimable again after `delay`.
    Retry {
        /// How long to wait.
        delay: Duration,
        /// For the audit trail.
        reason: String,
    },
    /// The provider may have refunded: `unknown`, for the reconciler.
    Uncertain {
        /// A stable code for why, the payments' codes where the cause is the same (in the event's
        /// detail, as a payment's).
        code: &'static str,
        /// For the audit trail.
        reason: String,
        /// The provider's refund, when it named one.
        provider_refund_id: Option<String>,
    },
}

impl RefundVerdict {
    fn uncertain(code: &'static str, reason: impl Into<String>) -> Self {
        Self::Uncertain { code, reason: reason.into(), provider_refund_id: None }
    }
}

/// What to record for `claimed` after its send ended in `outcome`.
pub fn decide(
    claimed: &ClaimedRefund,
    outcome: &RefundOutcome,
    policy: &RetryPolicy,
    rng: &mut impl Rng,
) -> RefundVerdict {
    match outcome {
        RefundOutcome::Refunded(refund) | RefundOutcome::Unfinished(refund) => judged(claimed, refund),
        // A refusal of this request says nothing of an earlier send that may have refunded under the
        // same key: only the refund's own failed object, or a lookup, proves that no money moved.
        RefundOutcome::Failed { code, refund_id: None, .. } if claimed.may_have_moved => RefundVerdict::uncertain(
            "refused_after_possible_refund",
            format!(
                "the provider refused a resend ({code}) without showing this refund's failed object, and an \
                     earlier send may have refunded"
            ),
        ),
        RefundOutcome::Failed { code, message, refund_id } => RefundVerdict::Settle {
            transition: RefundTransition::Refused,
            reason: format!("the provider failed the refund ({code})"),
            settlement: RefundSettlement::Failed {
                code: code.clone(),
                message: message.clone(),
                provider_refund_id: refund_id.clone(),
            },
        },
        RefundOutcome::NotSent { reason, retry_after } => not_sent(claimed, reason, *retry_after, policy, rng),
        RefundOutcome::Uncertain(reason) => RefundVerdict::uncertain(uncertain_code(reason), reason.to_string()),
    }
}

/// What the provider's `refund` means for `claimed`, as [`settling::judge`] finds: settled, not
/// finished, or not the refund asked for.
fn judged(claimed: &ClaimedRefund, refund: &ProviderRefund) -> RefundVerdict {
    match settling::judge(&claimed.asked(), refund) {
        Finding::Settles(settlement) => {
            let (transition, reason) = match &settlement {
                RefundSettlement::Succeeded { provider_refund_id, .. } => {
                    (RefundTransition::Refunded, format!("the provider refunded the customer ({provider_refund_id})"))
                }
                RefundSettlement::Failed { code, .. } => {
                    (RefundTransition::Refused, format!("the provider failed the refund ({code})"))
                }
            };
            RefundVerdict::Settle { transition, settlement, reason }
        }
        Finding::Unfinished => RefundVerdict::Uncertain {
            code: "not_final",
            reason: format!("the provider took the refund ({}) but has not finished it", refund.id),
            provider_refund_id: Some(refund.id.clone()),
        },
        Finding::NotAsAsked(why) => RefundVerdict::uncertain("refund_mismatch", why),
    }
}

/// A send that provably did not reach the provider: a retry while attempts are left; then failed, or
/// `unknown` if an earlier send may have refunded.
fn not_sent(
    claimed: &ClaimedRefund,
    reason: &NotSentReason,
    retry_after: Option<Duration>,
    policy: &RetryPolicy,
    rng: &mut impl Rng,
) -> RefundVerdict {
    match policy.retry(claimed.attempt, reason, retry_after, rng) {
        Some((delay, reason)) => RefundVerdict::Retry { delay, reason },
        None if claimed.may_have_moved => RefundVerdict::uncertain(
            "not_sent_but_may_have_moved",
            format!(
                "not sent in {} attempts ({reason}), but an earlier send may have reached the provider",
                claimed.attempt
            ),
        ),
        None => RefundVerdict::Settle {
            transition: RefundTransition::NotSentExhausted,
            reason: format!("not sent in {} attempts ({reason})", claimed.attempt),
            settlement: RefundSettlement::Failed {
                code: PROVIDER_UNREACHABLE.to_owned(),
                message: format!(
                    "The payment provider could not be reached in {} attempts ({reason}); no money was refunded.",
                    claimed.attempt
                ),
                provider_refund_id: None,
            },
        },
    }
}

/// What recording a verdict did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// The refund moved to this status.
    Moved(RefundStatus),
    /// The fencing token was gone: the sweeper took the lease back; nothing was written.
    LeaseLost,
    /// Someone else had moved the refund: only the outbox row was removed.
    Superseded,
}

/// Sends refunds from the refund outbox until shutdown.
#[derive(Debug, Clone)]
pub struct RefundSender<P> {
    pool: PgPool,
    provider: P,
    config: DrainerConfig,
}

impl<P: PaymentProvider + Clone + 'static> RefundSender<P> {
    /// A sender over `pool`, calling `provider`, with the drainer's settings.
    pub fn new(pool: PgPool, provider: P, config: DrainerConfig) -> Self {
        Self { pool, provider, config }
    }

    /// Claims, sends and records one batch of each tenant with refunds due, the tenant with the
    /// oldest first, never more than `max_in_flight` refunds in all; returns what each recording did.
    pub async fn run_once(&self) -> anyhow::Result<Vec<Recording>> {
        let mut conn = self.pool.acquire().await.context("connecting to claim refunds")?;
        let slots = self.config.max_in_flight as usize;
        let tenants = sending::tenants_due(&mut conn, self.config.batch_size).await?;
        let mut claimed = Vec::new();
        for tenant_id in tenants {
            let free = slots.saturating_sub(claimed.len());
            if free == 0 {
                break;
            }
            claimed.extend(
                sending::claim(
                    &mut conn,
                    tenant_id,
                    self.config.batch_size.min(u32::try_from(free).unwrap_or(u32::MAX)),
                    &self.config.worker_id,
                    self.config.lease,
                    self.config.key_window,
                )
                .await?,
            );
        }
        drop(conn);
        metrics::claimed(Kind::Refund, claimed.len());
        let sends = claimed.into_iter().map(|claimed| {
            // In the trace of the request that asked for the refund, so the provider call carries
            // that trace's `traceparent`.
            let span = tracing::info_span!(
                "worker.refund",
                refund.id = %claimed.refund_id,
                tenant.id = %claimed.tenant_id,
                attempt = claimed.attempt,
            );
            if let Some(trace) = &claimed.trace {
                telemetry::continue_trace(&span, trace);
            }
            async move {
                let verdict = self.send(&claimed).await;
                let recorded = self.record(&claimed, &verdict).await;
                match &recorded {
                    Ok(Recording::Moved(status)) if *status != RefundStatus::Pending => {
                        metrics::drained(Kind::Refund, claimed.accepted_at);
                    }
                    Ok(Recording::LeaseLost) => metrics::lease_lost(Kind::Refund),
                    Err(_) => metrics::record_error(Kind::Refund),
                    Ok(Recording::Moved(_) | Recording::Superseded) => {}
                }
                recorded
            }
            .instrument(span)
        });
        join_all(sends).await.into_iter().collect()
    }

    /// Sends `claimed`, unless a send could refund twice, and decides what the outcome means.
    async fn send(&self, claimed: &ClaimedRefund) -> RefundVerdict {
        if !claimed.send_is_safe() {
            return RefundVerdict::uncertain(
                KEY_WINDOW_PASSED,
                "not sent: an earlier send may have reached the provider, and the provider may have forgotten the key \
                 since, so a resend could refund twice",
            );
        }
        let started = Instant::now();
        let outcome = self.provider.create_refund(&claimed.refund_request()).await;
        metrics::provider_outcome(Kind::Refund, outcome.class(), started.elapsed());
        tracing::info!(refund.id = %claimed.refund_id, outcome = outcome.class(), "refund sent");
        let policy = RetryPolicy { max_attempts: self.config.max_attempts, backoff: self.config.backoff };
        decide(claimed, &outcome, &policy, &mut rand::rng())
    }

    /// Records `verdict` under `claimed`'s fencing token, in one transaction.
    pub async fn record(&self, claimed: &ClaimedRefund, verdict: &RefundVerdict) -> anyhow::Result<Recording> {
        let mut conn = self.pool.acquire().await.context("connecting to record a refund")?;
        let mut tx = conn.begin().await?;
        let release = match verdict {
            RefundVerdict::Retry { delay, .. } => {
                Release::RetryAt(OffsetDateTime::now_utc() + time::Duration::try_from(*delay)?)
            }
            RefundVerdict::Settle { .. } | RefundVerdict::Uncertain { .. } => Release::Done,
        };
        if !sending::release(&mut tx, claimed, release).await? {
            return Ok(Recording::LeaseLost);
        }
        let actor = format!("worker:{}", self.config.worker_id);
        let fenced = json!({"fencing_token": claimed.fencing_token, "attempt": claimed.attempt});
        let moved = match verdict {
            RefundVerdict::Settle { transition, settlement, reason } => {
                let change = change(claimed, *transition, &actor, reason, fenced);
                match settling::settle(&mut tx, &change, settlement).await? {
                    Recorded::Moved(refund) => Some(refund.status),
                    Recorded::LostRace => None,
                }
            }
            RefundVerdict::Retry { reason, .. } => {
                let change = change(claimed, RefundTransition::NotSentRetry, &actor, reason, fenced);
                // The outbox row stays, unleased, due at the retry's time; unless someone else moved
                // the refund meanwhile, and then it has nothing left to send.
                let moved = recorded(settling::apply(&mut tx, &change, None, OffsetDateTime::now_utc()).await?);
                if moved.is_none() {
                    sending::release(&mut tx, claimed, Release::Done).await?;
                }
                moved
            }
            RefundVerdict::Uncertain { code, reason, provider_refund_id } => {
                let mut detail = fenced;
                detail["reason"] = json!(code);
                let change = change(claimed, RefundTransition::Uncertain, &actor, reason, detail);
                recorded(
                    settling::apply(&mut tx, &change, provider_refund_id.as_deref(), OffsetDateTime::now_utc()).await?,
                )
            }
        };
        tx.commit().await?;
        Ok(moved.map_or(Recording::Superseded, Recording::Moved))
    }

    /// Drains until `shutdown`, woken by `NOTIFY` on the refund outbox's channel, with the drainer's
    /// poll interval as the fallback.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut listener = match PgListener::connect_with(&self.pool).await {
            Ok(mut listener) => match listener.listen(REFUND_OUTBOX_CHANNEL).await {
                Ok(()) => Some(listener),
                Err(error) => {
                    tracing::warn!(error = %error, "cannot listen for refunds; polling instead");
                    None
                }
            },
            Err(error) => {
                tracing::warn!(error = %error, "cannot listen for refunds; polling instead");
                None
            }
        };
        while !shutdown.is_cancelled() {
            match self.run_once().await {
                Ok(recorded) if !recorded.is_empty() => continue,
                Ok(_) => {}
                Err(error) => tracing::warn!(error = %error, "sending refunds failed; trying again at the next poll"),
            }
            let woken = async {
                match listener.as_mut() {
                    Some(listener) => {
                        let _ = listener.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = woken => {}
                () = tokio::time::sleep(self.config.poll_interval) => {}
            }
        }
    }
}

fn change<'a>(
    claimed: &ClaimedRefund,
    transition: RefundTransition,
    actor: &'a str,
    reason: &'a str,
    detail: serde_json::Value,
) -> RefundChange<'a> {
    RefundChange {
        tenant_id: claimed.tenant_id,
        refund_id: claimed.refund_id,
        from: RefundStatus::Processing,
        transition,
        actor,
        reason,
        detail: Some(detail),
    }
}

fn recorded(recorded: Recorded<RefundStatus>) -> Option<RefundStatus> {
    match recorded {
        Recorded::Moved(status) => Some(status),
        Recorded::LostRace => None,
    }
}
