//! The provider's view of a payment beside oncepay's: the charges the provider holds for the
//! payment's downstream key, asked on demand, and every way the two disagree, stated plainly.
//!
//! Nothing here changes anything: the operator reads the contradiction and decides.

use oncepay_domain::money::format_amount;
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::{Charge, ChargeStatus};

/// What oncepay's ledger says about a payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ours<'a> {
    /// The payment's status.
    pub(super) status: PaymentStatus,
    /// What it asked for, in minor units.
    pub(super) amount: i64,
    /// In this currency.
    pub(super) currency: &'a str,
    /// The charge booked in the ledger, with its amount and currency.
    pub(super) booked: Option<(&'a str, i64, &'a str)>,
}

/// Every way the provider's charges contradict oncepay's ledger, one sentence each; none when they
/// agree.
pub(super) fn contradictions(ours: &Ours<'_>, theirs: &[Charge]) -> Vec<String> {
    let mut found = Vec::new();
    let taken: Vec<&Charge> = theirs.iter().filter(|c| c.status == ChargeStatus::Succeeded).collect();
    if taken.len() > 1 {
        let ids: Vec<&str> = taken.iter().map(|c| c.id.as_str()).collect();
        found.push(format!(
            "The provider took the money {} times for this one payment (charges {}): refund all but one.",
            taken.len(),
            ids.join(", ")
        ));
    }
    match ours.booked {
        Some((booked, amount, currency)) => match theirs.iter().find(|c| c.id == booked) {
            None => found.push(format!(
                "oncepay's ledger books charge {booked}, but the provider lists no such charge for this payment's \
                 key (past its key window the provider may no longer list it)."
            )),
            Some(charge) if charge.status != ChargeStatus::Succeeded => found.push(format!(
                "oncepay's ledger books charge {booked} as money taken, but the provider reports it as failed."
            )),
            Some(charge) if charge.amount != amount || !charge.currency.eq_ignore_ascii_case(currency) => {
                found.push(format!(
                    "oncepay's ledger books {} for charge {booked}, but the provider charged {}.",
                    format_amount(amount, currency),
                    format_amount(charge.amount, &charge.currency)
                ));
            }
            Some(_) => {}
        },
        None => {
            for charge in &taken {
                found.push(format!(
                    "The provider took {} with charge {}, but oncepay's ledger books no charge for this payment \
                     (it is {}).",
                    format_amount(charge.amount, &charge.currency),
                    charge.id,
                    ours.status.as_str()
                ));
            }
        }
    }
    if let Some(charge) =
        taken.iter().find(|c| c.amount != ours.amount || !c.currency.eq_ignore_ascii_case(ours.currency))
    {
        found.push(format!(
            "The payment asked for {} {}, but the provider's charge {} is for {} {}.",
            ours.amount, ours.currency, charge.id, charge.amount, charge.currency
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use oncepay_domain::ids::PaymentId;
    use oncepay_provider::fixtures;

    use super::*;

    fn charge(id: &str, status: ChargeStatus, amount: i64) -> Charge {
        fixtures::charge(PaymentId::generate(), id, status, amount)
    }

    fn ours(status: PaymentStatus, booked: Option<(&'static str, i64, &'static str)>) -> Ours<'static> {
        Ours { status, amount: 500, currency: "EUR", booked }
    }

    #[test]
    fn a_succeeded_payment_whose_charge_the_provider_holds_agrees() {
        let theirs = [charge("ch_1", ChargeStatus::Succeeded, 500)];
        assert!(contradictions(&ours(PaymentStatus::Succeeded, Some(("ch_1", 500, "EUR"))), &theirs).is_empty());
    }

    #[test]
    fn a_dead_letter_with_no_charge_at_the_provider_agrees() {
        assert!(contradictions(&ours(PaymentStatus::DeadLettered, None), &[]).is_empty());
        let declined = [charge("ch_1", ChargeStatus::Failed, 500)];
        assert!(contradictions(&ours(PaymentStatus::DeadLettered, None), &declined).is_empty());
    }

    #[test]
    fn money_taken_for_a_payment_the_ledger_does_not_book_is_stated() {
        let theirs = [charge("ch_9", ChargeStatus::Succeeded, 500)];
        let found = contradictions(&ours(PaymentStatus::DeadLettered, None), &theirs);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("ch_9") && found[0].contains("dead_lettered"), "{found:?}");
    }

    #[test]
    fn two_charges_for_one_payment_are_a_double_charge() {
        let theirs = [charge("ch_1", ChargeStatus::Succeeded, 500), charge("ch_2", ChargeStatus::Succeeded, 500)];
        let found = contradictions(&ours(PaymentStatus::Succeeded, Some(("ch_1", 500, "EUR"))), &theirs);
        assert!(found.iter().any(|line| line.contains("2 times")), "{found:?}");
    }

    #[test]
    fn a_booked_charge_the_provider_does_not_list_or_failed_or_for_other_money_is_stated() {
        let booked = ours(PaymentStatus::Succeeded, Some(("ch_1", 500, "EUR")));
        assert!(contradictions(&booked, &[])[0].contains("lists no such charge"));
        assert!(contradictions(&booked, &[charge("ch_1", ChargeStatus::Failed, 500)])[0].contains("failed"));
        let other_money = contradictions(&booked, &[charge("ch_1", ChargeStatus::Succeeded, 501)]);
        assert!(other_money.iter().any(|line| line.contains("charged 5.01 EUR")), "{other_money:?}");
    }
}
