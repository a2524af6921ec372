//! The poller: settles `unknown` payments by asking the provider what it holds for their downstream
//! idempotency key.
//!
//! A lookup runs outside any transaction; its verdict is recorded in one short transaction per
//! payment. The poller never moves a payment that is not `unknown`. A webhook may settle a payment
//! while its lookup is in flight: the poller's compare-and-set then loses, which is a normal outcome.
//!
//! A consistent lookup that finds no charge proves that none was made so far, not that none will
//! be: a send whose answer was lost may still reach the provider. Inside the key window that is
//! harmless for a payment the poller sends again, since the provider answers a resend with the
//! first send's result. It is not for a payment whose resend the provider refused after an earlier
//! send may have charged (`refused_after_possible_charge`): another resend would be refused again,
//! and failing it would report "no charge" while the earlier send may still land. So for such a
//! payment an empty lookup is inconclusive, as for refunds (`crate::refunds::poller`); inside the
//! key window no send is old enough to be sure, and past it the lookup by key proves nothing, so it
//! goes to an operator when the lookups or the time run out, with the refusal in the evidence.
//!
//! A charge held by another provider account than the payment's is another merchant's: a lookup
//! that lists one is judged as if it did not, and the charge is only counted and logged.

use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use oncepay_domain::status::Transition;
use oncepay_provider::{Charge, ChargeStatus, KeyWindow, LookupError, PaymentProvider};
use oncepay_service::backoff::Backoff;
use oncepay_service::telemetry;
use oncepay_store as store;
use oncepay_store::settlement::{self, Unsettled};
use oncepay_store::transitions::{Recorded, Settlement};
use serde_json::json;
use sqlx::{Acquire, PgPool};
use tracing::Instrument;

use crate::unknown::{self, Claimed, Why};
use oncepay_ops::render;
use oncepay_service::runner::Pass;
use oncepay_store::webhook_events;

const ACTOR: &str = "reconciler:poller";

/// The poller's limits.
#[derive(Debug, Clone)]
pub struct PollerConfig {
    /// Pause after a pass that found nothing due.
    pub interval: Duration,
    /// Payments claimed per pass.
    pub batch_size: u32,
    /// Lookups in flight at once.
    pub concurrency: usize,
    /// How long a claimed payment stays hidden from other pollers.
    pub lease: Duration,
    /// Wait between inconclusive lookups of one payment.
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
    /// Payments claimed.
    pub claimed: u64,
    /// Settled `succeeded` from a found charge.
    pub charged: u64,
    /// Settled `failed` from a found charge.
    pub declined: u64,
    /// Sent back to `pending` for a resend with the same key.
    pub resent: u64,
    /// Looked up without a conclusion; to be looked up again.
    pub inconclusive: u64,
    /// Given up on: dead-lettered.
    pub dead_lettered: u64,
    /// Moved by someone else (a webhook) while being looked up.
    pub lost_race: u64,
}

/// What a lookup means for one payment.
#[derive(Debug, Clone, PartialEq)]
enum LookupVerdict {
    /// A succeeded or failed charge: settled exactly as the worker would have settled it.
    Settle { transition: Transition, settlement: Settlement, charge: Box<Charge> },
    /// A charge that is not what the payment asked for: dead-lettered as a `conflict`.
    Mismatch { detail: String, charge: Box<Charge> },
    /// Provably no charge while the provider still remembers the key (the first send is younger than
    /// the key window minus a margin): back to `pending` and into the outbox, resent with the same key.
    Resend,
    /// Anything else: a failed lookup; no charge past the key window, which proves nothing once the
    /// provider may have forgotten the key; no charge so far for a payment whose resend the provider
    /// refused, while an earlier send may still land; or only charges of another provider account.
    /// The evidence is kept and the next lookup is scheduled with per-payment exponential backoff.
    Inconclusive { detail: String },
    /// After `max_attempts` inconclusive lookups, or once the payment has been `unknown` for
    /// `max_age`: dead-lettered with all the evidence, for an operator.
    Exhaust { detail: String },
}

