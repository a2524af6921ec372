//! The ledger: every charge and refund the simulator ever made (failed and planted ones included)
//! and how many create POSTs each idempotency key received. It is the ground truth tests count from.
//!
//! Invariants: entries are only ever added, never changed or removed; ids are unique; listings are
//! ordered by `(created, id)`, so pagination with `starting_after` is stable even when many share a
//! second. Only a succeeded charge has refunds, each of a positive amount in the charge's currency,
//! and the refunds of a charge that may move money (not failed or canceled) never add up to more
//! than the charge: a refund that would break this is refused here, whoever asks. The ledger knows
//! nothing of idempotency windows, faults or HTTP.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use oncepay_provider::wire::{Charge, ChargePage, ChargeStatus, Refund, RefundPage, RefundState};

use crate::control::{GroundTruth, KeyRecord, RefundKeyRecord, RefundTruth};

/// The largest page a listing returns.
pub const MAX_PAGE: usize = 100;

/// The page size when none is asked for.
pub const DEFAULT_PAGE: usize = 10;

/// All charges and refunds, indexed for the protocol's lookups.
#[derive(Debug, Default)]
pub struct Ledger {
    charges: Book<Charge>,
    refunds: Book<Refund>,
    /// Per charge id, the refunds that may move money (not failed or canceled), in minor units.
    refunded: HashMap<String, i64>,
}

/// Filters of `GET /v1/charges` and `GET /v1/refunds`; all of them apply together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only objects made under this key.
    pub idempotency_key: Option<String>,
    /// `created >= created_gte`.
    pub created_gte: Option<i64>,
    /// `created < created_lt`.
    pub created_lt: Option<i64>,
    /// Only objects after this one in `(created, id)` order.
    pub starting_after: Option<String>,
    /// Page size, 1 ..= [`MAX_PAGE`].
    pub limit: usize,
}

/// `starting_after` names nothing of the kind listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("starting_after names nothing in this listing")]
pub struct UnknownCursor;

/// An entry with this id exists already.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an entry with id {0} exists already")]
pub struct DuplicateId(pub String);

/// Why a charge cannot be refunded (as asked).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unrefundable {
    /// No charge has that id.
    #[error("No such charge: {0}.")]
    NoSuchCharge(String),
    /// The charge failed: it took no money to give back.
    #[error("Charge {0} did not succeed, so there is nothing to refund.")]
    NotSucceeded(String),
    /// The refund is more than what is left of the charge.
    #[error("The refund is larger than what is left to refund of charge {charge} ({left}).")]
    AmountTooLarge {
        /// The charge.
        charge: String,
        /// What is left to refund, in minor units.
        left: i64,
    },
    /// Not a positive amount, or not in the charge's currency.
    #[error("{0}")]
    Malformed(&'static str),
}

impl Unrefundable {
    /// The protocol's error code.
    pub const fn code(&self) -> &'static str {
        match self {
            Self::NoSuchCharge(_) => "no_such_charge",
            Self::NotSucceeded(_) => "charge_not_refundable",
            Self::AmountTooLarge { .. } => "amount_too_large",
            Self::Malformed(_) => "invalid_request",
        }
    }
}

