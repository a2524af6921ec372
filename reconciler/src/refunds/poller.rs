//! The refund poller: settles `unknown` refunds by asking the provider which refunds of the
//! payment's charge it holds under the refund's downstream key.
//!
//! It runs beside the payments' poller with the same limits ([`PollerConfig`]). A lookup runs outside
//! any transaction; its verdict is recorded in one short transaction per refund, always as a
//! compare-and-set from `unknown`, so a webhook that settles the refund meanwhile wins and the
//! poller's change is a lost race. The refund lookup is a consistent source: an empty list proves
//! that no refund was made under the key so far. It proves that none ever will be only once no send
//! can still land: a send whose answer was lost may still be at the provider, and be made after the
//! lookup. Every send of a refund is made before it becomes `unknown`, and oncepay takes a provider
//! to act on a request within its key window. So a refund is failed as never made only once it has
//! been `unknown` for the whole key window.
//!
//! A refund held by another provider account than the payment's is another merchant's: a lookup
//! that lists one is judged as if it did not, and the refund is only counted and logged.

use anyhow::Context;
use oncepay_provider::{LookupError, PaymentProvider, Refund as ProviderRefund, RefundLookup};
use oncepay_store::refunds::settling::{self, Finding, RefundSettlement};
use oncepay_store::transitions::Recorded;
use serde_json::json;
use sqlx::{Acquire, PgConnection, PgPool};
use tracing::Instrument;

use super::unknown::{self, Claimed};
use crate::poller::{PollerConfig, poll_all, unavailable};
use crate::unknown::{Why, evidence};
use oncepay_ops::render;
use oncepay_service::runner::Pass;

const ACTOR: &str = "reconciler:poller";

/// The failure code of a refund the provider provably never made: none under its key, and every send
/// of it older than the key window.
pub const NOT_MADE: &str = "refund_not_made";

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Refunds claimed.
    pub claimed: u64,
    /// Settled `succeeded` from a refund found at the provider.
    pub refunded: u64,
    /// Settled `failed` from a failed refund found at the provider.
    pub failed: u64,
    /// Settled `failed` because the provider holds no refund under the key, and every send of it is
    /// older than the key window.
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

/// What a lookup means for one refund.
#[derive(Debug, Clone, PartialEq)]
enum LookupVerdict {
    /// The one refund under the key settles it (`settling::judge`).
    Settle { settlement: RefundSettlement, refund: Box<ProviderRefund> },
    /// A refund under the key that is not what it asked for, or more than one: dead-lettered with
    /// the provider's refunds as evidence, for an operator.
    Mismatch { detail: String, refunds: Vec<ProviderRefund> },
    /// No refund under the key, and the provider still remembers the key: back to `pending` and
    /// into the refund outbox, resent with the same key.
    Resend,
    /// No refund under the key, past the resend horizon, and every send older than the key window:
    /// `failed` with [`NOT_MADE`]. No money moved.
    NotMade,
    /// A failed lookup, or a refund the provider has not finished: looked up again after a
    /// per-refund backoff.
    Inconclusive { detail: String },
    /// After `max_attempts` inconclusive lookups, or once the refund has been `unknown` for
    /// `max_age`: dead-lettered with the last evidence, for an operator.
    Exhaust { detail: String },
}

/// The refund poller loop.
pub struct RefundPoller<P> {
    pool: PgPool,
    provider: P,
    config: PollerConfig,
}

/// A pass that claimed something may have left more due refunds behind it.
impl<P: PaymentProvider> Pass for RefundPoller<P> {
    const NAME: &'static str = "refund_poller";

    fn interval(&self) -> std::time::Duration {
        self.config.interval
    }

    async fn pass(&self) -> anyhow::Result<bool> {
        Ok(self.run_once().await?.claimed > 0)
    }
}

impl<P: PaymentProvider> RefundPoller<P> {
    /// A refund poller over `pool`, asking `provider`, with the payments' poller's limits.
    pub fn new(pool: PgPool, provider: P, config: PollerConfig) -> Self {
        Self { pool, provider, config }
    }