/// The poller loop.
pub struct Poller<P> {
    pool: PgPool,
    provider: P,
    config: PollerConfig,
}

/// A pass that claimed something may have left more due payments behind it.
impl<P: PaymentProvider> Pass for Poller<P> {
    const NAME: &'static str = "poller";

    fn interval(&self) -> Duration {
        self.config.interval
    }

    async fn pass(&self) -> anyhow::Result<bool> {
        Ok(self.run_once().await?.claimed > 0)
    }
}

impl<P: PaymentProvider> Poller<P> {
    /// A poller over `pool`, asking `provider`.
    pub fn new(pool: PgPool, provider: P, config: PollerConfig) -> Self {
        Self { pool, provider, config }
    }

    /// One pass: claims due payments, looks each up, records each verdict.
    pub async fn run_once(&self) -> anyhow::Result<Counts> {
        let claimed = {
            let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
            let horizon = self.config.key_window.resend_horizon();
            unknown::claim_due(&mut conn, self.config.batch_size, self.config.lease, horizon)
                .await
                .context("cannot claim due unknown payments")?
        };
        let counts = Counts { claimed: claimed.len() as u64, ..Counts::default() };
        let polls = claimed.into_iter().map(|payment| self.poll_one(payment));
        poll_all(polls, self.config.concurrency, counts, Polled::count).await
    }

    /// Looks one payment up and records the verdict, in a `poller.poll` span that continues the
    /// payment's trace (the one the worker or the sweeper stored with the queue row). The provider
    /// lookup then carries that trace's `traceparent`, and the resolution appears in the same trace as
    /// the request and the send.
    async fn poll_one(&self, payment: Claimed) -> anyhow::Result<Polled> {
        let span = tracing::info_span!(
            "poller.poll",
            payment.id = %payment.payment_id,
            tenant.id = %payment.tenant_id,
            poll.attempt = payment.poll_attempts.saturating_add(1),
            poll.outcome = tracing::field::Empty,
        );
        if let Some(trace) = &payment.trace {
            telemetry::continue_trace(&span, trace);
        }
        let done = self.look_up_and_record(payment).instrument(span.clone()).await;
        if let Ok(done) = &done {
            span.record("poll.outcome", done.label());
        }
        done
    }

    async fn look_up_and_record(&self, payment: Claimed) -> anyhow::Result<Polled> {
        let (source, verdict) = self.look_up(&payment).await?;
        let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
        let done = match self.record(&mut conn, &payment, source, &verdict).await {
            Ok(done) => done,
            // The database refused what the verdict would write (a constraint, a value it cannot
            // hold). That is evidence about this payment, not a failure of the pass: it counts
            // toward dead-lettering, so the payment cannot stay `unknown` for ever.
            Err(error) if !unavailable(&error) => {
                let detail = format!("the verdict could not be recorded: {error:#}");
                tracing::warn!(error = %detail, "recording a poll failed; counted as inconclusive");
                self.record(&mut conn, &payment, source, &self.inconclusive(&payment, detail)).await?
            }
            Err(error) => return Err(error),
        };
        done.record_metric();
        Ok(done)
    }

    /// What the payment's evidence says: signed webhooks recorded while it was being sent, if they
    /// settle it or contradict it (such a charge counts as found, without asking the provider), else a
    /// lookup of its key at the provider (no connection held).
    async fn look_up(&self, payment: &Claimed) -> anyhow::Result<(Source, LookupVerdict)> {
        let recorded = {
            let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
            webhook_events::recorded_charges(&mut conn, payment.tenant_id, payment.payment_id)
                .await
                .context("cannot read the payment's recorded webhooks")?
        };
        if !recorded.is_empty() {
            let verdict = decide(payment, &Ok(recorded), &self.config);
            if matches!(verdict, LookupVerdict::Settle { .. } | LookupVerdict::Mismatch { .. }) {
                return Ok((Source::RecordedWebhook, verdict));
            }
        }
        let lookup =
            self.provider.find_by_key(&payment.payment_id.downstream_key(), payment.asked.account.as_ref()).await;
        if let Ok(charges) = &lookup {
            for charge in of_other_accounts(payment, charges) {
                let why = format!(
                    "a lookup of payment {} listed charge {} of account {}",
                    payment.payment_id,
                    charge.id,
                    charge.account.as_deref().unwrap_or("(oncepay's own)")
                );
                crate::metrics::other_account("lookup", "charge", &why);
            }
        }
        Ok((Source::Provider, decide(payment, &lookup, &self.config)))
    }

