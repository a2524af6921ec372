//! What the database said lately about a credential (an API key, a broker user): the ones it
//! verified and the ones it refused, each for a TTL, each map bounded on its own.
//!
//! A credential is admitted from the cache only on a read made less than the TTL ago, so a change
//! (a revoked key, a removed broker user, a changed tenant rate limit) takes effect within the TTL,
//! not at once, and never later. Past its TTL a verified entry admits nothing; it only marks its
//! credential as real, until room is needed.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What the cache holds for a credential at a moment.
pub enum Cached<V> {
    /// Verified by a read less than the TTL ago: admitted without another.
    Fresh(V),
    /// Refused by a read less than the TTL ago: refused without another.
    Refused,
    /// Verified by this process longer ago than the TTL: a real credential, read again before it is
    /// admitted.
    Expired,
    /// Not verified by this process, or forgotten.
    Unknown,
}

/// Credentials `K` the database verified lately (with what it said of them, `V`), and credentials
/// it refused lately.
pub struct ReadCache<K, V> {
    ttl: Duration,
    max_entries: usize,
    verified: Mutex<HashMap<K, (V, Instant)>>,
    // Unknown or revoked credentials, for the same TTL. A map of its own, so a flood of made-up
    // ones never evicts a real one.
    refused: Mutex<HashMap<K, Instant>>,
}

impl<K: Hash + Eq + Clone, V: Clone> ReadCache<K, V> {
    /// A cache that keeps each answer for `ttl` and at most `max_entries` of each kind. A zero
    /// `ttl` or `max_entries` keeps nothing.
    pub fn new(ttl: Duration, max_entries: usize) -> Self {
        Self { ttl, max_entries, verified: Mutex::default(), refused: Mutex::default() }
    }

    fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.max_entries > 0
    }

    /// What the cache holds for `key` at `now`.
    pub fn check(&self, key: &K, now: Instant) -> Cached<V> {
        let within_ttl = |at: Instant| now.saturating_duration_since(at) < self.ttl;
        let verified = {
            let entries = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
            entries.get(key).map(|(value, at)| within_ttl(*at).then(|| value.clone()))
        };
        if let Some(Some(fresh)) = verified {
            return Cached::Fresh(fresh);
        }
        let refused =
            self.refused.lock().unwrap_or_else(PoisonError::into_inner).get(key).is_some_and(|at| within_ttl(*at));
        match (refused, verified) {
            (true, _) => Cached::Refused,
            (false, Some(_)) => Cached::Expired,
            (false, None) => Cached::Unknown,
        }
    }

    /// Remembers that a read made at `at` verified `key`, and what it said.
    pub fn remember_verified(&self, key: K, value: V, at: Instant) {
        if self.enabled() {
            let mut entries = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
            insert_bounded(&mut entries, key, (value, at), self.max_entries, self.ttl, |(_, at)| *at);
        }
    }

    /// Remembers that a read made at `at` refused `key`.
    pub fn remember_refused(&self, key: K, at: Instant) {
        // A revoked credential is no longer taken for a real one.
        self.verified.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
        if self.enabled() {
            let mut entries = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
            insert_bounded(&mut entries, key, at, self.max_entries, self.ttl, |at| *at);
        }
    }

    /// How many verified and refused credentials it holds.
    #[cfg(test)]
    pub fn len(&self) -> (usize, usize) {
        let verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner).len();
        (verified, self.refused.lock().unwrap_or_else(PoisonError::into_inner).len())
    }
}

