//! From a provider outcome to what the worker records: pure, no I/O.
//!
//! | outcome ([`SendOutcome`]) | decision |
//! | --- | --- |
//! | charged | settle `succeeded` with the provider's amount, currency and time |
//! | declined | settle `failed` with the provider's code, message and charge |
//! | not sent, attempts left | retry after a jittered backoff, never sooner than `Retry-After` |
//! | not sent, attempts spent | settle `failed` (`provider_unreachable`): provably no charge |
//! | not sent, attempts spent, an earlier send may have charged | `unknown`: only the reconciler can tell |
//! | uncertain | `unknown`, for the reconciler |
//!
//! A charge that cannot be booked as it is (no id, an impossible amount, currency or time) is
//! `unknown` too: money may have moved, and only the reconciler or an operator may say how much.
//! Nothing here weakens the rule that a doubtful case is uncertain, never "not sent".

use std::time::Duration;

use oncepay_shared::backoff::Backoff;
use oncepay_shared::money::Currency;
use oncepay_shared::provider::{Charge, SendOutcome, UncertainReason};
use oncepay_shared::status::Transition;
use oncepay_shared::store::transitions::Settlement;
use rand::Rng;
use time::OffsetDateTime;

use crate::outbox::Claimed;

/// The failure code of a payment whose provider could never be reached.
pub const PROVIDER_UNREACHABLE: &str = "provider_unreachable";

/// The longest `Retry-After` of a provider that is honoured. A provider's clock or bug must not park
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

/// What to record for one claimed payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
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
    },
}