    fn inconclusive(&self, payment: &Claimed, detail: String) -> LookupVerdict {
        let attempts = u32::try_from(payment.poll_attempts).unwrap_or(0).saturating_add(1);
        give_up_or_wait(payment, attempts, detail, &self.config)
    }

    /// Records `verdict` in one transaction.
    async fn record(
        &self,
        conn: &mut sqlx::PgConnection,
        payment: &Claimed,
        source: Source,
        verdict: &LookupVerdict,
    ) -> anyhow::Result<Polled> {
        let (tenant_id, payment_id) = (payment.tenant_id, payment.payment_id);
        let mut tx = conn.begin().await.context("cannot start a transaction")?;
        let attempt = payment.poll_attempts + 1;
        let done = match verdict {
            LookupVerdict::Settle { transition, settlement, charge } => {
                let reason = match (source, transition) {
                    (Source::Provider, Transition::Charged) => {
                        "the provider holds a succeeded charge for the payment's key"
                    }
                    (Source::Provider, _) => "the provider holds a declined charge for the payment's key",
                    (Source::RecordedWebhook, Transition::Charged) => {
                        "a signed webhook received while it was being sent reported the charge succeeded"
                    }
                    (Source::RecordedWebhook, _) => {
                        "a signed webhook received while it was being sent reported the charge declined"
                    }
                };
                let evidence = unknown::evidence(source.label(), json!({"attempt": attempt, "charge": charge}));
                let applied =
                    unknown::settle(&mut tx, tenant_id, payment_id, *transition, settlement, why(reason), evidence)
                        .await
                        .context("cannot settle the payment")?;
                match (applied, transition) {
                    (Recorded::LostRace, _) => Polled::LostRace,
                    (Recorded::Moved(_), Transition::Charged) => Polled::Charged,
                    (Recorded::Moved(_), _) => Polled::Declined,
                }
            }
            LookupVerdict::Mismatch { detail, charge } => {
                let evidence = unknown::evidence(source.label(), json!({"attempt": attempt, "charge": charge}));
                match unknown::mismatch(&mut tx, tenant_id, payment_id, why(detail), evidence)
                    .await
                    .context("cannot dead-letter the payment")?
                {
                    Recorded::Moved(_) => Polled::DeadLettered,
                    Recorded::LostRace => Polled::LostRace,
                }
            }
            LookupVerdict::Resend => {
                let evidence =
                    unknown::evidence("poll", json!({"attempt": attempt, "result": "no_charge_in_key_window"}));
                let reason = "the provider holds no charge for the payment's key and still remembers the key";
                match unknown::resend(&mut tx, tenant_id, payment_id, why(reason), evidence)
                    .await
                    .context("cannot queue the payment for a resend")?
                {
                    Recorded::Moved(_) => Polled::Resent,
                    Recorded::LostRace => Polled::LostRace,
                }
            }
            LookupVerdict::Inconclusive { detail } => {
                let evidence = unknown::evidence("poll", json!({"attempt": attempt, "result": detail}));
                let wait = self.config.backoff.delay(u32::try_from(attempt).unwrap_or(u32::MAX), &mut rand::rng());
                unknown::note_inconclusive(&mut tx, tenant_id, payment_id, evidence, Some(wait))
                    .await
                    .context("cannot record the lookup")?;
                Polled::Inconclusive
            }
            LookupVerdict::Exhaust { detail } => {
                let evidence = unknown::evidence("poll", json!({"attempt": attempt, "result": detail}));
                let reason = format!(
                    "no conclusive response from the provider after {attempt} lookups over {}",
                    render::age(time::Duration::try_from(payment.age).unwrap_or(time::Duration::MAX)),
                );
                match unknown::exhaust(&mut tx, tenant_id, payment_id, why(&reason), evidence)
                    .await
                    .context("cannot dead-letter the payment")?
                {
                    Recorded::Moved(_) => Polled::DeadLettered,
                    Recorded::LostRace => Polled::LostRace,
                }
            }
        };
        tx.commit().await.context("cannot commit the poll's outcome")?;
        Ok(done)
    }
}

