//! What a charge found at the provider (in a webhook or a lookup) means for the payment it names.
//! Pure: no I/O.
//!
//! [`judge`] is monotonic: only an `unknown` payment is settled, and only by a charge that is what it
//! asked for (`oncepay_store::settlement` decides that, as it does for the worker and operators). A
//! terminal payment never moves; evidence that contradicts it is a conflict for an operator. A
//! payment still being sent is left to its sender. A charge held by another provider account than
//! the payment's is another merchant's (or the platform's), whatever it names: it changes nothing,
//! whatever the payment's status.

use oncepay_domain::money::{Amount, Currency, format_amount};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_provider::{Charge, ChargeStatus};
use oncepay_store::settlement::{self, Asked, Unsettled};
use oncepay_store::transitions::Settlement;

/// What oncepay has stored about a payment, as far as a charge can agree or disagree with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// What the payment asked the provider to charge.
    pub asked: Asked,
    /// Where the payment stands.
    pub status: PaymentStatus,
    /// The provider charge it was settled with, if any.
    pub charge_id: Option<String>,
    /// Its ledger entry, when it succeeded: what we booked as charged.
    pub ledger: Option<Booked>,
}

/// What a ledger entry booked (the entry books `Stored::charge_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booked {
    /// What was charged.
    pub amount: Amount,
    /// In this currency.
    pub currency: Currency,
}

/// What to do with a charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeVerdict {
    /// The payment is `unknown` and this charge settles it.
    Settle(Transition, Settlement),
    /// The payment is `unknown` and the charge is not what it asked for: an operator decides.
    Mismatch(String),
    /// The payment is `unknown` and the charge cannot be booked as reported: it proves nothing, and
    /// counts as an inconclusive lookup.
    Unbookable(String),
    /// The payment is still being sent (`pending`, `processing`): its sender will learn the outcome
    /// (or make it `unknown`, and the poller will); the charge is only recorded.
    LeaveToSender,
    /// The payment is dead-lettered: only an operator moves it; the charge is evidence for them.
    ForOperator,
    /// The payment is terminal and the charge agrees with it.
    Agrees,
    /// The payment is terminal and the charge contradicts it; the state is kept.
    Conflicts(String),
    /// The payment is terminal and the charge cannot be read as reported (a malformed report): it
    /// contradicts nothing, and is only recorded.
    Unreadable(String),
    /// The charge is held by another provider account than the payment's: it is not evidence about
    /// this payment at all, and nothing is recorded.
    OtherAccount(String),
}

impl ChargeVerdict {
    /// A short label for logs, metrics and `webhook_events.outcome`.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Settle(..) => "applied",
            Self::Mismatch(_) => "conflict",
            Self::Unbookable(_) | Self::Unreadable(_) => "unbookable",
            Self::LeaveToSender => "not_unknown",
            Self::ForOperator => "dead_lettered",
            Self::Agrees => "already_terminal",
            Self::Conflicts(_) => "conflict",
            Self::OtherAccount(_) => "other_account",
        }
    }
}

/// Compares `charge` with what is stored about its payment.
pub fn judge(stored: &Stored, charge: &Charge) -> ChargeVerdict {
    use ChargeStatus as C;
    use PaymentStatus as S;

    let ours = stored.charge_id.as_deref();
    // Whoever holds another account can put any payment's name on a charge of theirs: what it says
    // is no evidence about this payment, so it must not move, dead-letter or add to anything.
    if !settlement::same_account(&stored.asked, charge) {
        let account = stored.asked.account.as_ref().map(|a| a.as_str());
        return ChargeVerdict::OtherAccount(format!(
            "charge {} is held by account {}, but the payment is charged in account {}",
            charge.id,
            charge.account.as_deref().unwrap_or("(oncepay's own)"),
            account.unwrap_or("(oncepay's own)"),
        ));
    }
    // A report that cannot be read proves nothing about a final payment either: no conflict.
    if stored.status.is_terminal()
        && let Err(Unsettled::Unbookable(why)) = settlement::settlement_of(&stored.asked, charge)
    {
        return ChargeVerdict::Unreadable(why);
    }
    match (stored.status, charge.status) {
        (S::Unknown, _) => match settlement::settlement_of(&stored.asked, charge) {
            Ok(settled) => ChargeVerdict::Settle(settlement::transition_of(&settled), settled),
            Err(Unsettled::Mismatch(why)) => ChargeVerdict::Mismatch(why),
            Err(Unsettled::Unbookable(why)) => ChargeVerdict::Unbookable(why),
        },
        (S::Pending | S::Processing, _) => ChargeVerdict::LeaveToSender,
        (S::DeadLettered, _) => ChargeVerdict::ForOperator,

        (S::Succeeded, C::Succeeded) if ours != Some(charge.id.as_str()) => ChargeVerdict::Conflicts(format!(
            "the provider reports charge {} succeeded, but the payment succeeded with charge {}: a second charge",
            charge.id,
            ours.unwrap_or("(none)"),
        )),
        (S::Succeeded, C::Succeeded) => match &stored.ledger {
            Some(booked)
                if booked.amount.minor_units() != charge.amount || booked.currency.as_str() != charge.currency =>
            {
                ChargeVerdict::Conflicts(format!(
                    "the provider reports charge {} for {}, but the ledger booked {}",
                    charge.id,
                    format_amount(charge.amount, &charge.currency),
                    format_amount(booked.amount.minor_units(), booked.currency.as_str()),
                ))
            }
            Some(_) => ChargeVerdict::Agrees,
            None => ChargeVerdict::Conflicts(format!(
                "the payment succeeded with charge {} but has no ledger entry",
                charge.id
            )),
        },
        (S::Succeeded, C::Failed) => ChargeVerdict::Conflicts(format!(
            "the provider reports charge {} failed, but the payment succeeded with charge {}",
            charge.id,
            ours.unwrap_or("(none)"),
        )),
        (S::Failed, C::Succeeded) => ChargeVerdict::Conflicts(format!(
            "the provider reports charge {} succeeded, but the payment is recorded as failed: money moved",
            charge.id,
        )),
        (S::Failed, C::Failed) => match ours {
            Some(ours) if ours != charge.id => ChargeVerdict::Conflicts(format!(
                "the provider reports a failed charge {}, but the payment failed with charge {ours}",
                charge.id,
            )),
            _ => ChargeVerdict::Agrees,
        },
    }
}

