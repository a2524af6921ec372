//! Comparing the provider's refunds with oncepay's refunds and their ledger entries over one window:
//! pure, no I/O.
//!
//! Reports the refund classes of [`Class`] between finished refunds and the refund ledger, and the
//! refunds the provider has not finished ([`unfinished`]), and nothing else. A failed or canceled
//! refund moved no money: it is never reported by itself, and only explains a
//! `refund_missing_at_provider`.

use std::collections::{BTreeMap, HashMap};

use oncepay_domain::ids::{DownstreamKey, PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency, format_amount};
use oncepay_domain::refund_status::RefundStatus;
use oncepay_provider::{Refund, RefundState, metadata_keys};
use serde_json::{Value, json};
use time::OffsetDateTime;

use oncepay_store::recon_runs::{Class, Discrepancy};

/// A refund oncepay holds, as the comparison needs it: what it asked for and, once it succeeded,
/// its ledger entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OurRefund {
    /// The refund's owner.
    pub tenant_id: TenantId,
    /// The refund.
    pub refund_id: RefundId,
    /// The payment it gives money back from.
    pub payment_id: PaymentId,
    /// The payment's charge at the provider, when it was booked.
    pub charge_id: Option<String>,
    /// Where it stands at oncepay.
    pub status: RefundStatus,
    /// What it asked to give back.
    pub amount: Amount,
    /// In this currency.
    pub currency: Currency,
    /// Its ledger entry, once it succeeded.
    pub entry: Option<RefundEntry>,
}

/// A refund ledger entry, as the comparison needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundEntry {
    /// The provider's refund it books.
    pub provider_refund_id: String,
    /// What it books.
    pub amount: Amount,
    /// In this currency.
    pub currency: Currency,
    /// The provider's creation time of the refund.
    pub refunded_at: OffsetDateTime,
    /// Whether `refunded_at` is inside the window (else it is only here to be matched).
    pub in_window: bool,
}

/// The oncepay refund a provider's refund was made for (its tenant, when the metadata names it):
/// from the metadata oncepay puts on every refund, else from its downstream key.
pub fn refund_of(refund: &Refund) -> Option<(Option<TenantId>, RefundId)> {
    match refund.refund_ref() {
        Some((tenant, refund_id)) => Some((Some(tenant), refund_id)),
        None => refund.idempotency_key.as_deref().and_then(DownstreamKey::parse_refund_id).map(|id| (None, id)),
    }
}

/// The payment a provider's refund names in its metadata, if it names one.
pub fn payment_named(refund: &Refund) -> Option<PaymentId> {
    refund.metadata.get(metadata_keys::PAYMENT_ID)?.parse().ok()
}

/// Every discrepancy between the provider's refunds of the window (finished or not) and oncepay's
/// refunds.
///
/// `ours` holds every oncepay refund a provider's refund names, and every refund booked in the
/// window, each with its ledger entry if it has one (booked outside the window: `in_window` false),
/// so a refund created just inside the window and booked just outside it is not reported.
pub fn compare(refunds: &[Refund], ours: &[OurRefund]) -> Vec<Discrepancy> {
    let mut found = Vec::new();
    let by_refund_id: HashMap<RefundId, &OurRefund> = ours.iter().map(|o| (o.refund_id, o)).collect();
    let by_booked: Booked<'_> = ours
        .iter()
        .filter_map(|o| o.entry.as_ref().map(|entry| (entry.provider_refund_id.as_str(), (o, entry))))
        .collect();
    let (by_refund, unattributed) = succeeded_by_refund(refunds);
    for (refund_id, (tenant_id, group)) in &by_refund {
        // A refund naming another tenant than the one that holds the refund id is not that refund.
        match by_refund_id.get(refund_id).filter(|o| tenant_id.is_none_or(|t| t == o.tenant_id)) {
            Some(our) => check_refund(&mut found, our, group),
            None => {
                for refund in group {
                    let why = format!("names refund {refund_id}, which oncepay does not have");
                    booked_or_unrequested(&mut found, &by_booked, refund, &why);
                }
            }
        }
    }
    for refund in unattributed {
        booked_or_unrequested(&mut found, &by_booked, refund, "names no oncepay refund");
    }
    check_ledger(&mut found, refunds, ours);
    found
}

/// The refunds booked in the ledger, by the provider's refund each entry books.
type Booked<'a> = HashMap<&'a str, (&'a OurRefund, &'a RefundEntry)>;

