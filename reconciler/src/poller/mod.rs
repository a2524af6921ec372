//! The poller: settles `unknown` payments and refunds by asking the provider what it holds under
//! their downstream idempotency keys.
//!
//! One loop per kind ([`Poller`] over a [`Subject`]), each the same: claim a batch of due ones
//! (`crate::unknown`), look each up outside any transaction, then record what the lookup means in
//! one short transaction per payment or refund. What a lookup means is decided by the kind, purely
//! ([`payments`], [`refunds`]); recording it is the same for both. Every move out of `unknown` is a
//! compare-and-set: a webhook that settles a payment or refund while its lookup is in flight wins,
//! and the poller's change is a lost race, a normal outcome.
//!
//! An inconclusive lookup is counted and looked up again after a per-row exponential backoff; after
//! `max_attempts` of them, or once the row has been `unknown` for `max_age`, it is dead-lettered
//! with the evidence, for an operator. A verdict the database refuses to record (a constraint, a
//! value it cannot hold) counts as an inconclusive lookup, so nothing stays `unknown` for ever.

pub mod payments;
pub mod refunds;

use std::borrow::Cow;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use oncepay_ops::render;
use oncepay_provider::{KeyWindow, PaymentProvider};
use oncepay_service::backoff::Backoff;
use oncepay_service::runner::Pass;
use oncepay_store::StoreError;
use oncepay_store::transitions::TransitionError;
use serde_json::{Value, json};
use sqlx::{Acquire, PgConnection, PgPool};
use tracing::{Instrument, Span};

use crate::unknown::{Why, evidence};

pub use payments::PaymentPoller;
pub use refunds::RefundPoller;

const ACTOR: &str = "reconciler:poller";

/// The poller's limits, the same for payments and refunds.
#[derive(Debug, Clone)]
pub struct PollerConfig {
    /// Pause after a pass that found nothing due.
    pub interval: Duration,
    /// Payments or refunds claimed per pass.
    pub batch_size: u32,
    /// Lookups in flight at once.
    pub concurrency: usize,
    /// How long a claimed payment or refund stays hidden from other pollers.
    pub lease: Duration,
    /// Wait between inconclusive lookups of one payment or refund.
    pub backoff: Backoff,
    /// Inconclusive lookups before dead-lettering.
    pub max_attempts: u32,
    /// Time in `unknown` before dead-lettering.
    pub max_age: Duration,
    /// How long the provider remembers a key. A payment or refund is resent with its key only
    /// within its resend horizon (the window minus a margin) after its first send, and a refund is
    /// failed as never made only once it has been `unknown` for the whole window.
    pub key_window: KeyWindow,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Payments or refunds claimed.
    pub claimed: u64,
    /// Settled `succeeded` from what the provider holds: charged, or refunded.
    pub succeeded: u64,
    /// Settled `failed` from what the provider holds: declined, or a failed refund.
    pub failed: u64,
    /// Refunds settled `failed` because the provider holds none under the key and every send of
    /// it is older than the key window ([`refunds::NOT_MADE`]).
    pub not_made: u64,
    /// Sent back to `pending` for a resend with the same key.
    pub resent: u64,
    /// Looked up without a conclusion; to be looked up again.
    pub inconclusive: u64,
    /// Given up on, or found to contradict what they asked for: dead-lettered.
    pub dead_lettered: u64,
    /// Moved by someone else (a webhook) while being looked up.
    pub lost_race: u64,
}

/// How a lookup settled a payment or refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Money moved as asked: charged, or given back.
    Succeeded,
    /// The provider said no: declined, or a failed refund.
    Failed,
    /// The provider provably never made the refund.
    NotMade,
}

