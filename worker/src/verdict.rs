//! From a provider outcome to what the worker records: pure, no I/O.
//!
//! | outcome ([`SendOutcome`]) | verdict |
//! | --- | --- |
//! | charged, as asked | settle `succeeded` with the provider's charge id and time |
//! | charged, but not as asked or not bookable | `unknown`: only the reconciler or an operator can tell |
//! | declined, with the payment's own failed charge | settle `failed` with the provider's code, message and charge |
//! | declined or refused without one, nothing sent before | settle `failed`: this was the first send |
//! | declined or refused without one, an earlier send may have charged | `unknown`, with the refusal: only a lookup can tell |
//! | not sent, attempts left | retry after a jittered backoff, never sooner than `Retry-After` |
//! | not sent, attempts spent | settle `failed` (`provider_unreachable`): provably no charge |
//! | not sent, attempts spent, an earlier send may have charged | `unknown`: only the reconciler can tell |
//! | uncertain | `unknown`, for the reconciler |
//!
//! A doubtful case is uncertain, never "not sent".

use std::time::Duration;

use oncepay_domain::status::Transition;
use oncepay_provider::{NotSentReason, SendOutcome, UncertainReason};
use oncepay_service::backoff::Backoff;
use oncepay_store::settlement::{self, Unsettled};
use oncepay_store::transitions::Settlement;
use oncepay_store::unknown_queue::Refusal;
use rand::Rng;

use oncepay_store::sending::Claimed;

/// The failure code of a payment whose provider could never be reached.
pub const PROVIDER_UNREACHABLE: &str = "provider_unreachable";

/// The `unknown_payments.reason` of a payment that may already have been charged, whose resend the
/// provider refused without showing the payment's own failed charge.
pub const REFUSED_AFTER_POSSIBLE_CHARGE: &str = "refused_after_possible_charge";

/// The longest provider `Retry-After` that is honoured. A provider's clock or bug must not park
/// a payment for days, or ask for a delay PostgreSQL cannot add to a timestamp.
pub const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// How "not sent" failures are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How many claims one queued send gets.
    pub max_attempts: u32,
    /// The delay between them.
    pub backoff: Backoff,
}

impl RetryPolicy {
    /// When a send that was not sent on `attempt` is claimed again, and the audit reason that says
    /// so: after a jittered backoff, never sooner than the provider's `Retry-After` (at most
    /// [`LONGEST_RETRY_AFTER`]). `None` once the attempts are spent.
    pub fn retry(
        &self,
        attempt: u32,
        reason: &NotSentReason,
        retry_after: Option<Duration>,
        rng: &mut impl Rng,
    ) -> Option<(Duration, String)> {
        if attempt >= self.max_attempts {
            return None;
        }
        let retry_after = retry_after.unwrap_or_default().min(LONGEST_RETRY_AFTER);
        let delay = self.backoff.delay(attempt, rng).max(retry_after);
        let reason = format!(
            "not sent ({reason}); attempt {attempt} of {}, next in {} ms",
            self.max_attempts,
            delay.as_millis()
        );
        Some((delay, reason))
    }
}

/// What to record for one claimed payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendVerdict {
    /// A terminal status: `succeeded` ([`Transition::Charged`]) or `failed`
    /// ([`Transition::Declined`], [`Transition::NotSentExhausted`]).
    Settle {
        /// Which move.
        transition: Transition,
        /// The result it stores.
        settlement: Settlement,
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
    /// The customer may have been charged: `unknown`, queued for the reconciler.
    Uncertain {
        /// A stable code for `unknown_payments.reason`.
        code: &'static str,
        /// For the audit trail and the evidence.
        reason: String,
        /// The provider's refusal of a resend, kept with the payment's queue row as evidence for
        /// the reconciler and operators.
        refusal: Option<Refusal>,
    },
}

impl SendVerdict {
    /// `unknown` for the reason `code`, with no refusal to keep.
    fn uncertain(code: &'static str, reason: String) -> Self {
        Self::Uncertain { code, reason, refusal: None }
    }

    /// A short label for logs and metrics: `succeeded`, `failed`, `retry`, `unknown`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Settle { settlement: Settlement::Succeeded { .. }, .. } => "succeeded",
            Self::Settle { settlement: Settlement::Failed { .. }, .. } => "failed",
            Self::Retry { .. } => "retry",
            Self::Uncertain { .. } => "unknown",
        }
    }
}

