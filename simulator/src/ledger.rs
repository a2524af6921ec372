//! The ledger: every charge the simulator ever made (failed and planted ones included) and how many
//! charge POSTs each idempotency key received. It is the ground truth tests count from.
//!
//! Invariants: charges are only ever added, never changed or removed; ids are unique; listings are
//! ordered by `(created, id)`, so pagination with `starting_after` is stable even when many charges
//! share a second. The ledger knows nothing of idempotency windows, faults or HTTP.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use oncepay_provider::wire::{Charge, ChargePage};

use crate::control::{GroundTruth, KeyRecord};

/// The largest page a listing returns.
pub const MAX_PAGE: usize = 100;

/// The page size when none is asked for.
pub const DEFAULT_PAGE: usize = 10;

/// All charges, indexed for the protocol's lookups.
#[derive(Debug, Default)]
pub struct Ledger {
    /// In the order they were made.
    charges: Vec<Charge>,
    by_id: HashMap<String, usize>,
    by_time: BTreeSet<(i64, String)>,
    by_key: HashMap<String, Vec<usize>>,
    posts: HashMap<String, u64>,
}

/// Filters of `GET /v1/charges`; all of them apply together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only charges made under this key.
    pub idempotency_key: Option<String>,
    /// `created >= created_gte`.
    pub created_gte: Option<i64>,
    /// `created < created_lt`.
    pub created_lt: Option<i64>,
    /// Only charges after this one in `(created, id)` order.
    pub starting_after: Option<String>,
    /// Page size, 1 ..= [`MAX_PAGE`].
    pub limit: usize,
}

/// `starting_after` names no charge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("starting_after names no charge")]
pub struct UnknownCursor;

/// A charge with this id exists already.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a charge with id {0} exists already")]
pub struct DuplicateId(pub String);

impl Ledger {
    /// Whether a charge has this id.
    pub fn contains(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    /// Adds a charge.
    pub fn insert(&mut self, charge: Charge) -> Result<(), DuplicateId> {
        if self.contains(&charge.id) {
            return Err(DuplicateId(charge.id));
        }
        let index = self.charges.len();
        self.by_id.insert(charge.id.clone(), index);
        self.by_time.insert((charge.created, charge.id.clone()));
        self.by_key.entry(charge.idempotency_key.clone()).or_default().push(index);
        self.charges.push(charge);
        Ok(())
    }

    /// Counts one charge POST that carried `key`.
    pub fn count_post(&mut self, key: &str) {
        *self.posts.entry(key.to_owned()).or_default() += 1;
    }

    /// The charge with this id.
    pub fn get(&self, id: &str) -> Option<&Charge> {
        self.by_id.get(id).map(|&i| &self.charges[i])
    }

    /// One page of the charges matching `query`, oldest first, ties broken by id.
    pub fn list(&self, query: &ListQuery) -> Result<ChargePage, UnknownCursor> {
        let cursor = match &query.starting_after {
            Some(id) => Some(self.get(id).map(|c| (c.created, c.id.clone())).ok_or(UnknownCursor)?),
            None => None,
        };
        let in_window = |key: &(i64, String)| {
            query.created_gte.is_none_or(|gte| key.0 >= gte)
                && query.created_lt.is_none_or(|lt| key.0 < lt)
                && cursor.as_ref().is_none_or(|c| key > c)
        };
        let limit = query.limit.clamp(1, MAX_PAGE);
        let mut matching: Vec<(i64, String)> = match &query.idempotency_key {
            Some(key) => {
                let mut keyed: Vec<(i64, String)> = self
                    .by_key
                    .get(key)
                    .into_iter()
                    .flatten()
                    .map(|&i| (self.charges[i].created, self.charges[i].id.clone()))
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
        let data = matching.iter().filter_map(|(_, id)| self.get(id).cloned()).collect();
        Ok(ChargePage { data, has_more, unfinished: Vec::new() })
    }

    /// Every charge and every key's history.
    pub fn ground_truth(&self) -> GroundTruth {
        let mut keys: BTreeMap<&str, KeyRecord> = BTreeMap::new();
        for (key, &posts) in &self.posts {
            keys.insert(key, KeyRecord { idempotency_key: key.clone(), posts, charges: Vec::new() });
        }
        for (key, indexes) in &self.by_key {
            let record = keys.entry(key).or_insert_with(|| KeyRecord {
                idempotency_key: key.clone(),
                posts: 0,
                charges: Vec::new(),
            });
            record.charges = indexes.iter().map(|&i| self.charges[i].id.clone()).collect();
        }
        GroundTruth { charges: self.charges.clone(), keys: keys.into_values().collect() }
    }
}

#[cfg(test)]
mod tests {
    use oncepay_provider::wire::ChargeStatus;

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
}
