//! Comparing the provider's charges with the ledger over one window: pure, no I/O. The classes and
//! the discrepancy it reports, which the refunds' comparison ([`super::refunds`]) reports too, are
//! stored as [`oncepay_store::recon_runs`] says.
//!
//! Reports the four classes of discrepancy between finished charges and the ledger ([`Class`]), and
//! the charges the provider has not finished ([`unfinished`]), and nothing else.

use std::collections::{BTreeMap, HashMap};

use oncepay_domain::ids::{DownstreamKey, PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency, format_amount};
use oncepay_provider::{Charge, ChargeStatus, UnfinishedCharge};
use serde_json::{Value, json};
use time::OffsetDateTime;

use oncepay_store::recon_runs::{Class, Discrepancy};

/// A ledger entry, as the comparison needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// The payment's owner.
    pub tenant_id: TenantId,
    /// The payment.
    pub payment_id: PaymentId,
    /// The charge it books.
    pub provider_charge_id: String,
    /// What it books.
    pub amount: Amount,
    /// In this currency.
    pub currency: Currency,
    /// The provider's creation time of the charge.
    pub charged_at: OffsetDateTime,
    /// Whether `charged_at` is inside the window (else it is only here to be matched).
    pub in_window: bool,
}

/// The payment a charge was made for (its tenant, when the metadata names it): from the metadata
/// oncepay puts on every charge, else from its downstream key.
pub fn payment_of(charge: &Charge) -> Option<(Option<TenantId>, PaymentId)> {
    match charge.payment_ref() {
        Some((tenant, payment)) => Some((Some(tenant), payment)),
        None => DownstreamKey::parse_payment_id(&charge.idempotency_key).map(|payment| (None, payment)),
    }
}

fn ours(entry: &LedgerEntry) -> Value {
    json!({
        "provider_charge_id": entry.provider_charge_id,
        "amount": entry.amount,
        "currency": entry.currency,
        "charged_at": oncepay_ops::render::timestamp(entry.charged_at),
    })
}

fn theirs(charge: &Charge) -> Value {
    json!({
        "id": charge.id,
        "status": charge.status,
        "amount": charge.amount,
        "currency": charge.currency,
        "created": charge.created,
        "idempotency_key": charge.idempotency_key,
    })
}

/// Every discrepancy between the provider's charges created in the window and the ledger.
///
/// `ledger` also holds the entries of the payments the charges name, booked outside the window
/// (`in_window` false), so a charge created just inside the window and booked just outside it is
/// not reported.
pub fn compare(charges: &[Charge], ledger: &[LedgerEntry]) -> Vec<Discrepancy> {
    let mut found = Vec::new();
    let entry_of_payment: HashMap<PaymentId, &LedgerEntry> = ledger.iter().map(|e| (e.payment_id, e)).collect();
    let entry_of_charge: HashMap<&str, &LedgerEntry> =
        ledger.iter().map(|e| (e.provider_charge_id.as_str(), e)).collect();
    let (by_payment, unattributed) = succeeded_by_payment(charges);
    for (&payment_id, (tenant_id, group)) in &by_payment {
        let entry = entry_of_payment.get(&payment_id).copied();
        check_payment(&mut found, payment_id, tenant_id.or(entry.map(|e| e.tenant_id)), group, entry);
    }
    for charge in unattributed {
        match entry_of_charge.get(charge.id.as_str()) {
            Some(entry) => check_money(&mut found, entry, charge),
            None => found.push(missing_in_ledger(
                None,
                None,
                charge,
                None,
                format!("the provider charged {}, which names no oncepay payment and is in no ledger entry", charge.id),
            )),
        }
    }
    check_ledger(&mut found, charges, ledger);
    found
}

/// A payment's succeeded charges, and the tenant they name.
type PaymentCharges<'a> = (Option<TenantId>, Vec<&'a Charge>);

/// The succeeded charges by payment (sorted for a stable report), and those naming no payment.
/// Failed charges are not money: they only explain a `missing_at_provider` ([`check_ledger`]).
fn succeeded_by_payment(charges: &[Charge]) -> (BTreeMap<PaymentId, PaymentCharges<'_>>, Vec<&Charge>) {
    let mut by_payment: BTreeMap<PaymentId, PaymentCharges<'_>> = BTreeMap::new();
    let mut unattributed = Vec::new();
    for charge in charges.iter().filter(|c| c.status == ChargeStatus::Succeeded) {
        match payment_of(charge) {
            Some((tenant, payment)) => {
                let group = by_payment.entry(payment).or_insert((tenant, Vec::new()));
                group.0 = group.0.or(tenant);
                group.1.push(charge);
            }
            None => unattributed.push(charge),
        }
    }
    (by_payment, unattributed)
}