/// What to record for `claimed` after its send ended in `outcome`.
pub fn decide(claimed: &Claimed, outcome: &SendOutcome, policy: &RetryPolicy, rng: &mut impl Rng) -> SendVerdict {
    match outcome {
        // Judged by `oncepay_store::settlement`, as everywhere else.
        SendOutcome::Charged(charge) => match settlement::settlement_of(&claimed.asked(), charge) {
            Ok(settlement) => SendVerdict::Settle {
                transition: settlement::transition_of(&settlement),
                reason: settle_reason(&settlement),
                settlement,
            },
            // Money may have moved, and only the reconciler or an operator may say how much.
            Err(Unsettled::Unbookable(why)) => SendVerdict::uncertain("unreadable_charge", why),
            Err(Unsettled::Mismatch(why)) => SendVerdict::uncertain("charge_mismatch", why),
        },
        // A refusal of this request says nothing of an earlier send that may have charged under the
        // same key (a payment method detached since, a limit changed): only the payment's own failed
        // charge, or a lookup that finds none, proves that no money moved.
        SendOutcome::Declined { code, message, charge_id: None } if claimed.may_be_charged => SendVerdict::Uncertain {
            code: REFUSED_AFTER_POSSIBLE_CHARGE,
            reason: format!(
                "the provider refused a resend ({code}) without showing this payment's failed charge, and an \
                 earlier send may have charged"
            ),
            refusal: Some(Refusal { code: code.clone(), message: message.clone() }),
        },
        SendOutcome::Declined { code, message, charge_id } => {
            let settlement = settlement::declined(Some(code), Some(message), charge_id.as_deref());
            SendVerdict::Settle { transition: Transition::Declined, reason: settle_reason(&settlement), settlement }
        }
        SendOutcome::NotSent { reason, retry_after } => {
            match policy.retry(claimed.attempt, reason, *retry_after, rng) {
                Some((delay, reason)) => SendVerdict::Retry { delay, reason },
                None if claimed.may_be_charged => SendVerdict::uncertain(
                    "not_sent_but_may_be_charged",
                    format!(
                        "not sent in {} attempts ({reason}), but an earlier send may have reached the provider",
                        claimed.attempt
                    ),
                ),
                None => SendVerdict::Settle {
                    transition: Transition::NotSentExhausted,
                    reason: format!("not sent in {} attempts ({reason})", claimed.attempt),
                    settlement: Settlement::Failed {
                        code: PROVIDER_UNREACHABLE.to_owned(),
                        message: format!(
                            "The payment provider could not be reached in {} attempts ({reason}); no charge was made.",
                            claimed.attempt
                        ),
                        charge_id: None,
                    },
                },
            }
        }
        SendOutcome::Uncertain(reason) => SendVerdict::uncertain(uncertain_code(reason), reason.to_string()),
    }
}

/// The `unknown` code, payment or refund, of a resend held back because it could move money twice:
/// an earlier send may have reached the provider, and the provider may have forgotten the key.
pub const KEY_WINDOW_PASSED: &str = "key_window_passed";

/// What to record instead of sending when [`Claimed::send_is_safe`] says a send could charge twice.
pub fn key_window_passed() -> SendVerdict {
    SendVerdict::uncertain(
        KEY_WINDOW_PASSED,
        "not sent: an earlier send may have reached the provider, and the provider may have forgotten the key \
         since, so a resend could charge twice"
            .to_owned(),
    )
}

/// Why a payment settled, for the audit trail.
fn settle_reason(settlement: &Settlement) -> String {
    match settlement {
        Settlement::Succeeded { charge_id, .. } => format!("the provider charged the customer ({charge_id})"),
        Settlement::Failed { code, .. } => format!("the provider declined the charge ({code})"),
    }
}