impl Decision {
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

/// What to record after the provider answered `outcome` to `claimed`'s send.
pub fn decide(claimed: &Claimed, outcome: &SendOutcome, policy: &RetryPolicy, rng: &mut impl Rng) -> Decision {
    match outcome {
        SendOutcome::Charged(charge) => match booked(charge) {
            Ok(settlement) => Decision::Settle {
                transition: Transition::Charged,
                settlement,
                reason: format!("the provider charged the customer ({})", charge.id),
            },
            Err(why) => Decision::Uncertain {
                code: "unreadable_charge",
                reason: format!("the provider reported charge {:?}, but {why}", charge.id),
            },
        },
        SendOutcome::Declined { code, message, charge_id } => {
            let code = if code.trim().is_empty() { "declined".to_owned() } else { code.clone() };
            let message = if message.trim().is_empty() {
                "The provider declined the charge.".to_owned()
            } else {
                message.clone()
            };
            Decision::Settle {
                transition: Transition::Declined,
                reason: format!("the provider declined the charge ({code})"),
                settlement: Settlement::Failed {
                    code,
                    message,
                    charge_id: charge_id.clone().filter(|id| !id.is_empty()),
                },
            }
        }
        SendOutcome::NotSent { reason, retry_after } => {
            if claimed.attempt < policy.max_attempts {
                let retry_after = retry_after.unwrap_or_default().min(LONGEST_RETRY_AFTER);
                let delay = policy.backoff.delay(claimed.attempt, rng).max(retry_after);
                Decision::Retry {
                    delay,
                    reason: format!(
                        "not sent ({reason}); attempt {} of {}, next in {} ms",
                        claimed.attempt,
                        policy.max_attempts,
                        delay.as_millis()
                    ),
                }
            } else if claimed.may_be_charged {
                Decision::Uncertain {
                    code: "not_sent_but_may_be_charged",
                    reason: format!(
                        "not sent in {} attempts ({reason}), but an earlier send may have reached the provider",
                        claimed.attempt
                    ),
                }
            } else {
                Decision::Settle {
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
                }
            }
        }
        SendOutcome::Uncertain(reason) => {
            Decision::Uncertain { code: uncertain_code(reason), reason: reason.to_string() }
        }
    }
}

/// What to record instead of sending when [`Claimed::send_is_safe`] says a send could charge twice.
pub fn key_window_passed() -> Decision {
    Decision::Uncertain {
        code: "key_window_passed",
        reason: "not sent: an earlier send may have reached the provider, and the provider may have forgotten the \
                 key since, so a resend could charge twice"
            .to_owned(),
    }
}

/// The ledger entry of a charge, if it can be booked as the provider reported it.
fn booked(charge: &Charge) -> Result<Settlement, String> {
    if charge.id.trim().is_empty() {
        return Err("it has no id".to_owned());
    }
    if charge.amount <= 0 {
        return Err(format!("its amount {} is not positive", charge.amount));
    }
    let currency = Currency::parse(&charge.currency).map_err(|e| format!("its currency {:?} {e}", charge.currency))?;
    let charged_at = OffsetDateTime::from_unix_timestamp(charge.created)
        .map_err(|_| format!("its creation time {} is out of range", charge.created))?;
    Ok(Settlement::Succeeded {
        charge_id: charge.id.clone(),
        amount: charge.amount,
        currency: currency.as_str().to_owned(),
        charged_at,
    })
}

/// A stable code per uncertain reason, for `unknown_payments.reason` and the evidence.
fn uncertain_code(reason: &UncertainReason) -> &'static str {
    match reason {
        UncertainReason::Timeout => "timeout",
        UncertainReason::ConnectionLost => "connection_lost",
        UncertainReason::ServerError(_) => "server_error",
        UncertainReason::KeyInFlight => "key_in_flight",
        UncertainReason::KeyReused => "key_reused",
        UncertainReason::UnexpectedStatus(_) => "unexpected_status",
        UncertainReason::UnreadableAnswer => "unreadable_answer",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use oncepay_shared::ids::{PaymentId, TenantId};
    use oncepay_shared::money::Amount;
    use oncepay_shared::provider::{ChargeStatus, NotSentReason};
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
            trace: None,
            accepted_at: datetime!(2026-01-01 0:00 UTC),
        }
    }

    fn charge(amount: i64, currency: &str, created: i64) -> Charge {
        Charge {
            id: "ch_1".into(),
            status: ChargeStatus::Succeeded,
            amount,
            currency: currency.into(),
            customer: "cus_1".into(),
            idempotency_key: "oncepay-x".into(),
            created,
            metadata: BTreeMap::new(),
            failure_code: None,
            failure_message: None,
        }
    }

    fn not_sent(retry_after: Option<Duration>) -> SendOutcome {
        SendOutcome::NotSent { reason: NotSentReason::ConnectFailed, retry_after }
    }

    fn decide_seeded(claimed: &Claimed, outcome: &SendOutcome) -> Decision {
        decide(claimed, outcome, &POLICY, &mut StdRng::seed_from_u64(1))
    }

    #[test]
    fn each_outcome_leads_to_its_decision() {
        let cases: Vec<(&str, Claimed, SendOutcome, &str)> = vec![
            ("charged", claimed(1, false), SendOutcome::Charged(charge(1999, "EUR", 1_763_800_000)), "succeeded"),
            (
                "charge without id",
                claimed(1, false),
                SendOutcome::Charged(Charge { id: String::new(), ..charge(1, "EUR", 1) }),
                "unknown",
            ),
            ("charge of nothing", claimed(1, false), SendOutcome::Charged(charge(0, "EUR", 1)), "unknown"),
            ("charge in no currency", claimed(1, false), SendOutcome::Charged(charge(5, "eur", 1)), "unknown"),
            ("charge at no time", claimed(1, false), SendOutcome::Charged(charge(5, "EUR", i64::MAX)), "unknown"),
            (
                "declined",
                claimed(1, false),
                SendOutcome::Declined { code: "card_declined".into(), message: "no".into(), charge_id: None },
                "failed",
            ),
            ("not sent, first attempt", claimed(1, false), not_sent(None), "retry"),
            ("not sent, attempts left", claimed(2, false), not_sent(None), "retry"),
            ("not sent, attempts spent", claimed(3, false), not_sent(None), "failed"),
            ("not sent, maybe charged before, attempts left", claimed(2, true), not_sent(None), "retry"),
            ("not sent, maybe charged before, attempts spent", claimed(3, true), not_sent(None), "unknown"),
            ("timeout", claimed(1, false), SendOutcome::Uncertain(UncertainReason::Timeout), "unknown"),
            ("reset", claimed(1, false), SendOutcome::Uncertain(UncertainReason::ConnectionLost), "unknown"),
            ("5xx", claimed(1, false), SendOutcome::Uncertain(UncertainReason::ServerError(500)), "unknown"),
            ("409", claimed(1, false), SendOutcome::Uncertain(UncertainReason::KeyInFlight), "unknown"),
            ("422", claimed(1, false), SendOutcome::Uncertain(UncertainReason::KeyReused), "unknown"),
        ];
        for (name, claimed, outcome, expected) in cases {
            assert_eq!(decide_seeded(&claimed, &outcome).label(), expected, "{name}");
        }
    }

    #[test]
    fn a_success_books_what_the_provider_charged_not_what_was_asked() {
        let decision = decide_seeded(&claimed(1, false), &SendOutcome::Charged(charge(1500, "USD", 1_763_800_000)));

        let Decision::Settle { transition, settlement, .. } = decision else { panic!("{decision:?}") };
        assert_eq!(transition, Transition::Charged);
        assert_eq!(
            settlement,
            Settlement::Succeeded {
                charge_id: "ch_1".into(),
                amount: 1500,
                currency: "USD".into(),
                charged_at: OffsetDateTime::from_unix_timestamp(1_763_800_000).unwrap(),
            }
        );
    }

    #[test]
    fn a_decline_keeps_the_providers_words_and_fills_in_blanks() {
        let outcome =
            SendOutcome::Declined { code: " ".into(), message: String::new(), charge_id: Some(String::new()) };

        let Decision::Settle { transition, settlement, .. } = decide_seeded(&claimed(1, false), &outcome) else {
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
        let Decision::Settle { transition, settlement: Settlement::Failed { code, message, charge_id }, .. } =
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
            let Decision::Retry { delay, .. } = decide(&claimed(2, false), &not_sent(None), &POLICY, &mut rng) else {
                panic!()
            };
            assert!(delay <= POLICY.backoff.ceiling(2), "{delay:?}");

            let mut rng = StdRng::seed_from_u64(seed);
            let Decision::Retry { delay, .. } =
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

        let Decision::Retry { delay, .. } = decide_seeded(&claimed(1, false), &not_sent(Some(years))) else { panic!() };

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
            UncertainReason::UnreadableAnswer,
        ];
        let codes: std::collections::BTreeSet<_> = reasons.iter().map(uncertain_code).collect();
        assert_eq!(codes.len(), reasons.len());
    }
}