#[cfg(test)]
mod tests {
    use oncepay_provider::fixtures;

    use super::*;

    fn asked() -> Asked {
        oncepay_store::fixtures::asked(100)
    }

    fn charge(asked: &Asked, id: &str, status: ChargeStatus, amount: i64) -> Charge {
        fixtures::charge(asked.payment_id, id, status, amount)
    }

    fn stored(asked: Asked, status: PaymentStatus, charge_id: Option<&str>, booked: Option<i64>) -> Stored {
        Stored {
            asked,
            status,
            charge_id: charge_id.map(str::to_owned),
            ledger: booked.map(|amount| Booked {
                amount: Amount::new(amount).unwrap(),
                currency: Currency::parse("EUR").unwrap(),
            }),
        }
    }

    #[test]
    fn each_recorded_state_and_charge_gets_the_right_verdict() {
        use ChargeStatus::{Failed as Declined, Succeeded as Charged};
        use PaymentStatus as S;
        let a = asked();
        let r = |status, charge_id, booked| stored(a.clone(), status, charge_id, booked);
        let c = |id, status, amount| charge(&a, id, status, amount);
        let elsewhere = |charge: Charge| Charge { account: Some("acct_other".into()), ..charge };
        let cases = [
            ("unknown, charged", r(S::Unknown, None, None), c("ch_1", Charged, 100), "applied"),
            ("unknown, declined", r(S::Unknown, None, None), c("ch_1", Declined, 100), "applied"),
            ("unknown, another amount", r(S::Unknown, None, None), c("ch_1", Charged, 90), "conflict"),
            ("unknown, nothing charged", r(S::Unknown, None, None), c("ch_1", Charged, 0), "unbookable"),
            ("pending", r(S::Pending, None, None), c("ch_1", Charged, 100), "not_unknown"),
            ("processing", r(S::Processing, None, None), c("ch_1", Declined, 100), "not_unknown"),
            ("dead lettered", r(S::DeadLettered, None, None), c("ch_1", Charged, 100), "dead_lettered"),
            ("same success", r(S::Succeeded, Some("ch_1"), Some(100)), c("ch_1", Charged, 100), "already_terminal"),
            ("second charge", r(S::Succeeded, Some("ch_1"), Some(100)), c("ch_2", Charged, 100), "conflict"),
            ("other amount", r(S::Succeeded, Some("ch_1"), Some(100)), c("ch_1", Charged, 90), "conflict"),
            ("success, then declined", r(S::Succeeded, Some("ch_1"), Some(100)), c("ch_1", Declined, 100), "conflict"),
            ("declined, then charged", r(S::Failed, Some("ch_1"), None), c("ch_1", Charged, 100), "conflict"),
            ("same decline", r(S::Failed, Some("ch_1"), None), c("ch_1", Declined, 100), "already_terminal"),
            ("decline without charge id", r(S::Failed, None, None), c("ch_1", Declined, 100), "already_terminal"),
            ("another declined charge", r(S::Failed, Some("ch_1"), None), c("ch_2", Declined, 100), "conflict"),
            (
                "unknown, charged in another account",
                r(S::Unknown, None, None),
                elsewhere(c("ch_1", Charged, 100)),
                "other_account",
            ),
            (
                "succeeded, its charge reported by another account",
                r(S::Succeeded, Some("ch_1"), Some(100)),
                elsewhere(c("ch_1", Charged, 100)),
                "other_account",
            ),
            (
                "failed, a success reported by another account",
                r(S::Failed, Some("ch_1"), None),
                elsewhere(c("ch_1", Charged, 100)),
                "other_account",
            ),
            (
                "processing, from another account",
                r(S::Processing, None, None),
                elsewhere(c("ch_1", Charged, 100)),
                "other_account",
            ),
            (
                "dead lettered, from another account",
                r(S::DeadLettered, None, None),
                elsewhere(c("ch_1", Charged, 100)),
                "other_account",
            ),
            (
                "unknown, unreadable from another account",
                r(S::Unknown, None, None),
                elsewhere(c("ch_1", Charged, 0)),
                "other_account",
            ),
        ];
        for (name, stored, charge, expected) in cases {
            assert_eq!(judge(&stored, &charge).label(), expected, "{name}");
        }
    }
}