/// Inserts into a map of at most `max` entries: when it is full, entries older than `keep` go
/// first, then the oldest.
fn insert_bounded<K: Hash + Eq + Clone, V>(
    entries: &mut HashMap<K, V>,
    key: K,
    value: V,
    max: usize,
    keep: Duration,
    at: impl Fn(&V) -> Instant,
) {
    if entries.len() >= max && !entries.contains_key(&key) {
        let now = Instant::now();
        entries.retain(|_, entry| now.saturating_duration_since(at(entry)) < keep);
        if entries.len() >= max {
            let oldest = entries.iter().min_by_key(|(_, entry)| at(entry)).map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                entries.remove(&oldest);
            }
        }
    }
    entries.insert(key, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the cache holds for `key` at `now`, by name.
    fn state(cache: &ReadCache<u32, ()>, key: u32, now: Instant) -> &'static str {
        match cache.check(&key, now) {
            Cached::Fresh(()) => "fresh",
            Cached::Refused => "refused",
            Cached::Expired => "expired",
            Cached::Unknown => "unknown",
        }
    }

    #[test]
    fn a_verified_credential_is_fresh_within_the_ttl_and_never_after() {
        let cache = ReadCache::new(Duration::from_secs(5), 10);
        let start = Instant::now();
        cache.remember_verified(1, (), start);

        let cases = [(0, "fresh"), (4_999, "fresh"), (5_000, "expired"), (60_000, "expired"), (3_600_000, "expired")];
        for (after_ms, expected) in cases {
            assert_eq!(state(&cache, 1, start + Duration::from_millis(after_ms)), expected, "{after_ms} ms");
        }
        assert_eq!(state(&cache, 2, start), "unknown");
    }

    #[test]
    fn a_credential_the_database_refuses_is_no_longer_taken_for_a_real_one() {
        let cache = ReadCache::new(Duration::from_secs(5), 10);
        let start = Instant::now();
        cache.remember_verified(1, (), start);
        cache.remember_refused(1, start + Duration::from_secs(6));

        assert_eq!(state(&cache, 1, start + Duration::from_secs(10)), "refused");
        assert_eq!(state(&cache, 1, start + Duration::from_secs(11)), "unknown");
    }

    #[test]
    fn a_refusal_is_remembered_for_the_ttl_without_touching_the_verified_credentials() {
        let cache = ReadCache::new(Duration::from_secs(5), 2);
        let start = Instant::now();
        cache.remember_verified(0, (), start);
        for made_up in 1..=10 {
            cache.remember_refused(made_up, start + Duration::from_millis(u64::from(made_up)));
        }

        assert_eq!(state(&cache, 10, start + Duration::from_secs(4)), "refused");
        assert_eq!(state(&cache, 10, start + Duration::from_secs(6)), "unknown", "past the TTL");
        assert_eq!(state(&cache, 1, start), "unknown", "the oldest refusal was forgotten first");
        assert_eq!(state(&cache, 0, start), "fresh", "a flood never evicts a real credential");
        assert_eq!(cache.len(), (1, 2));
    }

    #[test]
    fn the_cache_never_grows_past_its_bound_and_forgets_the_oldest_first() {
        let cache = ReadCache::new(Duration::from_secs(60), 3);
        let start = Instant::now();
        for key in 0..4 {
            cache.remember_verified(key, (), start + Duration::from_millis(u64::from(key)));
        }

        assert_eq!(cache.len(), (3, 0));
        assert_eq!(state(&cache, 0, start), "unknown");
        assert!((1..4).all(|key| state(&cache, key, start) == "fresh"));
    }

    #[test]
    fn a_full_cache_forgets_every_verification_past_the_ttl_first() {
        let cache = ReadCache::new(Duration::from_secs(5), 3);
        let now = Instant::now();
        let (fresh, expired, older, new) = (1, 2, 3, 4);
        cache.remember_verified(fresh, (), now - Duration::from_secs(1));
        cache.remember_verified(expired, (), now - Duration::from_secs(6));
        cache.remember_verified(older, (), now - Duration::from_secs(7));

        cache.remember_verified(new, (), now);

        assert_eq!(cache.len(), (2, 0));
        assert_eq!(state(&cache, expired, now), "unknown");
        assert_eq!(state(&cache, older, now), "unknown");
        assert_eq!(state(&cache, fresh, now), "fresh");
    }

    #[test]
    fn a_zero_ttl_disables_the_cache() {
        let cache = ReadCache::new(Duration::ZERO, 10);
        cache.remember_verified(1, (), Instant::now());
        cache.remember_refused(1, Instant::now());

        assert_eq!(state(&cache, 1, Instant::now()), "unknown");
        assert_eq!(cache.len(), (0, 0));
    }
}