/// Why a refund was not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefundNotWritten {
    /// Its id is taken: draw another.
    #[error(transparent)]
    DuplicateId(#[from] DuplicateId),
    /// The charge cannot be refunded so.
    #[error(transparent)]
    Unrefundable(#[from] Unrefundable),
}

/// Whether a refund in this state may move money, and so counts against its charge.
const fn holds_money(status: RefundState) -> bool {
    matches!(status, RefundState::Pending | RefundState::Succeeded)
}

impl Ledger {
    /// Whether a charge has this id.
    pub fn contains(&self, id: &str) -> bool {
        self.charges.by_id.contains_key(id)
    }

    /// Adds a charge.
    pub fn insert(&mut self, charge: Charge) -> Result<(), DuplicateId> {
        self.charges.insert(charge)
    }

    /// Counts one charge POST that carried `key`.
    pub fn count_post(&mut self, key: &str) {
        self.charges.count_post(key);
    }

    /// The charge with this id.
    pub fn get(&self, id: &str) -> Option<&Charge> {
        self.charges.get(id)
    }

    /// One page of the charges matching `query`, oldest first, ties broken by id.
    pub fn list(&self, query: &ListQuery) -> Result<ChargePage, UnknownCursor> {
        let (data, has_more) = self.charges.list(query, |_| true)?;
        Ok(ChargePage { data, has_more, unfinished: Vec::new() })
    }

    /// The charge `charge_id` if `amount` of it can be refunded now.
    pub fn refundable(&self, charge_id: &str, amount: i64) -> Result<&Charge, Unrefundable> {
        let charge = self.get(charge_id).ok_or_else(|| Unrefundable::NoSuchCharge(charge_id.to_owned()))?;
        if charge.status != ChargeStatus::Succeeded {
            return Err(Unrefundable::NotSucceeded(charge.id.clone()));
        }
        if amount < 1 {
            return Err(Unrefundable::Malformed("A refund must be of a positive amount."));
        }
        let left = charge.amount - self.refunded.get(charge_id).copied().unwrap_or(0);
        if amount > left {
            return Err(Unrefundable::AmountTooLarge { charge: charge.id.clone(), left });
        }
        Ok(charge)
    }

    /// Adds a refund, if its charge can be refunded so: one that cannot be is never written,
    /// whatever its own status.
    pub fn insert_refund(&mut self, refund: Refund) -> Result<(), RefundNotWritten> {
        let charge = self.refundable(&refund.charge, refund.amount)?;
        if charge.currency != refund.currency {
            return Err(Unrefundable::Malformed("A refund must be in its charge's currency.").into());
        }
        let (charge_id, amount, status) = (refund.charge.clone(), refund.amount, refund.status);
        self.refunds.insert(refund)?;
        if holds_money(status) {
            *self.refunded.entry(charge_id).or_default() += amount;
        }
        Ok(())
    }

    /// Counts one refund POST that carried `key`.
    pub fn count_refund_post(&mut self, key: &str) {
        self.refunds.count_post(key);
    }

    /// The refund with this id.
    pub fn refund(&self, id: &str) -> Option<&Refund> {
        self.refunds.get(id)
    }

    /// One page of the refunds matching `query` (and of `charge`, if given), oldest first, ties
    /// broken by id.
    pub fn list_refunds(&self, query: &ListQuery, charge: Option<&str>) -> Result<RefundPage, UnknownCursor> {
        let (data, has_more) = self.refunds.list(query, |refund| charge.is_none_or(|c| refund.charge == c))?;
        Ok(RefundPage { data, has_more })
    }

    /// Every charge and every key's history of charges.
    pub fn ground_truth(&self) -> GroundTruth {
        let keys = self
            .charges
            .keys()
            .into_iter()
            .map(|(key, posts, charges)| KeyRecord { idempotency_key: key, posts, charges })
            .collect();
        GroundTruth { charges: self.charges.entries.clone(), keys }
    }

    /// Every refund and every key's history of refunds.
    pub fn refund_truth(&self) -> RefundTruth {
        let keys = self
            .refunds
            .keys()
            .into_iter()
            .map(|(key, posts, refunds)| RefundKeyRecord { idempotency_key: key, posts, refunds })
            .collect();
        RefundTruth { refunds: self.refunds.entries.clone(), keys }
    }
}

/// What the ledger indexes an object by.
trait Entry: Clone {
    fn id(&self) -> &str;
    fn created(&self) -> i64;
    /// The idempotency key it was made under, if it reports one.
    fn key(&self) -> Option<&str>;
}

impl Entry for Charge {
    fn id(&self) -> &str {
        &self.id
    }

    fn created(&self) -> i64 {
        self.created
    }

    fn key(&self) -> Option<&str> {
        Some(&self.idempotency_key)
    }
}

impl Entry for Refund {
    fn id(&self) -> &str {
        &self.id
    }

    fn created(&self) -> i64 {
        self.created
    }

    fn key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }
}

/// One kind of object, indexed, with the create POSTs of its keys counted.
#[derive(Debug)]
struct Book<T> {
    /// In the order they were made.
    entries: Vec<T>,
    by_id: HashMap<String, usize>,
    by_time: BTreeSet<(i64, String)>,
    by_key: HashMap<String, Vec<usize>>,
    posts: HashMap<String, u64>,
}

impl<T> Default for Book<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            by_id: HashMap::new(),
            by_time: BTreeSet::new(),
            by_key: HashMap::new(),
            posts: HashMap::new(),
        }
    }
}

