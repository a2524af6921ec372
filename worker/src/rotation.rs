//! Whose turn it is to be claimed from: the tenants that may have due payments, in turns.
//!
//! A claim names one tenant, so that it touches one tenant's rows only (under Citus, one shard; see
//! SCALING.md). Fairness across tenants is therefore the worker's. A claim goes round the tenants in
//! line: each round splits what is left to claim equally between them (those that got least in
//! this claim so far, then the first in line, get one more when it does not divide), and a tenant
//! whose share came back full waits for the next round,
//! since it may have more. A tenant whose share came back short has nothing more due and leaves the
//! line until a wake-up names it again or a scan finds it. So within one claim, the tenants that
//! still have rows due get shares that differ by one row at most. Pure: no I/O.

use std::collections::{HashMap, HashSet, VecDeque};

use oncepay_domain::ids::TenantId;

/// The tenants to claim from, in turn order.
#[derive(Debug, Default)]
pub struct Rotation {
    /// Waiting for a round, first in line first.
    queue: VecDeque<TenantId>,
    /// The tenants in `queue`.
    members: HashSet<TenantId>,
    /// The turns left in the current round.
    round: VecDeque<Turn>,
    /// The rows each tenant got in the current claim.
    taken: HashMap<TenantId, u32>,
}

/// One tenant's turn: whom to claim from, and how many rows at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The tenant.
    pub tenant: TenantId,
    /// Its share of what was left to claim when the round began.
    pub share: u32,
}

impl Rotation {
    /// Adds `tenant` at the back of the line, unless it is already waiting.
    pub fn add(&mut self, tenant: TenantId) {
        if self.members.insert(tenant) {
            self.queue.push_back(tenant);
        }
    }

