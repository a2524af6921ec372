//! What a lookup means for an `unknown` payment: the charges the provider holds for its downstream
//! idempotency key, or the signed webhooks recorded while it was being sent.
//!
//! A consistent lookup that finds no charge proves that none was made so far, not that none will
//! be: a send whose answer was lost may still reach the provider. Inside the key window that is
//! harmless for a payment the poller sends again, since the provider answers a resend with the
//! first send's result. It is not for a payment whose resend the provider refused after an earlier
//! send may have charged (`refused_after_possible_charge`): another resend would be refused again,
//! and failing it would report "no charge" while the earlier send may still land. So for such a
//! payment an empty lookup is inconclusive, as for refunds ([`super::refunds`]); inside the key
//! window no send is old enough to be sure, and past it the lookup by key proves nothing, so it
//! goes to an operator when the lookups or the time run out, with the refusal in the evidence.
//!
//! A charge held by another provider account than the payment's is another merchant's: a lookup
//! that lists one is judged as if it did not, and the charge is only counted and logged.

use std::time::Duration;

use anyhow::Context;
use oncepay_domain::status::Transition;
use oncepay_provider::{Charge, ChargeStatus, LookupError, PaymentProvider};
use oncepay_service::telemetry;
use oncepay_store::StoreError;
use oncepay_store::settlement::{self, Unsettled};
use oncepay_store::transitions::{Recorded, Settlement, TransitionError};
use oncepay_store::webhook_events;
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use tracing::Span;

use super::{Poller, PollerConfig, Settled, Subject, Verdict};
use crate::unknown::Why;
use crate::unknown::payments::{self as unknown, Claimed};

/// The poller of `unknown` payments.
pub type PaymentPoller<P> = Poller<Claimed, P>;

impl Subject for Claimed {
    type Settlement = Settlement;

    const LOOP: &'static str = "poller";
    const NOUN: &'static str = "payment";
    const RESOLVED_METRIC: &'static str = crate::metrics::UNKNOWN_RESOLVED;

    async fn claim_due(
        conn: &mut PgConnection,
        batch_size: u32,
        lease: Duration,
        resend_horizon: Duration,
    ) -> Result<Vec<Self>, StoreError> {
        unknown::claim_due(conn, batch_size, lease, resend_horizon).await
    }

    /// A `poller.poll` span that continues the payment's trace (the one the worker or the sweeper
    /// stored with its queue row): the provider lookup then carries that trace's `traceparent`, and
    /// the resolution appears in the same trace as the request and the send.
    fn span(&self) -> Span {
        let span = tracing::info_span!(
            "poller.poll",
            payment.id = %self.payment_id,
            tenant.id = %self.tenant_id,
            poll.attempt = self.poll_attempts.saturating_add(1),
            poll.outcome = tracing::field::Empty,
        );
        if let Some(trace) = &self.trace {
            telemetry::continue_trace(&span, trace);
        }
        span
    }

    fn lookups(&self) -> u32 {
        u32::try_from(self.poll_attempts).unwrap_or(0)
    }

    fn age(&self) -> Duration {
        self.age
    }

    /// Signed webhooks recorded while the payment was being sent, if they settle it or contradict
    /// it (such a charge counts as found, without asking the provider); else a lookup of its key at
    /// the provider (no connection held).
    async fn look_up<P: PaymentProvider>(
        &self,
        pool: &PgPool,
        provider: &P,
        config: &PollerConfig,
    ) -> anyhow::Result<Verdict<Settlement>> {
        let recorded = {
            let mut conn = pool.acquire().await.context("cannot reach the database")?;
            webhook_events::recorded_charges(&mut conn, self.tenant_id, self.payment_id)
                .await
                .context("cannot read the payment's recorded webhooks")?
        };
        if !recorded.is_empty() {
            let verdict = decide(self, Source::RecordedWebhook, &Ok(recorded), config);
            if matches!(verdict, Verdict::Settle { .. } | Verdict::Mismatch { .. }) {
                return Ok(verdict);
            }
        }
        let lookup = provider.find_by_key(&self.payment_id.downstream_key(), self.asked.account.as_ref()).await;
        if let Ok(charges) = &lookup {
            for charge in charges.iter().filter(|charge| !settlement::same_account(&self.asked, charge)) {
                let why = format!(
                    "a lookup of payment {} listed charge {} of account {}",
                    self.payment_id,
                    charge.id,
                    charge.account.as_deref().unwrap_or("(oncepay's own)")
                );
                crate::metrics::other_account("lookup", "charge", &why);
            }
        }
        Ok(decide(self, Source::Provider, &lookup, config))
    }