/// One payment's succeeded charges (`group`, never empty) against its ledger entry, if it has one.
fn check_payment(
    found: &mut Vec<Discrepancy>,
    payment_id: PaymentId,
    tenant_id: Option<TenantId>,
    group: &[&Charge],
    entry: Option<&LedgerEntry>,
) {
    if group.len() > 1 {
        let ids: Vec<&str> = group.iter().map(|c| c.id.as_str()).collect();
        found.push(Discrepancy {
            class: Class::DuplicateCharge,
            tenant_id,
            payment_id: Some(payment_id),
            provider_charge_id: Some(group[0].id.clone()),
            refund_id: None,
            provider_refund_id: None,
            ours: entry.map(ours),
            theirs: Some(Value::Array(group.iter().map(|c| theirs(c)).collect())),
            detail: format!("{} succeeded charges for one payment: {}", group.len(), ids.join(", ")),
        });
    }
    let Some(entry) = entry else {
        let detail =
            format!("the provider charged {} for this payment, and the ledger has no entry for it", group[0].id);
        found.push(missing_in_ledger(tenant_id, Some(payment_id), group[0], None, detail));
        return;
    };
    for charge in group.iter().filter(|c| c.id == entry.provider_charge_id) {
        check_money(found, entry, charge);
    }
    // A single charge the entry does not book is unbooked money; extra charges of a duplicate are
    // already reported above.
    if group.len() == 1 && group[0].id != entry.provider_charge_id {
        let detail = format!(
            "the provider charged {} for this payment, but the ledger books charge {}",
            group[0].id, entry.provider_charge_id
        );
        found.push(missing_in_ledger(tenant_id, Some(payment_id), group[0], Some(entry), detail));
    }
}

/// The ledger's entries in the window whose charge the provider does not list as succeeded.
fn check_ledger(found: &mut Vec<Discrepancy>, charges: &[Charge], ledger: &[LedgerEntry]) {
    let by_id: HashMap<&str, &Charge> = charges.iter().map(|c| (c.id.as_str(), c)).collect();
    for entry in ledger.iter().filter(|e| e.in_window) {
        let charge = by_id.get(entry.provider_charge_id.as_str()).copied();
        let detail = match charge {
            Some(charge) if charge.status == ChargeStatus::Succeeded => continue,
            Some(_) => {
                format!("the ledger books charge {}, which the provider reports as failed", entry.provider_charge_id)
            }
            None => format!(
                "the ledger books charge {}, which the provider does not list in the window",
                entry.provider_charge_id
            ),
        };
        found.push(Discrepancy {
            class: Class::MissingAtProvider,
            tenant_id: Some(entry.tenant_id),
            payment_id: Some(entry.payment_id),
            provider_charge_id: Some(entry.provider_charge_id.clone()),
            refund_id: None,
            provider_refund_id: None,
            ours: Some(ours(entry)),
            theirs: charge.map(theirs),
            detail,
        });
    }
}

/// The discrepancy of a charge the provider has not finished.
pub fn unfinished(charge: &UnfinishedCharge) -> Discrepancy {
    let (tenant_id, payment_id) = charge.payment_ref();
    Discrepancy {
        class: Class::Unfinished,
        tenant_id,
        payment_id,
        provider_charge_id: Some(charge.id.clone()),
        refund_id: None,
        provider_refund_id: None,
        ours: None,
        theirs: Some(json!({
            "id": charge.id,
            "status": charge.status,
            "amount": charge.amount,
            "currency": charge.currency,
            "created": charge.created,
            "account": charge.account,
        })),
        detail: format!(
            "the provider has not finished charge {} ({}); it may still take money, and is read again on every \
             run until it is final",
            charge.id, charge.status
        ),
    }
}

fn missing_in_ledger(
    tenant_id: Option<TenantId>,
    payment_id: Option<PaymentId>,
    charge: &Charge,
    entry: Option<&LedgerEntry>,
    detail: String,
) -> Discrepancy {
    Discrepancy {
        class: Class::MissingInLedger,
        tenant_id,
        payment_id,
        provider_charge_id: Some(charge.id.clone()),
        refund_id: None,
        provider_refund_id: None,
        ours: entry.map(ours),
        theirs: Some(theirs(charge)),
        detail,
    }
}

fn check_money(found: &mut Vec<Discrepancy>, entry: &LedgerEntry, charge: &Charge) {
    if entry.amount.minor_units() != charge.amount || entry.currency.as_str() != charge.currency {
        found.push(Discrepancy {
            class: Class::AmountOrCurrencyMismatch,
            tenant_id: Some(entry.tenant_id),
            payment_id: Some(entry.payment_id),
            provider_charge_id: Some(charge.id.clone()),
            refund_id: None,
            provider_refund_id: None,
            ours: Some(ours(entry)),
            theirs: Some(theirs(charge)),
            detail: format!(
                "the ledger books {} for charge {}, the provider charged {}",
                format_amount(entry.amount.minor_units(), entry.currency.as_str()),
                charge.id,
                format_amount(charge.amount, &charge.currency)
            ),
        });
    }
}

#[cfg(test)]
mod tests {
    use oncepay_provider::fixtures;

    use super::*;

    const T0: i64 = 1_763_800_000;

    fn charge(id: &str, payment: Option<(TenantId, PaymentId)>, status: ChargeStatus, amount: i64) -> Charge {
        match payment {
            Some((t, p)) => Charge { metadata: fixtures::metadata(t, p), ..fixtures::charge(p, id, status, amount) },
            None => Charge {
                idempotency_key: "foreign-key".to_owned(),
                ..fixtures::charge(PaymentId::generate(), id, status, amount)
            },
        }
    }

