//! What a charge found at the provider (in a webhook or a lookup) means for the payment it names.
//!
//! Pure: no I/O. [`settlement`] turns a provider charge into the terminal settlement the ledger and
//! the payment record, exactly as the worker would from a 201 or a 402. [`judge`] compares a charge
//! with what oncepay has recorded and decides what to do, monotonically: only an `unknown` payment is
//! settled; a terminal payment never moves, and evidence that contradicts it is a conflict for an
//! operator; a payment still being sent is left to its sender.

use oncepay_shared::provider::{Charge, ChargeStatus};
use oncepay_shared::status::{PaymentStatus, Transition};
use oncepay_shared::store::transitions::Settlement;
use time::OffsetDateTime;

/// A charge whose creation time cannot be a date.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("charge {charge_id} has an impossible creation time {created}")]
pub struct BadCharge {
    /// The charge.
    pub charge_id: String,
    /// Its `created`, Unix seconds.
    pub created: i64,
}

/// The transition and settlement that a provider charge proves, for a payment in `unknown`.
pub fn settlement(charge: &Charge) -> Result<(Transition, Settlement), BadCharge> {
    Ok(match charge.status {
        ChargeStatus::Succeeded => (
            Transition::Charged,
            Settlement::Succeeded {
                charge_id: charge.id.clone(),
                amount: charge.amount,
                currency: charge.currency.clone(),
                charged_at: OffsetDateTime::from_unix_timestamp(charge.created)
                    .map_err(|_| BadCharge { charge_id: charge.id.clone(), created: charge.created })?,
            },
        ),
        ChargeStatus::Failed => (
            Transition::Declined,
            Settlement::Failed {
                code: charge.failure_code.clone().unwrap_or_else(|| "declined".to_owned()),
                message: charge
                    .failure_message
                    .clone()
                    .unwrap_or_else(|| "The provider declined the charge.".to_owned()),
                charge_id: Some(charge.id.clone()),
            },
        ),
    })
}

/// What oncepay has recorded about a payment, as far as a charge can agree or disagree with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Where the payment stands.
    pub status: PaymentStatus,
    /// The provider charge it was settled with, if any.
    pub charge_id: Option<String>,
    /// Its ledger entry, when it succeeded: what we booked as charged.
    pub ledger: Option<Booked>,
}

/// What a ledger entry booked (the entry books `Recorded::charge_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booked {
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
}

/// What to do with a charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// The payment is `unknown` and this charge settles it.
    Settle(Transition, Settlement),
    /// The payment is still being sent (`pending`, `processing`): its sender will learn the outcome
    /// (or make it `unknown`, and the poller will); the charge is only recorded.
    LeaveToSender,
    /// The payment is dead-lettered: only an operator moves it; the charge is evidence for them.
    ForOperator,
    /// The payment is terminal and the charge agrees with it.
    Agrees,
    /// The payment is terminal and the charge contradicts it; the state is kept.
    Conflicts(String),
}

impl Judgement {
    /// A short label for logs, metrics and `webhook_events.outcome`.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Settle(..) => "applied",
            Self::LeaveToSender => "not_unknown",
            Self::ForOperator => "dead_lettered",
            Self::Agrees => "already_terminal",
            Self::Conflicts(_) => "conflict",
        }
    }
}