    fn names(settled: Settled) -> (&'static str, &'static str) {
        match settled {
            Settled::Succeeded => ("charged", "poll_charged"),
            Settled::Failed => ("declined", "poll_declined"),
            // Never decided for a payment: no lookup proves that a charge will never be made.
            Settled::NotMade => ("not_made", "poll_not_made"),
        }
    }

    async fn settle(
        &self,
        conn: &mut PgConnection,
        settlement: &Settlement,
        why: Why<'_>,
        evidence: Value,
    ) -> Result<bool, TransitionError> {
        let transition = settlement::transition_of(settlement);
        let recorded =
            unknown::settle(conn, self.tenant_id, self.payment_id, transition, settlement, why, evidence).await?;
        Ok(matches!(recorded, Recorded::Moved(_)))
    }

    async fn resend(&self, conn: &mut PgConnection, why: Why<'_>, evidence: Value) -> Result<bool, TransitionError> {
        let recorded = unknown::resend(conn, self.tenant_id, self.payment_id, why, evidence).await?;
        Ok(matches!(recorded, Recorded::Moved(_)))
    }

    async fn exhaust(&self, conn: &mut PgConnection, why: Why<'_>, evidence: Value) -> Result<bool, TransitionError> {
        let recorded = unknown::exhaust(conn, self.tenant_id, self.payment_id, why, evidence).await?;
        Ok(matches!(recorded, Recorded::Moved(_)))
    }

    async fn mismatch(&self, conn: &mut PgConnection, why: Why<'_>, evidence: Value) -> Result<bool, TransitionError> {
        let recorded = unknown::mismatch(conn, self.tenant_id, self.payment_id, why, evidence).await?;
        Ok(matches!(recorded, Recorded::Moved(_)))
    }

    /// The evidence joins the queue row's, and goes into the dead letter if it comes to that.
    async fn note_inconclusive(
        &self,
        conn: &mut PgConnection,
        evidence: Value,
        wait: Duration,
    ) -> Result<bool, StoreError> {
        unknown::note_inconclusive(conn, self.tenant_id, self.payment_id, evidence, Some(wait)).await
    }
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

    /// Why a charge found here settles the payment by `transition`.
    const fn settles_because(self, transition: Transition) -> &'static str {
        match (self, transition) {
            (Self::Provider, Transition::Charged) => "the provider holds a succeeded charge for the payment's key",
            (Self::Provider, _) => "the provider holds a declined charge for the payment's key",
            (Self::RecordedWebhook, Transition::Charged) => {
                "a signed webhook received while it was being sent reported the charge succeeded"
            }
            (Self::RecordedWebhook, _) => {
                "a signed webhook received while it was being sent reported the charge declined"
            }
        }
    }
}

/// Decides what the charges `lookup` found at `source` mean for `payment`. Pure.
fn decide(
    payment: &Claimed,
    source: Source,
    lookup: &Result<Vec<Charge>, LookupError>,
    config: &PollerConfig,
) -> Verdict<Settlement> {
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
                        return Verdict::Settle {
                            settlement: settled,
                            settled: if transition == Transition::Charged {
                                Settled::Succeeded
                            } else {
                                Settled::Failed
                            },
                            reason: source.settles_because(transition).into(),
                            source: source.label(),
                            found: json!({ "charge": charge }),
                        };
                    }
                    Err(Unsettled::Mismatch(detail)) => {
                        return Verdict::Mismatch {
                            detail,
                            source: source.label(),
                            found: json!({ "charge": charge }),
                        };
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
                    None => {
                        return Verdict::Resend {
                            reason: "the provider holds no charge for the payment's key and still remembers the key",
                            result: "no_charge_in_key_window",
                        };
                    }
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
    Verdict::inconclusive(payment, detail, config)
}

#[cfg(test)]
mod tests {
    use oncepay_domain::ids::{PaymentId, TenantId};
    use oncepay_domain::money::{Amount, Currency};
    use oncepay_provider::fixtures;
    use oncepay_store::settlement::Asked;
    use oncepay_store::unknown_queue::Refusal;

    use super::*;
    use crate::poller::tests::config;

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

    fn label(verdict: &Verdict<Settlement>) -> &'static str {
        match verdict {
            Verdict::Settle { settled: Settled::Succeeded, .. } => "charged",
            Verdict::Settle { .. } => "declined",
            Verdict::Mismatch { .. } => "mismatch",
            Verdict::Resend { .. } => "resend",
            Verdict::Inconclusive { .. } => "inconclusive",
            Verdict::Exhaust { .. } => "exhaust",
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
            assert_eq!(label(&decide(payment, Source::Provider, &lookup, &config())), expected, "{name}");
        }
    }
}