/// An oncepay refund's succeeded provider refunds, and the tenant they name.
type RefundGroup<'a> = (Option<TenantId>, Vec<&'a Refund>);

/// The succeeded refunds by the oncepay refund they name (sorted for a stable report), and those
/// naming none.
fn succeeded_by_refund(refunds: &[Refund]) -> (BTreeMap<RefundId, RefundGroup<'_>>, Vec<&Refund>) {
    let mut by_refund: BTreeMap<RefundId, RefundGroup<'_>> = BTreeMap::new();
    let mut unattributed = Vec::new();
    for refund in refunds.iter().filter(|r| r.status == RefundState::Succeeded) {
        match refund_of(refund) {
            Some((tenant, refund_id)) => {
                let group = by_refund.entry(refund_id).or_insert((tenant, Vec::new()));
                group.0 = group.0.or(tenant);
                group.1.push(refund);
            }
            None => unattributed.push(refund),
        }
    }
    (by_refund, unattributed)
}

/// One oncepay refund's succeeded provider refunds (`group`, never empty) against its ledger entry,
/// if it has one.
fn check_refund(found: &mut Vec<Discrepancy>, our: &OurRefund, group: &[&Refund]) {
    if group.len() > 1 {
        let ids: Vec<&str> = group.iter().map(|r| r.id.as_str()).collect();
        let detail = format!("{} succeeded refunds for one refund: {}", group.len(), ids.join(", "));
        found.push(Discrepancy {
            theirs: Some(Value::Array(group.iter().map(|r| theirs(r)).collect())),
            ..about(Class::DuplicateRefund, Some(our), Some(group[0]), detail)
        });
    }
    let Some(entry) = &our.entry else {
        let detail = format!(
            "the provider refunded {} for this refund, and the ledger has no entry for it (the refund is {} at \
             oncepay)",
            group[0].id,
            our.status.as_str()
        );
        found.push(about(Class::RefundMissingInLedger, Some(our), Some(group[0]), detail));
        return;
    };
    for refund in group.iter().filter(|r| r.id == entry.provider_refund_id) {
        check_money(found, our, entry, refund);
    }
    // A single refund the entry does not book is unbooked money; extra refunds of a duplicate are
    // already reported above.
    if group.len() == 1 && group[0].id != entry.provider_refund_id {
        let detail = format!(
            "the provider refunded {} for this refund, but the ledger books refund {}",
            group[0].id, entry.provider_refund_id
        );
        found.push(about(Class::RefundMissingInLedger, Some(our), Some(group[0]), detail));
    }
}

/// A succeeded refund that no oncepay refund it names accounts for: compared with the entry that
/// books it, if one does, else reported as unrequested (`why` says what it names).
fn booked_or_unrequested(found: &mut Vec<Discrepancy>, by_booked: &Booked<'_>, refund: &Refund, why: &str) {
    match by_booked.get(refund.id.as_str()) {
        Some((our, entry)) => check_money(found, our, entry, refund),
        None => {
            let detail = format!(
                "the provider refunded {} {} as {}, which {why}: nobody at oncepay asked for it",
                refund.amount, refund.currency, refund.id
            );
            found.push(about(Class::UnrequestedRefund, None, Some(refund), detail));
        }
    }
}

/// The ledger's entries in the window whose refund the provider does not list as succeeded.
fn check_ledger(found: &mut Vec<Discrepancy>, refunds: &[Refund], ours: &[OurRefund]) {
    let by_id: HashMap<&str, &Refund> = refunds.iter().map(|r| (r.id.as_str(), r)).collect();
    for our in ours {
        let Some(entry) = our.entry.as_ref().filter(|e| e.in_window) else { continue };
        let booked = &entry.provider_refund_id;
        let refund = by_id.get(booked.as_str()).copied();
        let detail = match refund.map(|r| r.status) {
            Some(RefundState::Succeeded) => continue,
            Some(RefundState::Pending) => {
                format!("the ledger books refund {booked}, which the provider has not finished")
            }
            Some(RefundState::Failed) => {
                format!("the ledger books refund {booked}, which the provider reports as failed")
            }
            Some(RefundState::Canceled) => {
                format!("the ledger books refund {booked}, which the provider reports as canceled")
            }
            None => format!("the ledger books refund {booked}, which the provider does not list in the window"),
        };
        found.push(about(Class::RefundMissingAtProvider, Some(our), refund, detail));
    }
}