/// What a lookup means for one payment or refund, with the words its audit row gets. Decided by
/// the kind, purely; recorded by [`Poller`].
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict<S> {
    /// What the provider holds settles it.
    Settle {
        /// How it settles.
        settlement: S,
        /// Succeeded, failed or never made, for the counts.
        settled: Settled,
        /// Why, in words.
        reason: Cow<'static, str>,
        /// Where the evidence came from: `poll`, or `webhook_recorded` for a payment's webhooks
        /// recorded while it was being sent.
        source: &'static str,
        /// What was found, as fields of the evidence (`{"charge": …}`).
        found: Value,
    },
    /// What the provider holds is not what it asked for: dead-lettered as a conflict, for an
    /// operator.
    Mismatch {
        /// What does not match, in words.
        detail: String,
        /// Where the evidence came from, as for [`Verdict::Settle`].
        source: &'static str,
        /// What was found, as fields of the evidence.
        found: Value,
    },
    /// Provably nothing at the provider while it still remembers the key: back to `pending` and
    /// into the outbox, resent with the same key.
    Resend {
        /// Why, in words.
        reason: &'static str,
        /// The evidence's `result`.
        result: &'static str,
    },
    /// No conclusion (`detail` says why): looked up again after a backoff.
    Inconclusive {
        /// Why not, in words.
        detail: String,
    },
    /// No conclusion, and the lookups or the time have run out: dead-lettered with the evidence.
    Exhaust {
        /// The last lookup's reason for no conclusion.
        detail: String,
    },
}

impl<S> Verdict<S> {
    /// An inconclusive lookup (`detail` says why) of `subject`: given up on past the limits, else
    /// looked up again later.
    pub fn inconclusive(subject: &impl Subject, detail: String, config: &PollerConfig) -> Self {
        let attempts = subject.lookups().saturating_add(1);
        if attempts >= config.max_attempts || subject.age() >= config.max_age {
            Self::Exhaust { detail }
        } else {
            Self::Inconclusive { detail }
        }
    }
}

/// A claimed payment or refund, and what its kind does at each step of a poll. Every move returns
/// whether it moved: false when someone else moved it out of `unknown` first, writing nothing.
pub trait Subject: Sized + Send + Sync {
    /// How the provider's answer settles one.
    type Settlement: Send + Sync;

    /// The loop's name, for its logs and failures counter.
    const LOOP: &'static str;
    /// What one is called in error messages: `payment`, `refund`.
    const NOUN: &'static str;
    /// The counter of how `unknown` ones of this kind left `unknown`, by `how`.
    const RESOLVED_METRIC: &'static str;

    /// Claims up to `batch_size` due ones, hiding each from other pollers for `lease`; whether
    /// each may be resent is judged against `resend_horizon`.
    fn claim_due(
        conn: &mut PgConnection,
        batch_size: u32,
        lease: Duration,
        resend_horizon: Duration,
    ) -> impl Future<Output = Result<Vec<Self>, StoreError>> + Send;

    /// The span its poll runs in, continuing its trace where it has one.
    fn span(&self) -> Span;

    /// Lookups already made, inconclusively.
    fn lookups(&self) -> u32;

    /// How long it has been `unknown`.
    fn age(&self) -> Duration;

    /// What its evidence says: a lookup at `provider`, and whatever else the kind holds.
    fn look_up<P: PaymentProvider>(
        &self,
        pool: &PgPool,
        provider: &P,
        config: &PollerConfig,
    ) -> impl Future<Output = anyhow::Result<Verdict<Self::Settlement>>> + Send;

    /// How `settled` is named for this kind: in spans (`charged`), and as the resolved metric's
    /// `how` (`poll_charged`).
    fn names(settled: Settled) -> (&'static str, &'static str);

    /// Settles it by `settlement`, with `evidence` in its audit row.
    fn settle(
        &self,
        conn: &mut PgConnection,
        settlement: &Self::Settlement,
        why: Why<'_>,
        evidence: Value,
    ) -> impl Future<Output = Result<bool, TransitionError>> + Send;

    /// Sends it back to `pending` and into its outbox, to be resent with the same key.
    fn resend(
        &self,
        conn: &mut PgConnection,
        why: Why<'_>,
        evidence: Value,
    ) -> impl Future<Output = Result<bool, TransitionError>> + Send;

    /// Dead-letters it as given up on.
    fn exhaust(
        &self,
        conn: &mut PgConnection,
        why: Why<'_>,
        evidence: Value,
    ) -> impl Future<Output = Result<bool, TransitionError>> + Send;

    /// Dead-letters it as a conflict: the provider holds something it did not ask for.
    fn mismatch(
        &self,
        conn: &mut PgConnection,
        why: Why<'_>,
        evidence: Value,
    ) -> impl Future<Output = Result<bool, TransitionError>> + Send;