    fn entry(payment: (TenantId, PaymentId), charge_id: &str, amount: i64, in_window: bool) -> LedgerEntry {
        LedgerEntry {
            tenant_id: payment.0,
            payment_id: payment.1,
            provider_charge_id: charge_id.to_owned(),
            amount: Amount::new(amount).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            charged_at: OffsetDateTime::from_unix_timestamp(T0).unwrap(),
            in_window,
        }
    }

    fn payment() -> (TenantId, PaymentId) {
        (TenantId::generate(), PaymentId::generate())
    }

    fn classes(found: &[Discrepancy]) -> Vec<(Class, Option<&str>)> {
        let mut classes: Vec<_> = found.iter().map(|d| (d.class, d.provider_charge_id.as_deref())).collect();
        classes.sort();
        classes
    }

    #[test]
    fn matching_sides_and_declines_report_nothing() {
        let (a, b) = (payment(), payment());
        let charges =
            [charge("ch_a", Some(a), ChargeStatus::Succeeded, 100), charge("ch_b", Some(b), ChargeStatus::Failed, 50)];

        assert_eq!(compare(&charges, &[entry(a, "ch_a", 100, true)]), []);
    }

    #[test]
    fn each_class_is_found_once_and_nothing_else() {
        let (ok, unbooked, vanished, other_money, twice, booked_elsewhere) =
            (payment(), payment(), payment(), payment(), payment(), payment());
        let charges = [
            charge("ch_ok", Some(ok), ChargeStatus::Succeeded, 100),
            charge("ch_unbooked", Some(unbooked), ChargeStatus::Succeeded, 100),
            charge("ch_money", Some(other_money), ChargeStatus::Succeeded, 90),
            charge("ch_twice_1", Some(twice), ChargeStatus::Succeeded, 100),
            charge("ch_twice_2", Some(twice), ChargeStatus::Succeeded, 100),
            charge("ch_foreign", None, ChargeStatus::Succeeded, 7),
            charge("ch_edge", Some(booked_elsewhere), ChargeStatus::Succeeded, 100),
        ];
        let ledger = [
            entry(ok, "ch_ok", 100, true),
            entry(vanished, "ch_vanished", 100, true),
            entry(other_money, "ch_money", 100, true),
            entry(twice, "ch_twice_1", 100, true),
            // Booked just outside the window: matched, not reported.
            entry(booked_elsewhere, "ch_edge", 100, false),
        ];

        let found = compare(&charges, &ledger);

        assert_eq!(
            classes(&found),
            [
                (Class::MissingInLedger, Some("ch_foreign")),
                (Class::MissingInLedger, Some("ch_unbooked")),
                (Class::MissingAtProvider, Some("ch_vanished")),
                (Class::AmountOrCurrencyMismatch, Some("ch_money")),
                (Class::DuplicateCharge, Some("ch_twice_1")),
            ]
        );
        let unbooked_discrepancy =
            found.iter().find(|d| d.provider_charge_id.as_deref() == Some("ch_unbooked")).unwrap();
        assert_eq!(unbooked_discrepancy.payment_id, Some(unbooked.1));
        assert_eq!(unbooked_discrepancy.tenant_id, Some(unbooked.0));
    }

    #[test]
    fn an_entry_whose_charge_the_provider_reports_failed_is_missing_at_provider() {
        let p = payment();
        let found = compare(&[charge("ch_1", Some(p), ChargeStatus::Failed, 100)], &[entry(p, "ch_1", 100, true)]);
        assert_eq!(classes(&found), [(Class::MissingAtProvider, Some("ch_1"))]);
        assert!(found[0].detail.contains("failed"));
    }

    #[test]
    fn an_entry_booking_another_charge_than_the_provider_holds_is_reported_on_both_sides() {
        let p = payment();
        let found =
            compare(&[charge("ch_real", Some(p), ChargeStatus::Succeeded, 100)], &[entry(p, "ch_booked", 100, true)]);
        assert_eq!(
            classes(&found),
            [(Class::MissingInLedger, Some("ch_real")), (Class::MissingAtProvider, Some("ch_booked"))]
        );
    }

    #[test]
    fn a_duplicate_with_no_entry_at_all_is_also_missing_in_the_ledger_once() {
        let p = payment();
        let charges = [
            charge("ch_1", Some(p), ChargeStatus::Succeeded, 100),
            charge("ch_2", Some(p), ChargeStatus::Succeeded, 100),
        ];
        assert_eq!(
            classes(&compare(&charges, &[])),
            [(Class::MissingInLedger, Some("ch_1")), (Class::DuplicateCharge, Some("ch_1"))]
        );
    }

    #[test]
    fn a_charge_found_only_by_its_key_is_matched_to_its_payment() {
        let p = payment();
        let mut keyed = charge("ch_1", Some(p), ChargeStatus::Succeeded, 100);
        keyed.metadata.clear();
        assert_eq!(compare(&[keyed], &[entry(p, "ch_1", 100, true)]), []);
    }
}