    /// One pass: claims due refunds, looks each up, records each verdict.
    pub async fn run_once(&self) -> anyhow::Result<Counts> {
        let claimed = {
            let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
            let horizon = self.config.key_window.resend_horizon();
            unknown::claim_due(&mut conn, self.config.batch_size, self.config.lease, horizon)
                .await
                .context("cannot claim due unknown refunds")?
        };
        let counts = Counts { claimed: claimed.len() as u64, ..Counts::default() };
        let polls = claimed.into_iter().map(|refund| self.poll_one(refund));
        poll_all(polls, self.config.concurrency, counts, Polled::count).await
    }

    /// Looks one refund up and records the verdict, in a `refund_poller.poll` span.
    async fn poll_one(&self, refund: Claimed) -> anyhow::Result<Polled> {
        let span = tracing::info_span!(
            "refund_poller.poll",
            refund.id = %refund.refund_id(),
            tenant.id = %refund.tenant_id(),
            poll.attempt = refund.lookups.saturating_add(1),
            poll.outcome = tracing::field::Empty,
        );
        let done = self.look_up_and_record(refund).instrument(span.clone()).await;
        if let Ok(done) = &done {
            span.record("poll.outcome", done.label());
        }
        done
    }

    async fn look_up_and_record(&self, refund: Claimed) -> anyhow::Result<Polled> {
        let lookup = RefundLookup {
            key: refund.refund_id().downstream_key(),
            charge_id: refund.asked.charge_id.clone(),
            account: refund.asked.account.clone(),
        };
        let found = self.provider.find_refunds(&lookup).await;
        if let Ok(listed) = &found {
            for other in listed.iter().filter(|listed| !settling::same_account(&refund.asked, listed)) {
                let why = format!(
                    "a lookup of refund {} listed refund {} of account {}",
                    refund.refund_id(),
                    other.id,
                    other.account.as_deref().unwrap_or("(oncepay's own)")
                );
                crate::metrics::other_account("lookup", "refund", &why);
            }
        }
        let verdict = decide(&refund, &found, &self.config);
        let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
        let done = match self.record(&mut conn, &refund, &verdict).await {
            Ok(done) => done,
            // The database refused what the verdict would write (a constraint, such as a provider
            // refund already booked to another refund). That is evidence about this refund, not a
            // failure of the pass: it counts toward dead-lettering, so the refund cannot stay
            // `unknown` for ever.
            Err(error) if !unavailable(&error) => {
                let detail = format!("the verdict could not be recorded: {error:#}");
                tracing::warn!(error = %detail, "recording a refund lookup failed; counted as inconclusive");
                self.record(&mut conn, &refund, &inconclusive(&refund, detail, &self.config)).await?
            }
            Err(error) => return Err(error),
        };
        done.record_metric();
        Ok(done)
    }