    /// Whether no tenant is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.round.is_empty()
    }

    /// Starts a claim: the tenants of a round the last claim did not finish go back to the front of
    /// the line, in their order, so their turn comes first.
    pub fn begin(&mut self) {
        self.taken.clear();
        while let Some(turn) = self.round.pop_back() {
            if self.members.insert(turn.tenant) {
                self.queue.push_front(turn.tenant);
            }
        }
    }

    /// The next turn, with `remaining` rows left to claim; a new round begins when the last one is
    /// over. `None` when no tenant is waiting or nothing remains to claim.
    pub fn next(&mut self, remaining: u32) -> Option<Turn> {
        if remaining == 0 {
            return None;
        }
        if self.round.is_empty() {
            let waiting = u32::try_from(self.queue.len()).unwrap_or(u32::MAX);
            if waiting == 0 {
                return None;
            }
            let (base, extra) = (remaining / waiting, remaining % waiting);
            // The rows that do not divide go to those that got least so far (a stable sort keeps the
            // line's order among equals); with fewer rows than tenants, only they get a turn.
            let mut line: Vec<TenantId> = self.queue.drain(..).collect();
            line.sort_by_key(|tenant| self.taken.get(tenant).copied().unwrap_or(0));
            let turns = if base == 0 { extra } else { waiting };
            for (index, tenant) in line.iter().enumerate() {
                if (index as u32) < turns {
                    self.members.remove(tenant);
                    self.round.push_back(Turn { tenant: *tenant, share: base + u32::from((index as u32) < extra) });
                } else {
                    self.queue.push_back(*tenant);
                }
            }
        }
        self.round.pop_front()
    }

    /// Ends `turn`, in which `claimed` rows were taken: a full share may have left more behind, so
    /// the tenant waits for another round; a short one means it has nothing more due.
    pub fn done(&mut self, turn: Turn, claimed: usize) {
        *self.taken.entry(turn.tenant).or_default() += u32::try_from(claimed).unwrap_or(u32::MAX);
        if claimed >= turn.share as usize {
            self.add(turn.tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// Plays claims of `limit` rows against tenants with `due` rows each until nothing is due,
    /// returning the rows each claim took per tenant.
    fn play(due: &[u32], limit: u32) -> Vec<BTreeMap<usize, u32>> {
        let tenants: Vec<TenantId> = due.iter().map(|_| TenantId::generate()).collect();
        let mut left: Vec<u32> = due.to_vec();
        let mut rotation = Rotation::default();
        let mut claims = Vec::new();
        loop {
            for (index, tenant) in tenants.iter().enumerate() {
                if left[index] > 0 {
                    rotation.add(*tenant);
                }
            }
            if rotation.is_empty() {
                return claims;
            }
            let mut remaining = limit;
            let mut taken = BTreeMap::new();
            rotation.begin();
            while let Some(turn) = rotation.next(remaining) {
                let index = tenants.iter().position(|t| *t == turn.tenant).unwrap();
                let got = turn.share.min(left[index]);
                left[index] -= got;
                remaining -= got;
                *taken.entry(index).or_default() += got;
                rotation.done(turn, got as usize);
            }
            claims.push(taken);
        }
    }

    #[test]
    fn a_claim_shares_its_rows_equally_and_gives_what_one_tenant_leaves_to_the_others() {
        // One tenant with a backlog, one with two rows, one with one: six rows to claim.
        let claims = play(&[20, 2, 1], 6);

        assert_eq!(claims[0], BTreeMap::from([(0, 3), (1, 2), (2, 1)]));
    }

    #[test]
    fn with_fewer_rows_than_tenants_the_next_claim_begins_where_the_last_one_stopped() {
        let tenants: Vec<TenantId> = (0..3).map(|_| TenantId::generate()).collect();
        let mut rotation = Rotation::default();
        tenants.iter().for_each(|tenant| rotation.add(*tenant));

        let mut served = Vec::new();
        for _ in 0..3 {
            rotation.begin();
            let turn = rotation.next(1).unwrap();
            rotation.done(turn, 1);
            served.push(turn.tenant);
        }

        assert_eq!(served, tenants, "each tenant's turn came once");
    }

    #[test]
    fn a_tenant_announced_twice_waits_once() {
        let tenant = TenantId::generate();
        let mut rotation = Rotation::default();
        rotation.add(tenant);
        rotation.add(tenant);

        assert_eq!(rotation.next(10), Some(Turn { tenant, share: 10 }));
        assert_eq!(rotation.next(10), None);
    }

    #[test]
    fn a_short_share_leaves_the_rotation_and_a_full_one_waits_again() {
        let (full, short) = (TenantId::generate(), TenantId::generate());
        let mut rotation = Rotation::default();
        rotation.add(full);
        rotation.add(short);

        let first = rotation.next(4).unwrap();
        rotation.done(first, 2);
        let second = rotation.next(2).unwrap();
        rotation.done(second, 0);

        assert_eq!((first.tenant, second.tenant), (full, short));
        assert_eq!(rotation.next(2), Some(Turn { tenant: full, share: 2 }));
        assert!(rotation.is_empty());
    }

    proptest! {
        /// Whatever the backlogs and the claim size, every claim takes as many rows as are due up to
        /// its size, and the tenants it leaves rows due for got shares within one row of the
        /// largest.
        #[test]
        fn claims_are_full_and_fair(due in prop::collection::vec(0u32..50, 1..8), limit in 1u32..20) {
            let claims = play(&due, limit);
            let mut left = due.clone();
            for taken in &claims {
                let total: u32 = taken.values().sum();
                prop_assert_eq!(total, limit.min(left.iter().sum()));
                let largest = taken.values().copied().max().unwrap_or(0);
                for (index, got) in taken {
                    left[*index] -= got;
                }
                for (index, rows) in left.iter().enumerate() {
                    let got = taken.get(&index).copied().unwrap_or(0);
                    prop_assert!(*rows == 0 || got + 1 >= largest, "{taken:?} shorted {index}, {rows} left");
                }
            }
            prop_assert!(left.iter().all(|n| *n == 0));
        }
    }
}