/// Compares `charge` with what is recorded about its payment.
pub fn judge(recorded: &Recorded, charge: &Charge) -> Result<Judgement, BadCharge> {
    use ChargeStatus as C;
    use PaymentStatus as S;

    let ours = recorded.charge_id.as_deref();
    Ok(match (recorded.status, charge.status) {
        (S::Unknown, _) => {
            let (transition, settlement) = settlement(charge)?;
            Judgement::Settle(transition, settlement)
        }
        (S::Pending | S::Processing, _) => Judgement::LeaveToSender,
        (S::DeadLettered, _) => Judgement::ForOperator,

        (S::Succeeded, C::Succeeded) if ours != Some(charge.id.as_str()) => Judgement::Conflicts(format!(
            "the provider reports charge {} succeeded, but the payment succeeded with charge {}: a second charge",
            charge.id,
            ours.unwrap_or("(none)"),
        )),
        (S::Succeeded, C::Succeeded) => match &recorded.ledger {
            Some(booked) if booked.amount != charge.amount || booked.currency != charge.currency => {
                Judgement::Conflicts(format!(
                    "the provider reports charge {} for {} {}, but the ledger booked {} {}",
                    charge.id, charge.amount, charge.currency, booked.amount, booked.currency,
                ))
            }
            Some(_) => Judgement::Agrees,
            None => {
                Judgement::Conflicts(format!("the payment succeeded with charge {} but has no ledger entry", charge.id))
            }
        },
        (S::Succeeded, C::Failed) => Judgement::Conflicts(format!(
            "the provider reports charge {} failed, but the payment succeeded with charge {}",
            charge.id,
            ours.unwrap_or("(none)"),
        )),
        (S::Failed, C::Succeeded) => Judgement::Conflicts(format!(
            "the provider reports charge {} succeeded, but the payment is recorded as failed: money moved",
            charge.id,
        )),
        (S::Failed, C::Failed) => match ours {
            Some(ours) if ours != charge.id => Judgement::Conflicts(format!(
                "the provider reports a failed charge {}, but the payment failed with charge {ours}",
                charge.id,
            )),
            _ => Judgement::Agrees,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn charge(id: &str, status: ChargeStatus, amount: i64) -> Charge {
        Charge {
            id: id.to_owned(),
            status,
            amount,
            currency: "EUR".to_owned(),
            customer: "cus_1".to_owned(),
            idempotency_key: "oncepay-x".to_owned(),
            created: 1_763_800_000,
            metadata: BTreeMap::new(),
            failure_code: (status == ChargeStatus::Failed).then(|| "card_declined".to_owned()),
            failure_message: (status == ChargeStatus::Failed).then(|| "Declined".to_owned()),
        }
    }

    fn recorded(status: PaymentStatus, charge_id: Option<&str>, booked: Option<i64>) -> Recorded {
        Recorded {
            status,
            charge_id: charge_id.map(str::to_owned),
            ledger: booked.map(|amount| Booked { amount, currency: "EUR".to_owned() }),
        }
    }

    #[test]
    fn each_recorded_state_and_charge_gets_the_right_judgement() {
        use ChargeStatus::{Failed as Declined, Succeeded as Charged};
        use PaymentStatus as S;
        let cases = [
            ("unknown, charged", recorded(S::Unknown, None, None), charge("ch_1", Charged, 100), "applied"),
            ("unknown, declined", recorded(S::Unknown, None, None), charge("ch_1", Declined, 100), "applied"),
            ("pending", recorded(S::Pending, None, None), charge("ch_1", Charged, 100), "not_unknown"),
            ("processing", recorded(S::Processing, None, None), charge("ch_1", Declined, 100), "not_unknown"),
            ("dead lettered", recorded(S::DeadLettered, None, None), charge("ch_1", Charged, 100), "dead_lettered"),
            (
                "same success",
                recorded(S::Succeeded, Some("ch_1"), Some(100)),
                charge("ch_1", Charged, 100),
                "already_terminal",
            ),
            (
                "second charge",
                recorded(S::Succeeded, Some("ch_1"), Some(100)),
                charge("ch_2", Charged, 100),
                "conflict",
            ),
            ("other amount", recorded(S::Succeeded, Some("ch_1"), Some(100)), charge("ch_1", Charged, 90), "conflict"),
            (
                "success, then declined",
                recorded(S::Succeeded, Some("ch_1"), Some(100)),
                charge("ch_1", Declined, 100),
                "conflict",
            ),
            (
                "declined, then charged",
                recorded(S::Failed, Some("ch_1"), None),
                charge("ch_1", Charged, 100),
                "conflict",
            ),
            (
                "same decline",
                recorded(S::Failed, Some("ch_1"), None),
                charge("ch_1", Declined, 100),
                "already_terminal",
            ),
            (
                "decline without charge id",
                recorded(S::Failed, None, None),
                charge("ch_1", Declined, 100),
                "already_terminal",
            ),
            (
                "another declined charge",
                recorded(S::Failed, Some("ch_1"), None),
                charge("ch_2", Declined, 100),
                "conflict",
            ),
        ];
        for (name, recorded, charge, expected) in cases {
            assert_eq!(judge(&recorded, &charge).unwrap().label(), expected, "{name}");
        }
    }

    #[test]
    fn a_success_settles_with_the_providers_amount_and_time_and_a_decline_with_its_code() {
        let (transition, settled) = settlement(&charge("ch_1", ChargeStatus::Succeeded, 1999)).unwrap();
        assert_eq!(transition, Transition::Charged);
        assert_eq!(
            settled,
            Settlement::Succeeded {
                charge_id: "ch_1".into(),
                amount: 1999,
                currency: "EUR".into(),
                charged_at: OffsetDateTime::from_unix_timestamp(1_763_800_000).unwrap(),
            }
        );

        let (transition, settled) = settlement(&charge("ch_2", ChargeStatus::Failed, 1999)).unwrap();
        assert_eq!(transition, Transition::Declined);
        assert_eq!(
            settled,
            Settlement::Failed {
                code: "card_declined".into(),
                message: "Declined".into(),
                charge_id: Some("ch_2".into())
            }
        );
    }

    #[test]
    fn a_charge_created_at_an_impossible_time_is_refused() {
        let mut bad = charge("ch_1", ChargeStatus::Succeeded, 100);
        bad.created = i64::MAX;
        assert!(settlement(&bad).is_err());
    }
}