    /// Records `verdict` in one transaction.
    async fn record(
        &self,
        conn: &mut PgConnection,
        refund: &Claimed,
        verdict: &LookupVerdict,
    ) -> anyhow::Result<Polled> {
        let (tenant_id, refund_id) = (refund.tenant_id(), refund.refund_id());
        let mut tx = conn.begin().await.context("cannot start a transaction")?;
        let attempt = refund.lookups.saturating_add(1);
        let done = match verdict {
            LookupVerdict::Settle { settlement, refund: found } => {
                let (reason, outcome) = match settlement {
                    RefundSettlement::Succeeded { .. } => {
                        ("the provider holds a succeeded refund under the refund's key", Polled::Refunded)
                    }
                    RefundSettlement::Failed { .. } => {
                        ("the provider holds a failed refund under the refund's key", Polled::Failed)
                    }
                };
                let evidence = evidence("poll", json!({"attempt": attempt, "refund": found}));
                let settled = unknown::settle(&mut tx, tenant_id, refund_id, settlement, why(reason), evidence)
                    .await
                    .context("cannot settle the refund")?;
                moved_or_lost(&settled, outcome)
            }
            LookupVerdict::Mismatch { detail, refunds } => {
                let evidence = evidence("poll", json!({"attempt": attempt, "refunds": refunds}));
                let applied = unknown::mismatch(&mut tx, tenant_id, refund_id, why(detail), evidence)
                    .await
                    .context("cannot dead-letter the refund")?;
                moved_or_lost(&applied, Polled::DeadLettered)
            }
            LookupVerdict::Resend => {
                let evidence = evidence("poll", json!({"attempt": attempt, "result": "no_refund_in_key_window"}));
                let reason = "the provider holds no refund under the refund's key and still remembers the key";
                let applied = unknown::resend(&mut tx, tenant_id, refund_id, why(reason), evidence)
                    .await
                    .context("cannot queue the refund for a resend")?;
                moved_or_lost(&applied, Polled::Resent)
            }
            LookupVerdict::NotMade => {
                let evidence = evidence("poll", json!({"attempt": attempt, "result": "no_refund_past_key_window"}));
                let reason = "the provider holds no refund under the refund's key, and its key window has passed";
                let settlement = RefundSettlement::Failed {
                    code: NOT_MADE.to_owned(),
                    message: "The provider holds no refund under this refund's key: no money went back.".to_owned(),
                    provider_refund_id: None,
                };
                let settled = unknown::settle(&mut tx, tenant_id, refund_id, &settlement, why(reason), evidence)
                    .await
                    .context("cannot settle the refund")?;
                moved_or_lost(&settled, Polled::NotMade)
            }
            LookupVerdict::Inconclusive { detail } => {
                let wait = self.config.backoff.delay(attempt.unsigned_abs(), &mut rand::rng());
                tracing::info!(detail, wait_ms = wait.as_millis(), "a refund lookup was inconclusive");
                let counted = unknown::note_inconclusive(&mut tx, tenant_id, refund_id, wait)
                    .await
                    .context("cannot record the refund lookup")?;
                if counted { Polled::Inconclusive } else { Polled::LostRace }
            }
            LookupVerdict::Exhaust { detail } => {
                let evidence = evidence("poll", json!({"attempt": attempt, "result": detail}));
                let reason =
                    format!("no conclusive response from the provider after {attempt} lookups over {}", age(refund));
                let applied = unknown::exhaust(&mut tx, tenant_id, refund_id, why(&reason), evidence)
                    .await
                    .context("cannot dead-letter the refund")?;
                moved_or_lost(&applied, Polled::DeadLettered)
            }
        };
        tx.commit().await.context("cannot commit the refund lookup's outcome")?;
        Ok(done)
    }
}

/// How long `refund` has been `unknown`, for people.
fn age(refund: &Claimed) -> String {
    render::age(time::Duration::try_from(refund.age).unwrap_or(time::Duration::MAX))
}

fn why(reason: &str) -> Why<'_> {
    Why { actor: ACTOR, reason }
}

fn moved_or_lost<T>(recorded: &Recorded<T>, moved: Polled) -> Polled {
    match recorded {
        Recorded::Moved(_) => moved,
        Recorded::LostRace => Polled::LostRace,
    }
}

/// What recording one lookup did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polled {
    Refunded,
    Failed,
    NotMade,
    Resent,
    Inconclusive,
    DeadLettered,
    LostRace,
}

impl Polled {
    fn count(self, counts: &mut Counts) {
        match self {
            Self::Refunded => counts.refunded += 1,
            Self::Failed => counts.failed += 1,
            Self::NotMade => counts.not_made += 1,
            Self::Resent => counts.resent += 1,
            Self::Inconclusive => counts.inconclusive += 1,
            Self::DeadLettered => counts.dead_lettered += 1,
            Self::LostRace => counts.lost_race += 1,
        }
    }

    const fn label(self) -> &'static str {
        match self {
            Self::Refunded => "refunded",
            Self::Failed => "failed",
            Self::NotMade => "not_made",
            Self::Resent => "resent",
            Self::Inconclusive => "inconclusive",
            Self::DeadLettered => "dead_lettered",
            Self::LostRace => "lost_race",
        }
    }

    fn record_metric(self) {
        let how = match self {
            Self::Refunded => "poll_refunded",
            Self::Failed => "poll_failed",
            Self::NotMade => "poll_not_made",
            Self::Resent => "resend",
            Self::DeadLettered => "dead_lettered",
            Self::Inconclusive | Self::LostRace => return,
        };
        metrics::counter!(crate::metrics::UNKNOWN_REFUNDS_RESOLVED, "how" => how).increment(1);
    }
}