impl<T: Entry> Book<T> {
    fn insert(&mut self, entry: T) -> Result<(), DuplicateId> {
        if self.by_id.contains_key(entry.id()) {
            return Err(DuplicateId(entry.id().to_owned()));
        }
        let index = self.entries.len();
        self.by_id.insert(entry.id().to_owned(), index);
        self.by_time.insert((entry.created(), entry.id().to_owned()));
        if let Some(key) = entry.key() {
            self.by_key.entry(key.to_owned()).or_default().push(index);
        }
        self.entries.push(entry);
        Ok(())
    }

    fn count_post(&mut self, key: &str) {
        *self.posts.entry(key.to_owned()).or_default() += 1;
    }

    fn get(&self, id: &str) -> Option<&T> {
        self.by_id.get(id).map(|&i| &self.entries[i])
    }

    /// One page of the entries matching `query` and `matches`, oldest first, ties broken by id;
    /// and whether more follow.
    fn list(&self, query: &ListQuery, matches: impl Fn(&T) -> bool) -> Result<(Vec<T>, bool), UnknownCursor> {
        let cursor = match &query.starting_after {
            Some(id) => Some(self.get(id).map(|e| (e.created(), e.id().to_owned())).ok_or(UnknownCursor)?),
            None => None,
        };
        let in_window = |key: &(i64, String)| {
            query.created_gte.is_none_or(|gte| key.0 >= gte)
                && query.created_lt.is_none_or(|lt| key.0 < lt)
                && cursor.as_ref().is_none_or(|c| key > c)
                && self.get(&key.1).is_some_and(&matches)
        };
        let limit = query.limit.clamp(1, MAX_PAGE);
        let mut matching: Vec<(i64, String)> = match &query.idempotency_key {
            Some(key) => {
                let mut keyed: Vec<(i64, String)> = self
                    .by_key
                    .get(key)
                    .into_iter()
                    .flatten()
                    .map(|&i| (self.entries[i].created(), self.entries[i].id().to_owned()))
                    .filter(|k| in_window(k))
                    .collect();
                keyed.sort();
                keyed.truncate(limit + 1);
                keyed
            }
            None => {
                let lower = match (&cursor, query.created_gte) {
                    (Some(c), _) => Bound::Excluded(c.clone()),
                    (None, Some(gte)) => Bound::Included((gte, String::new())),
                    (None, None) => Bound::Unbounded,
                };
                self.by_time
                    .range((lower, Bound::Unbounded))
                    .take_while(|k| query.created_lt.is_none_or(|lt| k.0 < lt))
                    .filter(|k| in_window(k))
                    .take(limit + 1)
                    .cloned()
                    .collect()
            }
        };
        let has_more = matching.len() > limit;
        matching.truncate(limit);
        Ok((matching.iter().filter_map(|(_, id)| self.get(id).cloned()).collect(), has_more))
    }