/// Whether `error` comes from a database that could not be reached, rather than one that refused
/// what it was asked to write.
pub(crate) fn unavailable(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.downcast_ref::<sqlx::Error>().is_some_and(store::is_transient))
}

/// Where a poll's evidence came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A lookup by the payment's key.
    Provider,
    /// Webhooks recorded while the payment was being sent.
    RecordedWebhook,
}

impl Source {
    const fn label(self) -> &'static str {
        match self {
            Self::Provider => "poll",
            Self::RecordedWebhook => "webhook_recorded",
        }
    }
}

fn why(reason: &str) -> Why<'_> {
    Why { actor: ACTOR, reason }
}

/// What recording one poll did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polled {
    Charged,
    Declined,
    Resent,
    Inconclusive,
    DeadLettered,
    LostRace,
}

/// Runs `polls`, at most `concurrency` at once, and adds what each recorded to `counts`. A poll
/// whose outcome was not recorded keeps its lease, and its payment or refund is looked up again
/// once the lease expires: the error says how many of the pass's polls that happened to.
pub(crate) async fn poll_all<C, D>(
    polls: impl Iterator<Item = impl Future<Output = anyhow::Result<D>>>,
    concurrency: usize,
    mut counts: C,
    count: impl Fn(D, &mut C),
) -> anyhow::Result<C> {
    let mut polls = futures::stream::iter(polls).buffer_unordered(concurrency);
    let (mut done, mut failures, mut last_error) = (0, 0, None);
    while let Some(polled) = polls.next().await {
        done += 1;
        match polled {
            Ok(polled) => count(polled, &mut counts),
            Err(error) => {
                failures += 1;
                last_error = Some(error);
            }
        }
    }
    match last_error {
        Some(error) => Err(error.context(format!("{failures} of {done} polls could not be recorded"))),
        None => Ok(counts),
    }
}

impl Polled {
    fn count(self, counts: &mut Counts) {
        match self {
            Self::Charged => counts.charged += 1,
            Self::Declined => counts.declined += 1,
            Self::Resent => counts.resent += 1,
            Self::Inconclusive => counts.inconclusive += 1,
            Self::DeadLettered => counts.dead_lettered += 1,
            Self::LostRace => counts.lost_race += 1,
        }
    }

    const fn label(self) -> &'static str {
        match self {
            Self::Charged => "charged",
            Self::Declined => "declined",
            Self::Resent => "resent",
            Self::Inconclusive => "inconclusive",
            Self::DeadLettered => "dead_lettered",
            Self::LostRace => "lost_race",
        }
    }

    fn record_metric(self) {
        let how = match self {
            Self::Charged => "poll_charged",
            Self::Declined => "poll_declined",
            Self::Resent => "resend",
            Self::DeadLettered => "dead_lettered",
            Self::Inconclusive | Self::LostRace => return,
        };
        metrics::counter!(crate::metrics::UNKNOWN_RESOLVED, "how" => how).increment(1);
    }
}

/// The charges of `charges` held by another provider account than the payment's.
fn of_other_accounts<'c>(payment: &Claimed, charges: &'c [Charge]) -> impl Iterator<Item = &'c Charge> {
    charges.iter().filter(|charge| !settlement::same_account(&payment.asked, charge))
}