/// Decides what a lookup means. Pure.
fn decide(refund: &Claimed, lookup: &Result<Vec<ProviderRefund>, LookupError>, config: &PollerConfig) -> LookupVerdict {
    let detail = match lookup {
        Ok(listed) => {
            // Another account's refunds say nothing about this refund, whatever they name.
            let found: Vec<ProviderRefund> =
                listed.iter().filter(|listed| settling::same_account(&refund.asked, listed)).cloned().collect();
            let others = listed.len() - found.len();
            match found.as_slice() {
                [] if others > 0 => format!(
                    "the provider listed {others} refund(s) of another provider account and none of the payment's \
                     account: that proves nothing"
                ),
                [] if refund.in_key_window => return LookupVerdict::Resend,
                [] if refund.age >= config.key_window.window => return LookupVerdict::NotMade,
                [] => format!(
                    "no refund under the key yet, and a send may still land: unknown for {}, less than the key window",
                    age(refund),
                ),
                [one] => match settling::judge(&refund.asked, one) {
                    Finding::Settles(settlement) => {
                        return LookupVerdict::Settle { settlement, refund: Box::new(one.clone()) };
                    }
                    Finding::NotAsAsked(detail) => {
                        return LookupVerdict::Mismatch { detail, refunds: found.clone() };
                    }
                    Finding::Unfinished => format!("the provider has not finished refund {}", one.id),
                },
                many => {
                    let ids: Vec<&str> = many.iter().map(|r| r.id.as_str()).collect();
                    let detail = format!(
                        "The provider holds {} refunds under the refund's key ({}): a key names one refund.",
                        many.len(),
                        ids.join(", "),
                    );
                    return LookupVerdict::Mismatch { detail, refunds: found.clone() };
                }
            }
        }
        Err(error) => format!("lookup failed: {error}"),
    };
    inconclusive(refund, detail, config)
}