fn check_money(found: &mut Vec<Discrepancy>, our: &OurRefund, entry: &RefundEntry, refund: &Refund) {
    if entry.amount.minor_units() != refund.amount || entry.currency.as_str() != refund.currency {
        let detail = format!(
            "the ledger books {} for refund {}, the provider refunded {}",
            format_amount(entry.amount.minor_units(), entry.currency.as_str()),
            refund.id,
            format_amount(refund.amount, &refund.currency)
        );
        found.push(about(Class::RefundAmountOrCurrencyMismatch, Some(our), Some(refund), detail));
    }
}

/// The discrepancy of a refund the provider has not finished.
pub fn unfinished(refund: &Refund) -> Discrepancy {
    let detail = format!(
        "the provider has not finished refund {} ({} {}); the money may still go back, and it is read again on \
         every run until it is final",
        refund.id, refund.amount, refund.currency
    );
    about(Class::RefundUnfinished, None, Some(refund), detail)
}

/// A discrepancy of `class` about `our` refund and the provider's `refund`, as far as each is known:
/// the ids from our side first, else from what the provider's refund names; the provider's refund
/// is the one it shows, else the one our entry books.
fn about(class: Class, our: Option<&OurRefund>, refund: Option<&Refund>, detail: String) -> Discrepancy {
    let named = refund.and_then(refund_of);
    let charge = refund.map(|r| r.charge.clone()).filter(|c| !c.is_empty());
    let booked = our.and_then(|o| o.entry.as_ref()).map(|e| e.provider_refund_id.clone());
    Discrepancy {
        class,
        tenant_id: our.map(|o| o.tenant_id).or(named.and_then(|(tenant, _)| tenant)),
        payment_id: our.map(|o| o.payment_id).or(refund.and_then(payment_named)),
        provider_charge_id: charge.or(our.and_then(|o| o.charge_id.clone())),
        refund_id: our.map(|o| o.refund_id).or(named.map(|(_, refund_id)| refund_id)),
        provider_refund_id: refund.map(|r| r.id.clone()).or(booked),
        ours: our.map(ours),
        theirs: refund.map(theirs),
        detail,
    }
}

fn ours(our: &OurRefund) -> Value {
    json!({
        "refund_id": our.refund_id,
        "status": our.status,
        "amount": our.amount,
        "currency": our.currency,
        "ledger_entry": our.entry.as_ref().map(|entry| json!({
            "provider_refund_id": entry.provider_refund_id,
            "amount": entry.amount,
            "currency": entry.currency,
            "refunded_at": oncepay_ops::render::timestamp(entry.refunded_at),
        })),
    })
}

fn theirs(refund: &Refund) -> Value {
    json!({
        "id": refund.id,
        "status": refund.status,
        "charge": refund.charge,
        "amount": refund.amount,
        "currency": refund.currency,
        "created": refund.created,
        "idempotency_key": refund.idempotency_key,
        "account": refund.account,
    })
}

#[cfg(test)]
mod tests {
    use oncepay_provider::fixtures;

    use super::*;

    const T0: i64 = fixtures::CREATED;

    /// One oncepay refund of a payment of a tenant.
    #[derive(Clone, Copy)]
    struct Ids {
        tenant: TenantId,
        payment: PaymentId,
        refund: RefundId,
    }

    fn ids() -> Ids {
        Ids { tenant: TenantId::generate(), payment: PaymentId::generate(), refund: RefundId::generate() }
    }

    /// A provider's refund of 100 EUR cents of `ch_1` made for `ours` (with oncepay's metadata), or for
    /// nobody at oncepay (no metadata, a key of someone else's).
    fn refund(id: &str, ours: Option<Ids>, status: RefundState, amount: i64) -> Refund {
        match ours {
            Some(ids) => {
                let mut metadata = fixtures::metadata(ids.tenant, ids.payment);
                metadata.insert(metadata_keys::REFUND_ID.to_owned(), ids.refund.to_string());
                Refund { metadata, ..fixtures::refund(ids.refund, id, "ch_1", status, amount) }
            }
            None => Refund {
                idempotency_key: Some("dashboard-key".to_owned()),
                ..fixtures::refund(RefundId::generate(), id, "ch_1", status, amount)
            },
        }
    }

    /// `ids`'s refund at oncepay, `status`, with a ledger entry booking `booked` (id, amount, in the
    /// window) when it has one.
    fn ours(ids: Ids, status: RefundStatus, booked: Option<(&str, i64, bool)>) -> OurRefund {
        OurRefund {
            tenant_id: ids.tenant,
            refund_id: ids.refund,
            payment_id: ids.payment,
            charge_id: Some("ch_1".to_owned()),
            status,
            amount: Amount::new(100).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            entry: booked.map(|(id, amount, in_window)| RefundEntry {
                provider_refund_id: id.to_owned(),
                amount: Amount::new(amount).unwrap(),
                currency: Currency::parse("EUR").unwrap(),
                refunded_at: OffsetDateTime::from_unix_timestamp(T0).unwrap(),
                in_window,
            }),
        }
    }