/// Decides what a lookup means. Pure.
fn decide(payment: &Claimed, lookup: &Result<Vec<Charge>, LookupError>, config: &PollerConfig) -> LookupVerdict {
    let detail = match lookup {
        Ok(listed) => {
            // Another account's charges say nothing about this payment, whatever they name.
            let charges: Vec<&Charge> =
                listed.iter().filter(|charge| settlement::same_account(&payment.asked, charge)).collect();
            let others = listed.len() - charges.len();
            // One key normally has at most one charge; a success anywhere means money moved.
            let found = charges
                .iter()
                .find(|c| c.status == ChargeStatus::Succeeded)
                .or_else(|| charges.iter().find(|c| c.status == ChargeStatus::Failed))
                .copied();
            if let Some(charge) = found {
                match settlement::settlement_of(&payment.asked, charge) {
                    Ok(settled) => {
                        let transition = settlement::transition_of(&settled);
                        return LookupVerdict::Settle {
                            transition,
                            settlement: settled,
                            charge: Box::new(charge.clone()),
                        };
                    }
                    Err(Unsettled::Mismatch(detail)) => {
                        return LookupVerdict::Mismatch { detail, charge: Box::new(charge.clone()) };
                    }
                    Err(Unsettled::Unbookable(detail)) => detail,
                }
            } else if others > 0 {
                format!(
                    "the provider listed {others} charge(s) of another provider account and none of the payment's \
                     account: that proves nothing"
                )
            } else if payment.in_key_window {
                match &payment.refusal {
                    // A resend with the same key is answered with the first send's result, whether
                    // or not that send has landed yet.
                    None => return LookupVerdict::Resend,
                    // Another resend would be refused again, and an earlier send may still land.
                    Some(refusal) => format!(
                        "no charge for the key so far, but the provider refused the last resend ({}: {}) and an \
                         earlier send may still land: that proves nothing yet",
                        refusal.code, refusal.message
                    ),
                }
            } else {
                "no charge for the key, but the provider's key window has passed: that proves nothing".to_owned()
            }
        }
        Err(error) => format!("lookup failed: {error}"),
    };
    let attempts = u32::try_from(payment.poll_attempts).unwrap_or(0).saturating_add(1);
    give_up_or_wait(payment, attempts, detail, config)
}

/// An inconclusive lookup (`detail` says why) on the `attempts`-th lookup: given up past the limits, else looked up
/// again later.
fn give_up_or_wait(payment: &Claimed, attempts: u32, detail: String, config: &PollerConfig) -> LookupVerdict {
    if attempts >= config.max_attempts || payment.age >= config.max_age {
        LookupVerdict::Exhaust { detail }
    } else {
        LookupVerdict::Inconclusive { detail }
    }
}

#[cfg(test)]
mod tests {
    use oncepay_domain::ids::{PaymentId, TenantId};
    use oncepay_domain::money::{Amount, Currency};
    use oncepay_provider::fixtures;
    use oncepay_store::settlement::Asked;
    use oncepay_store::unknown_queue::Refusal;

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

    fn claimed(poll_attempts: i32, age_secs: u64, in_key_window: bool) -> Claimed {
        let payment_id = PaymentId::generate();
        Claimed {
            tenant_id: TenantId::generate(),
            payment_id,
            asked: Asked {
                payment_id,
                account: None,
                amount: Amount::new(100).unwrap(),
                currency: Currency::parse("EUR").unwrap(),
            },
            poll_attempts,
            age: Duration::from_secs(age_secs),
            in_key_window,
            trace: None,
            refusal: None,
        }
    }

    /// A payment whose resend the provider refused, when an earlier send may have charged.
    fn refused(in_key_window: bool) -> Claimed {
        let refusal = Refusal { code: "provider_rejected".into(), message: "refused".into() };
        Claimed { refusal: Some(refusal), ..claimed(0, 10, in_key_window) }
    }

    fn charge(payment: &Claimed, id: &str, status: ChargeStatus) -> Charge {
        fixtures::charge(payment.payment_id, id, status, 100)
    }