    /// Counts an inconclusive lookup, keeping `evidence` where the kind keeps it, and plans the next
    /// one `wait` from now.
    fn note_inconclusive(
        &self,
        conn: &mut PgConnection,
        evidence: Value,
        wait: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// The poller loop for one kind of [`Subject`].
pub struct Poller<S, P> {
    pool: PgPool,
    provider: P,
    config: PollerConfig,
    kind: std::marker::PhantomData<fn() -> S>,
}

/// A pass that claimed something may have left more due ones behind it.
impl<S: Subject, P: PaymentProvider> Pass for Poller<S, P> {
    const NAME: &'static str = S::LOOP;

    fn interval(&self) -> Duration {
        self.config.interval
    }

    async fn pass(&self) -> anyhow::Result<bool> {
        Ok(self.run_once().await?.claimed > 0)
    }
}

impl<S: Subject, P: PaymentProvider> Poller<S, P> {
    /// A poller over `pool`, asking `provider`.
    pub const fn new(pool: PgPool, provider: P, config: PollerConfig) -> Self {
        Self { pool, provider, config, kind: std::marker::PhantomData }
    }

    /// One pass: claims due ones, looks each up, records each verdict.
    pub async fn run_once(&self) -> anyhow::Result<Counts> {
        let claimed = {
            let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
            let horizon = self.config.key_window.resend_horizon();
            S::claim_due(&mut conn, self.config.batch_size, self.config.lease, horizon)
                .await
                .with_context(|| format!("cannot claim due unknown {}s", S::NOUN))?
        };
        let mut counts = Counts { claimed: claimed.len() as u64, ..Counts::default() };
        let mut polls = futures::stream::iter(claimed.into_iter().map(|subject| self.poll_one(subject)))
            .buffer_unordered(self.config.concurrency);
        let (mut done, mut failures, mut last_error) = (0, 0, None);
        while let Some(polled) = polls.next().await {
            done += 1;
            match polled {
                Ok(polled) => polled.count(&mut counts),
                Err(error) => {
                    failures += 1;
                    last_error = Some(error);
                }
            }
        }
        // A poll whose outcome was not recorded keeps its lease, and is looked up again once the
        // lease expires.
        match last_error {
            Some(error) => Err(error.context(format!("{failures} of {done} polls could not be recorded"))),
            None => Ok(counts),
        }
    }

    /// Looks one up and records the verdict, in the kind's span.
    async fn poll_one(&self, subject: S) -> anyhow::Result<Polled> {
        let span = subject.span();
        let done = self.look_up_and_record(&subject).instrument(span.clone()).await;
        if let Ok(done) = &done {
            span.record("poll.outcome", done.label::<S>());
        }
        done
    }

    async fn look_up_and_record(&self, subject: &S) -> anyhow::Result<Polled> {
        let verdict = subject.look_up(&self.pool, &self.provider, &self.config).await?;
        let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
        let done = match self.record(&mut conn, subject, &verdict).await {
            Ok(done) => done,
            // The database refused what the verdict would write. That is evidence about this one,
            // not a failure of the pass: it counts toward dead-lettering.
            Err(error) if !unavailable(&error) => {
                let detail = format!("the verdict could not be recorded: {error:#}");
                tracing::warn!(error = %detail, "recording a poll failed; counted as inconclusive");
                self.record(&mut conn, subject, &Verdict::inconclusive(subject, detail, &self.config)).await?
            }
            Err(error) => return Err(error),
        };
        done.record_metric::<S>();
        Ok(done)
    }

    /// Records `verdict` in one transaction.
    async fn record(
        &self,
        conn: &mut PgConnection,
        subject: &S,
        verdict: &Verdict<S::Settlement>,
    ) -> anyhow::Result<Polled> {
        let mut tx = conn.begin().await.context("cannot start a transaction")?;
        let attempt = subject.lookups().saturating_add(1);
        let noted = |source: &str, found: &Value| {
            let mut fields = json!({ "attempt": attempt });
            if let (Some(fields), Value::Object(found)) = (fields.as_object_mut(), found.clone()) {
                fields.extend(found);
            }
            evidence(source, fields)
        };
        let done = match verdict {
            Verdict::Settle { settlement, settled, reason, source, found } => {
                let moved = subject
                    .settle(&mut tx, settlement, why(reason), noted(source, found))
                    .await
                    .with_context(|| format!("cannot settle the {}", S::NOUN))?;
                moved_or_lost(moved, Polled::Settled(*settled))
            }
            Verdict::Mismatch { detail, source, found } => {
                let moved = subject
                    .mismatch(&mut tx, why(detail), noted(source, found))
                    .await
                    .with_context(|| format!("cannot dead-letter the {}", S::NOUN))?;
                moved_or_lost(moved, Polled::DeadLettered)
            }
            Verdict::Resend { reason, result } => {
                let evidence = noted("poll", &json!({ "result": result }));
                let moved = subject
                    .resend(&mut tx, why(reason), evidence)
                    .await
                    .with_context(|| format!("cannot queue the {} for a resend", S::NOUN))?;
                moved_or_lost(moved, Polled::Resent)
            }
            Verdict::Inconclusive { detail } => {
                let wait = self.config.backoff.delay(attempt, &mut rand::rng());
                tracing::info!(detail, wait_ms = wait.as_millis(), "a lookup was inconclusive");
                let evidence = noted("poll", &json!({ "result": detail }));
                let counted = subject
                    .note_inconclusive(&mut tx, evidence, wait)
                    .await
                    .with_context(|| format!("cannot record the {}'s lookup", S::NOUN))?;
                moved_or_lost(counted, Polled::Inconclusive)
            }
            Verdict::Exhaust { detail } => {
                let reason = format!(
                    "no conclusive response from the provider after {attempt} lookups over {}",
                    render::age(time::Duration::try_from(subject.age()).unwrap_or(time::Duration::MAX)),
                );
                let evidence = noted("poll", &json!({ "result": detail }));
                let moved = subject
                    .exhaust(&mut tx, why(&reason), evidence)
                    .await
                    .with_context(|| format!("cannot dead-letter the {}", S::NOUN))?;
                moved_or_lost(moved, Polled::DeadLettered)
            }
        };
        tx.commit().await.context("cannot commit the poll's outcome")?;
        Ok(done)
    }
}

/// Whether `error` comes from a database that could not be reached, rather than one that refused
/// what it was asked to write.
fn unavailable(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.downcast_ref::<sqlx::Error>().is_some_and(oncepay_store::is_transient))
}

fn why(reason: &str) -> Why<'_> {
    Why { actor: ACTOR, reason }
}