    fn booked(ids: Ids, id: &str, amount: i64) -> OurRefund {
        ours(ids, RefundStatus::Succeeded, Some((id, amount, true)))
    }

    fn classes(found: &[Discrepancy]) -> Vec<(Class, Option<&str>)> {
        let mut classes: Vec<_> = found.iter().map(|d| (d.class, d.provider_refund_id.as_deref())).collect();
        classes.sort();
        classes
    }

    #[test]
    fn matching_sides_and_refunds_that_moved_no_money_report_nothing() {
        let (ok, failed, canceled) = (ids(), ids(), ids());
        let refunds = [
            refund("re_ok", Some(ok), RefundState::Succeeded, 100),
            refund("re_failed", Some(failed), RefundState::Failed, 100),
            refund("re_canceled", Some(canceled), RefundState::Canceled, 100),
            refund("re_foreign_failed", None, RefundState::Failed, 7),
        ];
        let ours = [
            booked(ok, "re_ok", 100),
            ours(failed, RefundStatus::Failed, None),
            ours(canceled, RefundStatus::Failed, None),
        ];

        assert_eq!(compare(&refunds, &ours), []);
    }

    #[test]
    fn each_refund_class_is_found_once_and_nothing_else() {
        let (ok, unbooked, vanished, other_money, twice, never_asked, edge) =
            (ids(), ids(), ids(), ids(), ids(), ids(), ids());
        let refunds = [
            refund("re_ok", Some(ok), RefundState::Succeeded, 100),
            refund("re_unbooked", Some(unbooked), RefundState::Succeeded, 100),
            refund("re_money", Some(other_money), RefundState::Succeeded, 90),
            refund("re_twice_1", Some(twice), RefundState::Succeeded, 100),
            refund("re_twice_2", Some(twice), RefundState::Succeeded, 100),
            refund("re_dashboard", None, RefundState::Succeeded, 7),
            refund("re_made_up", Some(never_asked), RefundState::Succeeded, 100),
            refund("re_edge", Some(edge), RefundState::Succeeded, 100),
        ];
        let ours = [
            booked(ok, "re_ok", 100),
            ours(unbooked, RefundStatus::Unknown, None),
            booked(vanished, "re_vanished", 100),
            booked(other_money, "re_money", 100),
            booked(twice, "re_twice_1", 100),
            // Booked just outside the window: matched, not reported.
            ours(edge, RefundStatus::Succeeded, Some(("re_edge", 100, false))),
        ];

        let found = compare(&refunds, &ours);

        assert_eq!(
            classes(&found),
            [
                (Class::RefundMissingInLedger, Some("re_unbooked")),
                (Class::RefundMissingAtProvider, Some("re_vanished")),
                (Class::RefundAmountOrCurrencyMismatch, Some("re_money")),
                (Class::DuplicateRefund, Some("re_twice_1")),
                (Class::UnrequestedRefund, Some("re_dashboard")),
                (Class::UnrequestedRefund, Some("re_made_up")),
            ]
        );
        let unbooked_discrepancy = found.iter().find(|d| d.class == Class::RefundMissingInLedger).unwrap();
        assert_eq!(
            (unbooked_discrepancy.tenant_id, unbooked_discrepancy.payment_id, unbooked_discrepancy.refund_id),
            (Some(unbooked.tenant), Some(unbooked.payment), Some(unbooked.refund))
        );
        assert_eq!(unbooked_discrepancy.provider_charge_id.as_deref(), Some("ch_1"));
        assert!(unbooked_discrepancy.detail.contains("unknown at oncepay"), "{}", unbooked_discrepancy.detail);
        let duplicate = found.iter().find(|d| d.class == Class::DuplicateRefund).unwrap();
        assert!(duplicate.detail.contains("re_twice_2"), "{}", duplicate.detail);
        let made_up = found.iter().find(|d| d.provider_refund_id.as_deref() == Some("re_made_up")).unwrap();
        assert_eq!(made_up.refund_id, Some(never_asked.refund), "names the refund it claims to be");
        assert!(made_up.ours.is_none());
    }