    fn label(verdict: &LookupVerdict) -> &'static str {
        match verdict {
            LookupVerdict::Settle { transition: Transition::Charged, .. } => "charged",
            LookupVerdict::Settle { .. } => "declined",
            LookupVerdict::Mismatch { .. } => "mismatch",
            LookupVerdict::Resend => "resend",
            LookupVerdict::Inconclusive { .. } => "inconclusive",
            LookupVerdict::Exhaust { .. } => "exhaust",
        }
    }

    #[test]
    fn each_lookup_result_gets_the_right_verdict() {
        let ok = |charges: Vec<Charge>| -> Result<Vec<Charge>, LookupError> { Ok(charges) };
        let failed = || -> Result<Vec<Charge>, LookupError> { Err(LookupError::Status(503)) };
        let fresh = claimed(0, 10, true);
        let last_try = claimed(4, 10, false);
        let (refused_fresh, refused_old) = (refused(true), refused(false));
        let found = |payment: &Claimed, status| ok(vec![charge(payment, "ch_1", status)]);
        let elsewhere = |charge: Charge| Charge { account: Some("acct_other".into()), ..charge };
        let cases = [
            ("charged", &fresh, found(&fresh, ChargeStatus::Succeeded), "charged"),
            ("declined", &fresh, found(&fresh, ChargeStatus::Failed), "declined"),
            (
                "a success beats a failure",
                &fresh,
                ok(vec![charge(&fresh, "ch_1", ChargeStatus::Failed), charge(&fresh, "ch_2", ChargeStatus::Succeeded)]),
                "charged",
            ),
            ("found even on the last attempt", &last_try, found(&last_try, ChargeStatus::Succeeded), "charged"),
            (
                "another amount",
                &fresh,
                ok(vec![Charge { amount: 90, ..charge(&fresh, "ch_1", ChargeStatus::Succeeded) }]),
                "mismatch",
            ),
            (
                "a charge that cannot be booked",
                &fresh,
                ok(vec![Charge { amount: 0, ..charge(&fresh, "ch_1", ChargeStatus::Succeeded) }]),
                "inconclusive",
            ),
            (
                "a charge that cannot be booked, attempts spent",
                &last_try,
                ok(vec![Charge { currency: "eur".into(), ..charge(&last_try, "ch_1", ChargeStatus::Succeeded) }]),
                "exhaust",
            ),
            ("nothing, inside the window", &fresh, ok(vec![]), "resend"),
            ("nothing, past the window", &claimed(0, 10, false), ok(vec![]), "inconclusive"),
            ("lookup failed", &fresh, failed(), "inconclusive"),
            ("lookup failed, attempts spent", &claimed(4, 10, true), failed(), "exhaust"),
            ("nothing past the window, too old", &claimed(0, 3600, false), ok(vec![]), "exhaust"),
            (
                "refused resend, nothing inside the window, a send maybe still landing",
                &refused_fresh,
                ok(vec![]),
                "inconclusive",
            ),
            (
                "refused resend, nothing inside the window, attempts spent",
                &Claimed { poll_attempts: 4, ..refused(true) },
                ok(vec![]),
                "exhaust",
            ),
            (
                "refused resend, charged after all",
                &refused_fresh,
                found(&refused_fresh, ChargeStatus::Succeeded),
                "charged",
            ),
            ("refused resend, nothing past the window", &refused_old, ok(vec![]), "inconclusive"),
            ("refused resend, lookup failed", &refused_fresh, failed(), "inconclusive"),
            (
                "only another account's charge",
                &fresh,
                ok(vec![elsewhere(charge(&fresh, "ch_1", ChargeStatus::Succeeded))]),
                "inconclusive",
            ),
            (
                "another account's success beside the payment's decline",
                &fresh,
                ok(vec![
                    elsewhere(charge(&fresh, "ch_9", ChargeStatus::Succeeded)),
                    charge(&fresh, "ch_1", ChargeStatus::Failed),
                ]),
                "declined",
            ),
        ];
        for (name, payment, lookup, expected) in cases {
            assert_eq!(label(&decide(payment, &lookup, &config())), expected, "{name}");
        }
    }
}