const fn moved_or_lost(moved: bool, outcome: Polled) -> Polled {
    if moved { outcome } else { Polled::LostRace }
}

/// What recording one poll did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polled {
    Settled(Settled),
    Resent,
    Inconclusive,
    DeadLettered,
    LostRace,
}

impl Polled {
    fn count(self, counts: &mut Counts) {
        match self {
            Self::Settled(Settled::Succeeded) => counts.succeeded += 1,
            Self::Settled(Settled::Failed) => counts.failed += 1,
            Self::Settled(Settled::NotMade) => counts.not_made += 1,
            Self::Resent => counts.resent += 1,
            Self::Inconclusive => counts.inconclusive += 1,
            Self::DeadLettered => counts.dead_lettered += 1,
            Self::LostRace => counts.lost_race += 1,
        }
    }

    fn label<S: Subject>(self) -> &'static str {
        match self {
            Self::Settled(settled) => S::names(settled).0,
            Self::Resent => "resent",
            Self::Inconclusive => "inconclusive",
            Self::DeadLettered => "dead_lettered",
            Self::LostRace => "lost_race",
        }
    }

    fn record_metric<S: Subject>(self) {
        let how = match self {
            Self::Settled(settled) => S::names(settled).1,
            Self::Resent => "resend",
            Self::DeadLettered => "dead_lettered",
            Self::Inconclusive | Self::LostRace => return,
        };
        metrics::counter!(S::RESOLVED_METRIC, "how" => how).increment(1);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The limits the kinds' verdict tests judge by: 5 lookups, an hour in `unknown`, a day's key
    /// window with an hour's margin.
    pub(crate) fn config() -> PollerConfig {
        PollerConfig {
            interval: Duration::from_secs(1),
            batch_size: 10,
            concurrency: 2,
            lease: Duration::from_secs(60),
            backoff: Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60) },
            max_attempts: 5,
            max_age: Duration::from_secs(3600),
            key_window: KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3600) },
        }
    }
}