    /// Every key seen on a POST or on an entry, sorted: its POSTs and its entries' ids, oldest
    /// first.
    fn keys(&self) -> Vec<(String, u64, Vec<String>)> {
        let mut keys: BTreeMap<&str, (u64, Vec<String>)> = BTreeMap::new();
        for (key, &posts) in &self.posts {
            keys.entry(key).or_default().0 = posts;
        }
        for (key, indexes) in &self.by_key {
            keys.entry(key).or_default().1 = indexes.iter().map(|&i| self.entries[i].id().to_owned()).collect();
        }
        keys.into_iter().map(|(key, (posts, ids))| (key.to_owned(), posts, ids)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(id: &str, created: i64, key: &str) -> Charge {
        Charge {
            id: id.to_owned(),
            status: ChargeStatus::Succeeded,
            amount: 100,
            currency: "EUR".to_owned(),
            customer: "cus".to_owned(),
            idempotency_key: key.to_owned(),
            created,
            metadata: BTreeMap::new(),
            failure_code: None,
            failure_message: None,
            payment_method: None,
            account: None,
        }
    }

    /// Charges at t=10 (ch_b, ch_a, ch_c, inserted out of id order), t=20 (ch_d), t=30 (ch_e).
    fn ledger() -> Ledger {
        let mut ledger = Ledger::default();
        for (id, created, key) in
            [("ch_b", 10, "k1"), ("ch_d", 20, "k2"), ("ch_a", 10, "k3"), ("ch_e", 30, "k1"), ("ch_c", 10, "k4")]
        {
            ledger.insert(charge(id, created, key)).unwrap();
        }
        ledger
    }

    fn ids(page: &ChargePage) -> Vec<&str> {
        page.data.iter().map(|c| c.id.as_str()).collect()
    }

    #[test]
    fn listings_are_ordered_by_time_then_id_and_filtered() {
        let ledger = ledger();
        let query = |gte, lt, after: Option<&str>, key: Option<&str>, limit| ListQuery {
            idempotency_key: key.map(str::to_owned),
            created_gte: gte,
            created_lt: lt,
            starting_after: after.map(str::to_owned),
            limit,
        };
        let cases: [(&str, ListQuery, Vec<&str>, bool); 8] = [
            ("everything", query(None, None, None, None, 10), vec!["ch_a", "ch_b", "ch_c", "ch_d", "ch_e"], false),
            ("first page of ties", query(Some(10), Some(30), None, None, 2), vec!["ch_a", "ch_b"], true),
            ("inside the ties", query(Some(10), Some(30), Some("ch_b"), None, 2), vec!["ch_c", "ch_d"], false),
            ("lt excludes", query(Some(10), Some(20), Some("ch_c"), None, 2), vec![], false),
            ("gte includes", query(Some(20), None, None, None, 10), vec!["ch_d", "ch_e"], false),
            ("a cursor before the window", query(Some(20), None, Some("ch_a"), None, 10), vec!["ch_d", "ch_e"], false),
            ("by key", query(None, None, None, Some("k1"), 10), vec!["ch_b", "ch_e"], false),
            ("by key and window", query(Some(11), None, None, Some("k1"), 1), vec!["ch_e"], false),
        ];
        for (name, query, expected, has_more) in cases {
            let page = ledger.list(&query).unwrap();
            assert_eq!(ids(&page), expected, "{name}");
            assert_eq!(page.has_more, has_more, "{name}");
        }
    }

    #[test]
    fn an_unknown_key_lists_nothing_and_an_unknown_cursor_is_an_error() {
        let ledger = ledger();

        let none = ledger.list(&ListQuery { idempotency_key: Some("nope".into()), limit: 10, ..Default::default() });
        let bad = ledger.list(&ListQuery { starting_after: Some("ch_zz".into()), limit: 10, ..Default::default() });

        assert_eq!(none, Ok(ChargePage { data: vec![], has_more: false, unfinished: vec![] }));
        assert_eq!(bad, Err(UnknownCursor));
    }

    #[test]
    fn ids_are_unique_and_the_ground_truth_counts_posts_and_charges_per_key() {
        let mut ledger = ledger();
        ledger.count_post("k1");
        ledger.count_post("k1");
        ledger.count_post("k9");

        let duplicate = ledger.insert(charge("ch_a", 99, "k5"));
        let truth = ledger.ground_truth();

        assert_eq!(duplicate, Err(DuplicateId("ch_a".into())));
        assert_eq!(truth.charges.len(), 5);
        assert_eq!(truth.charges[0].id, "ch_b", "charges stay in the order they were made");
        let k1 = &truth.keys[0];
        assert_eq!(
            (k1.idempotency_key.as_str(), k1.posts, k1.charges.clone()),
            ("k1", 2, vec!["ch_b".into(), "ch_e".into()])
        );
        assert_eq!(truth.posts_with_key("k9"), 1);
        assert!(truth.charges_with_key("k9").is_empty());
        assert_eq!(truth.keys.len(), 5);
    }

    fn refund(id: &str, charge: &str, amount: i64, status: RefundState, key: &str) -> Refund {
        Refund {
            id: id.to_owned(),
            status,
            charge: charge.to_owned(),
            amount,
            currency: "EUR".to_owned(),
            idempotency_key: Some(key.to_owned()),
            created: 40,
            metadata: BTreeMap::new(),
            failure_reason: (status == RefundState::Failed).then(|| "declined".to_owned()),
            account: None,
        }
    }

    #[test]
    fn the_refunds_of_a_charge_that_may_move_money_never_exceed_it() {
        let mut ledger = ledger();
        let written = |r: &Result<(), RefundNotWritten>| r.is_ok();
        let too_large =
            |left| Err(RefundNotWritten::Unrefundable(Unrefundable::AmountTooLarge { charge: "ch_a".into(), left }));

        let first = ledger.insert_refund(refund("re_1", "ch_a", 60, RefundState::Succeeded, "r1"));
        let over = ledger.insert_refund(refund("re_2", "ch_a", 41, RefundState::Succeeded, "r2"));
        let failed_over = ledger.insert_refund(refund("re_3", "ch_a", 41, RefundState::Failed, "r3"));
        let failed = ledger.insert_refund(refund("re_4", "ch_a", 40, RefundState::Failed, "r4"));
        let pending = ledger.insert_refund(refund("re_5", "ch_a", 30, RefundState::Pending, "r5"));
        let rest = ledger.insert_refund(refund("re_6", "ch_a", 10, RefundState::Succeeded, "r6"));
        let nothing_left = ledger.insert_refund(refund("re_7", "ch_a", 1, RefundState::Succeeded, "r7"));

        assert!(written(&first) && written(&failed) && written(&pending) && written(&rest));
        assert_eq!(over, too_large(40));
        assert_eq!(failed_over, too_large(40), "a refund beyond the charge is refused before it can fail");
        assert_eq!(nothing_left, too_large(0));
        let truth = ledger.refund_truth();
        let ids: Vec<&str> = truth.refunds.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["re_1", "re_4", "re_5", "re_6"], "nothing refused was written");
        assert_eq!(truth.refunded("ch_a"), 100);
    }

    #[test]
    fn only_a_succeeded_charge_can_be_refunded_in_its_currency_by_a_positive_amount() {
        let mut ledger = ledger();
        ledger.insert(Charge { status: ChargeStatus::Failed, ..charge("ch_failed", 10, "k9") }).unwrap();
        let cases = [
            (refund("re_1", "ch_nothing", 1, RefundState::Succeeded, "r"), "no_such_charge"),
            (refund("re_1", "ch_failed", 1, RefundState::Succeeded, "r"), "charge_not_refundable"),
            (refund("re_1", "ch_a", 0, RefundState::Succeeded, "r"), "invalid_request"),
            (refund("re_1", "ch_a", -5, RefundState::Failed, "r"), "invalid_request"),
            (
                Refund { currency: "USD".into(), ..refund("re_1", "ch_a", 1, RefundState::Succeeded, "r") },
                "invalid_request",
            ),
        ];
        for (refund, code) in cases {
            let refused = ledger.insert_refund(refund.clone());

            assert!(
                matches!(&refused, Err(RefundNotWritten::Unrefundable(why)) if why.code() == code),
                "{refund:?}: {refused:?}"
            );
        }
        assert!(ledger.refund_truth().refunds.is_empty());
    }

    #[test]
    fn refunds_are_listed_by_charge_and_key_and_counted_per_key() {
        let mut ledger = ledger();
        for (id, charge, key) in [("re_b", "ch_a", "r1"), ("re_a", "ch_b", "r1"), ("re_c", "ch_a", "r2")] {
            ledger.insert_refund(refund(id, charge, 10, RefundState::Succeeded, key)).unwrap();
        }
        ledger.count_refund_post("r1");
        ledger.count_refund_post("r3");
        let all = ListQuery { limit: 10, ..Default::default() };
        let by_key = ListQuery { idempotency_key: Some("r1".into()), ..all.clone() };

        let refund_ids = |page: RefundPage| page.data.into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(refund_ids(ledger.list_refunds(&all, None).unwrap()), ["re_a", "re_b", "re_c"]);
        assert_eq!(refund_ids(ledger.list_refunds(&all, Some("ch_a")).unwrap()), ["re_b", "re_c"]);
        assert_eq!(refund_ids(ledger.list_refunds(&by_key, Some("ch_a")).unwrap()), ["re_b"]);
        assert!(ledger.list_refunds(&by_key, Some("ch_c")).unwrap().data.is_empty());
        let first = ledger.list_refunds(&ListQuery { limit: 1, ..all.clone() }, None).unwrap();
        assert!(first.has_more);
        assert_eq!(ledger.refund(&first.data[0].id), Some(&first.data[0]));
        let cursor_of_a_charge = ListQuery { starting_after: Some("ch_a".into()), ..all };
        assert_eq!(ledger.list_refunds(&cursor_of_a_charge, None), Err(UnknownCursor));
        let truth = ledger.refund_truth();
        assert_eq!(truth.posts_with_key("r1"), 1);
        assert_eq!(truth.posts_with_key("r3"), 1);
        assert_eq!(truth.refunds_with_key("r1").len(), 2);
        assert_eq!(truth.keys.len(), 3);
        assert_eq!(ledger.ground_truth().keys.len(), 4, "refund keys are not charge keys");
    }
}