    #[test]
    fn an_entry_whose_refund_the_provider_failed_canceled_or_has_not_finished_is_missing_at_provider() {
        for (status, words) in [
            (RefundState::Failed, "reports as failed"),
            (RefundState::Canceled, "reports as canceled"),
            (RefundState::Pending, "has not finished"),
        ] {
            let r = ids();

            let found = compare(&[refund("re_1", Some(r), status, 100)], &[booked(r, "re_1", 100)]);

            assert_eq!(classes(&found), [(Class::RefundMissingAtProvider, Some("re_1"))], "{status:?}");
            assert!(found[0].detail.contains(words), "{}", found[0].detail);
        }
    }

    #[test]
    fn a_refund_succeeded_at_the_provider_and_failed_at_oncepay_is_missing_in_the_ledger() {
        let r = ids();

        let found =
            compare(&[refund("re_1", Some(r), RefundState::Succeeded, 100)], &[ours(r, RefundStatus::Failed, None)]);

        assert_eq!(classes(&found), [(Class::RefundMissingInLedger, Some("re_1"))]);
        assert!(found[0].detail.contains("failed at oncepay"), "{}", found[0].detail);
    }

    #[test]
    fn an_entry_booking_another_refund_than_the_provider_holds_is_reported_on_both_sides() {
        let r = ids();

        let found = compare(&[refund("re_real", Some(r), RefundState::Succeeded, 100)], &[booked(r, "re_booked", 100)]);

        assert_eq!(
            classes(&found),
            [(Class::RefundMissingInLedger, Some("re_real")), (Class::RefundMissingAtProvider, Some("re_booked"))]
        );
    }

    #[test]
    fn a_duplicate_with_no_entry_at_all_is_also_missing_in_the_ledger_once() {
        let r = ids();
        let refunds = [
            refund("re_1", Some(r), RefundState::Succeeded, 100),
            refund("re_2", Some(r), RefundState::Succeeded, 100),
        ];

        assert_eq!(
            classes(&compare(&refunds, &[ours(r, RefundStatus::Unknown, None)])),
            [(Class::RefundMissingInLedger, Some("re_1")), (Class::DuplicateRefund, Some("re_1"))]
        );
    }

    #[test]
    fn a_refund_naming_another_tenants_refund_is_unrequested() {
        let r = ids();
        let claimed = Ids { tenant: TenantId::generate(), ..r };

        let found = compare(&[refund("re_1", Some(claimed), RefundState::Succeeded, 100)], &[booked(r, "re_2", 100)]);

        assert_eq!(
            classes(&found),
            [(Class::RefundMissingAtProvider, Some("re_2")), (Class::UnrequestedRefund, Some("re_1"))]
        );
    }

    #[test]
    fn a_refund_found_only_by_its_key_is_matched_to_its_refund() {
        let r = ids();
        let mut keyed = refund("re_1", Some(r), RefundState::Succeeded, 100);
        keyed.metadata.clear();

        let found = compare(&[keyed], &[ours(r, RefundStatus::Unknown, None)]);

        assert_eq!(classes(&found), [(Class::RefundMissingInLedger, Some("re_1"))]);
        assert_eq!((found[0].tenant_id, found[0].refund_id), (Some(r.tenant), Some(r.refund)));
    }

    #[test]
    fn a_refund_naming_nothing_is_matched_by_the_entry_that_books_it() {
        let r = ids();
        // Neither metadata nor a key of ours: only the ledger entry that books it says whose it is.
        let unnamed = Refund { idempotency_key: None, ..refund("re_1", None, RefundState::Succeeded, 90) };

        let found = compare(&[unnamed], &[booked(r, "re_1", 100)]);

        assert_eq!(classes(&found), [(Class::RefundAmountOrCurrencyMismatch, Some("re_1"))]);
        assert_eq!(found[0].refund_id, Some(r.refund));
    }

    #[test]
    fn a_refund_the_provider_has_not_finished_names_what_it_is_for() {
        let r = ids();

        let found = unfinished(&refund("re_1", Some(r), RefundState::Pending, 100));

        assert_eq!(found.class, Class::RefundUnfinished);
        assert_eq!(
            (found.tenant_id, found.payment_id, found.refund_id, found.provider_refund_id.as_deref()),
            (Some(r.tenant), Some(r.payment), Some(r.refund), Some("re_1"))
        );
        assert_eq!(found.provider_charge_id.as_deref(), Some("ch_1"));
        assert!(found.detail.contains("read again on every run"), "{}", found.detail);
    }
}