/// An inconclusive lookup (`detail` says why): given up past the limits, else looked up again later.
fn inconclusive(refund: &Claimed, detail: String, config: &PollerConfig) -> LookupVerdict {
    let attempts = u32::try_from(refund.lookups).unwrap_or(0).saturating_add(1);
    if attempts >= config.max_attempts || refund.age >= config.max_age {
        LookupVerdict::Exhaust { detail }
    } else {
        LookupVerdict::Inconclusive { detail }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
    use oncepay_domain::money::{Amount, Currency};
    use oncepay_provider::{KeyWindow, RefundState, fixtures};
    use oncepay_service::backoff::Backoff;
    use oncepay_store::refunds::settling::AskedRefund;

    use super::*;

    fn config() -> PollerConfig {
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

    fn claimed(lookups: i32, age_secs: u64, in_key_window: bool) -> Claimed {
        Claimed {
            payment_id: PaymentId::generate(),
            asked: AskedRefund {
                tenant_id: TenantId::generate(),
                refund_id: RefundId::generate(),
                charge_id: "ch_1".to_owned(),
                account: None,
                amount: Amount::new(100).unwrap(),
                currency: Currency::parse("EUR").unwrap(),
            },
            lookups,
            age: Duration::from_secs(age_secs),
            in_key_window,
        }
    }

    fn refund(claimed: &Claimed, id: &str, status: RefundState) -> ProviderRefund {
        fixtures::refund(claimed.refund_id(), id, "ch_1", status, 100)
    }

    fn label(verdict: &LookupVerdict) -> &'static str {
        match verdict {
            LookupVerdict::Settle { settlement: RefundSettlement::Succeeded { .. }, .. } => "refunded",
            LookupVerdict::Settle { .. } => "failed",
            LookupVerdict::Mismatch { .. } => "mismatch",
            LookupVerdict::Resend => "resend",
            LookupVerdict::NotMade => "not_made",
            LookupVerdict::Inconclusive { .. } => "inconclusive",
            LookupVerdict::Exhaust { .. } => "exhaust",
        }
    }

    #[test]
    fn each_lookup_result_gets_the_right_verdict() {
        let ok = |refunds: Vec<ProviderRefund>| -> Result<Vec<ProviderRefund>, LookupError> { Ok(refunds) };
        let failed = || -> Result<Vec<ProviderRefund>, LookupError> { Err(LookupError::Status(503)) };
        let fresh = claimed(0, 10, true);
        let old = claimed(0, 10, false);
        let long_unknown = claimed(0, 86_400, false);
        let last_try = claimed(4, 10, false);
        let too_old = claimed(0, 3600, true);
        let found = |c: &Claimed, status| ok(vec![refund(c, "re_1", status)]);
        let elsewhere = |refund: ProviderRefund| ProviderRefund { account: Some("acct_other".into()), ..refund };
        let cases = [
            ("refunded", &fresh, found(&fresh, RefundState::Succeeded), "refunded"),
            ("failed", &fresh, found(&fresh, RefundState::Failed), "failed"),
            ("canceled", &fresh, found(&fresh, RefundState::Canceled), "failed"),
            ("refunded, past the window", &old, found(&old, RefundState::Succeeded), "refunded"),
            ("found even on the last attempt", &last_try, found(&last_try, RefundState::Succeeded), "refunded"),
            ("unfinished", &fresh, found(&fresh, RefundState::Pending), "inconclusive"),
            ("unfinished, attempts spent", &last_try, found(&last_try, RefundState::Pending), "exhaust"),
            ("unfinished, too old", &too_old, found(&too_old, RefundState::Pending), "exhaust"),
            (
                "another amount",
                &fresh,
                ok(vec![ProviderRefund { amount: 90, ..refund(&fresh, "re_1", RefundState::Succeeded) }]),
                "mismatch",
            ),
            (
                "another charge",
                &fresh,
                ok(vec![ProviderRefund { charge: "ch_2".into(), ..refund(&fresh, "re_1", RefundState::Succeeded) }]),
                "mismatch",
            ),
            (
                "two refunds under one key",
                &fresh,
                ok(vec![refund(&fresh, "re_1", RefundState::Failed), refund(&fresh, "re_2", RefundState::Succeeded)]),
                "mismatch",
            ),
            ("nothing, inside the window", &fresh, ok(vec![]), "resend"),
            ("nothing, past the window, a send maybe still landing", &old, ok(vec![]), "inconclusive"),
            ("nothing, past the window, attempts spent", &last_try, ok(vec![]), "exhaust"),
            ("nothing, unknown for the whole key window", &long_unknown, ok(vec![]), "not_made"),
            ("lookup failed", &fresh, failed(), "inconclusive"),
            ("lookup failed, attempts spent", &last_try, failed(), "exhaust"),
            ("lookup failed, too old", &too_old, failed(), "exhaust"),
            (
                "only another account's refund",
                &fresh,
                ok(vec![elsewhere(refund(&fresh, "re_1", RefundState::Succeeded))]),
                "inconclusive",
            ),
            (
                "another account's refund beside the refund's own",
                &fresh,
                ok(vec![
                    elsewhere(refund(&fresh, "re_9", RefundState::Failed)),
                    refund(&fresh, "re_1", RefundState::Succeeded),
                ]),
                "refunded",
            ),
        ];
        for (name, claimed, lookup, expected) in cases {
            assert_eq!(label(&decide(claimed, &lookup, &config())), expected, "{name}");
        }
    }

    #[test]
    fn a_refund_found_succeeded_settles_with_the_providers_refund() {
        let fresh = claimed(0, 10, true);
        let found = refund(&fresh, "re_1", RefundState::Succeeded);

        let verdict = decide(&fresh, &Ok(vec![found.clone()]), &config());

        let LookupVerdict::Settle { settlement: RefundSettlement::Succeeded { provider_refund_id, .. }, refund } =
            verdict
        else {
            panic!("not settled: {verdict:?}");
        };
        assert_eq!((provider_refund_id.as_str(), *refund), ("re_1", found));
    }
}