/// A stable code per uncertain reason, for `unknown_payments.reason`, the evidence and a refund's
/// event.
pub fn uncertain_code(reason: &UncertainReason) -> &'static str {
    match reason {
        UncertainReason::Timeout => "timeout",
        UncertainReason::ConnectionLost => "connection_lost",
        UncertainReason::ServerError(_) => "server_error",
        UncertainReason::KeyInFlight => "key_in_flight",
        UncertainReason::KeyReused => "key_reused",
        UncertainReason::UnexpectedStatus(_) => "unexpected_status",
        UncertainReason::UnreadableResponse => "unreadable_response",
        UncertainReason::NotFinal => "not_final",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use oncepay_domain::ids::{PaymentId, TenantId};
    use oncepay_domain::money::{Amount, Currency};
    use oncepay_provider::fixtures;
    use oncepay_provider::{Charge, ChargeStatus, NotSentReason};
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use time::macros::datetime;

    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        max_attempts: 3,
        backoff: Backoff { base: Duration::from_millis(100), max: Duration::from_secs(10) },
    };

    fn claimed(attempt: u32, may_be_charged: bool) -> Claimed {
        Claimed {
            tenant_id: TenantId::generate(),
            payment_id: PaymentId::generate(),
            fencing_token: 7,
            lease_until: datetime!(2026-01-01 0:01 UTC),
            attempt,
            send_attempts: attempt,
            may_be_charged,
            in_key_window: true,
            amount: Amount::new(1999).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            customer_id: "cus_1".into(),
            metadata: BTreeMap::new(),
            payment_method: None,
            provider_customer: None,
            provider_account: None,
            trace: None,
            accepted_at: datetime!(2026-01-01 0:00 UTC),
        }
    }

    /// The provider's 201 for `claimed`, as asked, changed by `change`.
    fn charged(claimed: &Claimed, change: impl FnOnce(&mut Charge)) -> SendOutcome {
        let mut charge = Charge {
            currency: claimed.currency.as_str().into(),
            ..fixtures::charge(claimed.payment_id, "ch_1", ChargeStatus::Succeeded, claimed.amount.minor_units())
        };
        change(&mut charge);
        SendOutcome::Charged(charge)
    }

    fn not_sent(retry_after: Option<Duration>) -> SendOutcome {
        SendOutcome::NotSent { reason: NotSentReason::ConnectFailed, retry_after }
    }

    fn decide_seeded(claimed: &Claimed, outcome: &SendOutcome) -> SendVerdict {
        decide(claimed, outcome, &POLICY, &mut StdRng::seed_from_u64(1))
    }

    #[test]
    fn each_outcome_leads_to_its_verdict() {
        let first = claimed(1, false);
        let cases: Vec<(&str, &Claimed, SendOutcome, &str)> = vec![
            ("charged", &first, charged(&first, |_| {}), "succeeded"),
            ("charged, but declined", &first, charged(&first, |c| c.status = ChargeStatus::Failed), "failed"),
            ("charge without id", &first, charged(&first, |c| c.id = String::new()), "unknown"),
            ("charge of nothing", &first, charged(&first, |c| c.amount = 0), "unknown"),
            ("charge of another amount", &first, charged(&first, |c| c.amount = 1500), "unknown"),
            ("charge in no currency", &first, charged(&first, |c| c.currency = "eur".into()), "unknown"),
            ("charge at no time", &first, charged(&first, |c| c.created = i64::MAX), "unknown"),
            (
                "declined",
                &first,
                SendOutcome::Declined { code: "card_declined".into(), message: "no".into(), charge_id: None },
                "failed",
            ),
            ("not sent, first attempt", &first, not_sent(None), "retry"),
            ("timeout", &first, SendOutcome::Uncertain(UncertainReason::Timeout), "unknown"),
            ("reset", &first, SendOutcome::Uncertain(UncertainReason::ConnectionLost), "unknown"),
            ("5xx", &first, SendOutcome::Uncertain(UncertainReason::ServerError(500)), "unknown"),
            ("409", &first, SendOutcome::Uncertain(UncertainReason::KeyInFlight), "unknown"),
            ("422", &first, SendOutcome::Uncertain(UncertainReason::KeyReused), "unknown"),
        ];
        for (name, claimed, outcome, expected) in cases {
            assert_eq!(decide_seeded(claimed, &outcome).label(), expected, "{name}");
        }
        let not_sent_cases = [
            ("not sent, attempts left", claimed(2, false), "retry"),
            ("not sent, attempts spent", claimed(3, false), "failed"),
            ("not sent, maybe charged before, attempts left", claimed(2, true), "retry"),
            ("not sent, maybe charged before, attempts spent", claimed(3, true), "unknown"),
        ];
        for (name, claimed, expected) in not_sent_cases {
            assert_eq!(decide_seeded(&claimed, &not_sent(None)).label(), expected, "{name}");
        }
    }

    #[test]
    fn a_refusal_proves_no_charge_only_for_a_payment_that_may_not_have_been_charged_before() {
        let refused = |charge_id: Option<&str>| SendOutcome::Declined {
            code: "provider_rejected".into(),
            message: "Stripe refused the request as invalid (code resource_missing).".into(),
            charge_id: charge_id.map(str::to_owned),
        };
        let cases = [
            ("first send, refused", claimed(1, false), refused(None), "failed"),
            ("resend after a lost response, refused", claimed(1, true), refused(None), "unknown"),
            (
                "resend, declined with the payment's own failed charge",
                claimed(1, true),
                refused(Some("pi_1")),
                "failed",
            ),
        ];
        for (name, claimed, outcome, expected) in cases {
            assert_eq!(decide_seeded(&claimed, &outcome).label(), expected, "{name}");
        }
    }

    #[test]
    fn a_refused_resend_keeps_the_refusal_for_the_reconciler() {
        let outcome =
            SendOutcome::Declined { code: "provider_rejected".into(), message: "refused".into(), charge_id: None };

        let verdict = decide_seeded(&claimed(2, true), &outcome);

        let SendVerdict::Uncertain { code, refusal, .. } = verdict else { panic!("{verdict:?}") };
        assert_eq!(code, REFUSED_AFTER_POSSIBLE_CHARGE);
        assert_eq!(refusal, Some(Refusal { code: "provider_rejected".into(), message: "refused".into() }));
    }

    #[test]
    fn a_charge_other_than_the_one_asked_for_is_never_a_success() {
        let claimed = claimed(1, false);

        let verdict = decide_seeded(&claimed, &charged(&claimed, |c| c.amount = 1500));

        let SendVerdict::Uncertain { code, reason, .. } = verdict else { panic!("{verdict:?}") };
        assert_eq!(code, "charge_mismatch");
        assert!(reason.contains("1500") && reason.contains("1999"), "{reason}");
    }

    #[test]
    fn a_decline_keeps_the_providers_words_and_fills_in_blanks() {
        let outcome =
            SendOutcome::Declined { code: " ".into(), message: String::new(), charge_id: Some(String::new()) };

        let SendVerdict::Settle { transition, settlement, .. } = decide_seeded(&claimed(1, false), &outcome) else {
            panic!()
        };

        assert_eq!(transition, Transition::Declined);
        assert_eq!(
            settlement,
            Settlement::Failed {
                code: "declined".into(),
                message: "The provider declined the charge.".into(),
                charge_id: None
            }
        );
    }

    #[test]
    fn spent_attempts_fail_as_unreachable_and_say_no_charge_was_made() {
        let SendVerdict::Settle { transition, settlement: Settlement::Failed { code, message, charge_id }, .. } =
            decide_seeded(&claimed(3, false), &not_sent(None))
        else {
            panic!()
        };

        assert_eq!(transition, Transition::NotSentExhausted);
        assert_eq!(code, PROVIDER_UNREACHABLE);
        assert!(message.contains("no charge was made"), "{message}");
        assert_eq!(charge_id, None);
    }

    #[test]
    fn a_retry_waits_within_the_backoff_and_at_least_the_providers_retry_after() {
        for seed in 0..200 {
            let mut rng = StdRng::seed_from_u64(seed);
            let SendVerdict::Retry { delay, .. } = decide(&claimed(2, false), &not_sent(None), &POLICY, &mut rng)
            else {
                panic!()
            };
            assert!(delay <= POLICY.backoff.ceiling(2), "{delay:?}");

            let mut rng = StdRng::seed_from_u64(seed);
            let SendVerdict::Retry { delay, .. } =
                decide(&claimed(2, false), &not_sent(Some(Duration::from_secs(30))), &POLICY, &mut rng)
            else {
                panic!()
            };
            assert!(delay >= Duration::from_secs(30), "{delay:?}");
        }
    }

    #[test]
    fn a_huge_retry_after_is_honoured_only_up_to_the_longest_one() {
        let years = Duration::from_secs(u64::MAX / 4);

        let SendVerdict::Retry { delay, .. } = decide_seeded(&claimed(1, false), &not_sent(Some(years))) else {
            panic!()
        };

        assert_eq!(delay, LONGEST_RETRY_AFTER);
    }

    #[test]
    fn each_uncertain_reason_has_its_own_code() {
        let reasons = [
            UncertainReason::Timeout,
            UncertainReason::ConnectionLost,
            UncertainReason::ServerError(503),
            UncertainReason::KeyInFlight,
            UncertainReason::KeyReused,
            UncertainReason::UnexpectedStatus(404),
            UncertainReason::UnreadableResponse,
        ];
        let codes: std::collections::BTreeSet<_> = reasons.iter().map(uncertain_code).collect();
        assert_eq!(codes.len(), reasons.len());
    }
}
