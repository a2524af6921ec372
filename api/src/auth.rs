//! Authentication: `Authorization: Bearer <api key>` → the tenant making the request.
//!
//! Invariants: a token, a secret or a hash is never logged, never echoed in a problem detail and
//! never kept anywhere but as the stored hash in the cache; a key that cannot be checked fails
//! closed (503) and never lets a request through. A key is admitted only on a database read made
//! less than `auth.cache_ttl_secs` ago, flood or not, so a revocation takes effect within that
//! time. Unauthenticated requests must not cost the tenants anything.

use std::collections::HashMap;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix_web::http::header::{self, HeaderMap};
use oncepay_domain::api_key::{self, KeyId};
use oncepay_domain::ids::TenantId;
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_store::connections::Connections;
use oncepay_store::tenants::{self, StoredKey};
use tokio::sync::Semaphore;

use crate::errors::ApiError;
use crate::settings::AuthSettings;

/// The authenticated tenant of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Who is calling.
    pub tenant_id: TenantId,
    /// The tenant's own rate limit, if it has one.
    pub rate_limit_per_second: Option<NonZeroU32>,
    /// The provider account the tenant's payments are charged to in connect mode, if an operator
    /// has set one.
    pub provider_account: Option<ProviderAccount>,
}

/// Verifies API keys, through the cache when it can. One per process, shared by every worker.
pub struct Authenticator {
    cache: KeyCache,
    /// Places for reads of keys this process has not verified (`auth.max_concurrent_lookups`): a
    /// flood of made-up keys can take these, never the connections that real tenants' requests use.
    lookups: Semaphore,
    /// As many places again, for reading a key this process verified before once its TTL has
    /// passed. Only a key the database holds, live, is ever verified, and then read about once a
    /// TTL, so a flood of made-up keys cannot take these: a real key is read again under a flood
    /// rather than admitted on an old read.
    rereads: Semaphore,
    lookup_wait: Duration,
}

impl Authenticator {
    /// An authenticator with the `[auth]` settings.
    pub fn new(settings: &AuthSettings) -> Self {
        Self {
            cache: KeyCache::new(Duration::from_secs(settings.cache_ttl_secs), settings.cache_max_entries),
            lookups: Semaphore::new(settings.max_concurrent_lookups),
            rereads: Semaphore::new(settings.max_concurrent_lookups),
            lookup_wait: Duration::from_millis(settings.lookup_wait_ms),
        }
    }

    /// The tenant whose live API key the request presents, or 401. Keys the cache does not hold
    /// fresh are read through `connections`, within the places for their kind.
    ///
    /// A token names its tenant and key id (`oncepay_domain::api_key`), so a check is one
    /// primary-key read (`store::tenants::find_api_key`) and a constant-time comparison of the
    /// presented secret's hash with the stored one.
    pub async fn authenticate(&self, headers: &HeaderMap, connections: &Connections) -> Result<Caller, ApiError> {
        const NOT_VALID: ApiError = ApiError::Unauthorized("The API key is not valid.");
        let token = bearer_token(headers)?;
        let presented = api_key::parse(token).ok_or(ApiError::Unauthorized("The API key is not a valid key."))?;
        let key = (presented.tenant_id, presented.key_id.clone());

        let verified = self.verify(&key, find(connections, &key)).await?.ok_or(NOT_VALID)?;
        if !presented.secret_hash.matches(&verified.secret_sha256) {
            return Err(NOT_VALID);
        }
        Ok(Caller {
            tenant_id: key.0,
            rate_limit_per_second: verified.rate_limit_per_second,
            provider_account: verified.provider_account,
        })
    }

    /// The key as verified less than a TTL ago: from the cache, else from `read` (the key's row)
    /// once a place among the reads is free. `None` if the database refused the key; 503 if no
    /// place came free within `auth.lookup_wait_ms`.
    async fn verify(
        &self,
        key: &KeyOf,
        read: impl Future<Output = Result<Option<StoredKey>, ApiError>>,
    ) -> Result<Option<Verified>, ApiError> {
        let budget = match self.cache.check(key, Instant::now()) {
            Cached::Fresh(verified) => return Ok(Some(verified)),
            Cached::Refused => return Ok(None),
            Cached::Expired => &self.rereads,
            Cached::Unknown => &self.lookups,
        };
        let Ok(Ok(_place)) = tokio::time::timeout(self.lookup_wait, budget.acquire()).await else {
            return Err(ApiError::KeyCheckBusy);
        };
        // Checked again: the requests of a key that waited here together share the first one's read.
        match self.cache.check(key, Instant::now()) {
            Cached::Fresh(verified) => return Ok(Some(verified)),
            Cached::Refused => return Ok(None),
            Cached::Expired | Cached::Unknown => {}
        }
        // Taken before the read, so the TTL runs from a moment before the database was asked.
        let read_at = Instant::now();
        match read.await? {
            Some(stored) if !stored.revoked => {
                let verified = Verified {
                    secret_sha256: stored.secret_sha256,
                    rate_limit_per_second: stored
                        .rate_limit_per_second
                        .and_then(|rate| u32::try_from(rate).ok())
                        .and_then(NonZeroU32::new),
                    provider_account: stored.provider_account,
                    verified_at: read_at,
                };
                // The stored hash, whatever was presented: a wrong secret for a real key then costs
                // no read either.
                self.cache.remember_verified(key.clone(), verified.clone());
                Ok(Some(verified))
            }
            _ => {
                self.cache.remember_refused(key.clone(), read_at);
                Ok(None)
            }
        }
    }
}

/// Reads the key's row.
#[tracing::instrument(name = "auth.lookup", skip_all, fields(tenant.id = %key.0))]
async fn find(connections: &Connections, key: &KeyOf) -> Result<Option<StoredKey>, ApiError> {
    let mut conn = connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let stored = tenants::find_api_key(&mut conn, key.0, &key.1).await.map_err(ApiError::from_store)?;
    conn.release();
    Ok(stored)
}

/// The token of the one `Authorization: Bearer` header.
fn bearer_token(headers: &HeaderMap) -> Result<&str, ApiError> {
    let mut values = headers.get_all(header::AUTHORIZATION);
    let value =
        values.next().ok_or(ApiError::Unauthorized("An Authorization: Bearer <API key> header is required."))?;
    if values.next().is_some() {
        return Err(ApiError::Unauthorized("The Authorization header must be sent exactly once."));
    }
    let value = value.to_str().map_err(|_| ApiError::Unauthorized("The Authorization header is malformed."))?;
    let value = value.trim();
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    // RFC 9110: the scheme is case-insensitive.
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::Unauthorized("The Authorization header must use the Bearer scheme."));
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(ApiError::Unauthorized("The Authorization header carries no API key."));
    }
    Ok(token)
}

/// What the cache keeps of a key verified against the database: the stored hash, never the
/// presented secret.
#[derive(Clone)]
struct Verified {
    secret_sha256: Vec<u8>,
    rate_limit_per_second: Option<NonZeroU32>,
    provider_account: Option<ProviderAccount>,
    verified_at: Instant,
}

/// A key: its tenant and id.
type KeyOf = (TenantId, KeyId);

/// What the cache holds for a key at a moment.
enum Cached {
    /// Verified by a read less than the TTL ago: admitted without another.
    Fresh(Verified),
    /// Refused by a read less than the TTL ago: 401 without another.
    Refused,
    /// Verified by this process longer ago than the TTL: a real key, read again before it is
    /// admitted.
    Expired,
    /// Not verified by this process, or forgotten.
    Unknown,
}

/// Keys verified lately, and keys the database refused lately, each map bounded on its own.
///
/// A request with a fresh key needs no database round trip, yet still compares its own presented
/// hash with the stored one in constant time. By design, a revoked key (or a changed tenant rate
/// limit) takes effect within the TTL (`auth.cache_ttl_secs`), not at once, and never later.
struct KeyCache {
    ttl: Duration,
    max_entries: usize,
    // Past its TTL an entry admits nothing; it only marks its key as real, until room is needed.
    verified: Mutex<HashMap<KeyOf, Verified>>,
    // Unknown or revoked keys, for the same TTL. A map of its own, so a flood of made-up keys never
    // evicts a real one.
    refused: Mutex<HashMap<KeyOf, Instant>>,
}

impl KeyCache {
    fn new(ttl: Duration, max_entries: usize) -> Self {
        Self { ttl, max_entries, verified: Mutex::default(), refused: Mutex::default() }
    }

    fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.max_entries > 0
    }

    /// What the cache holds for the key at `now`.
    fn check(&self, key: &KeyOf, now: Instant) -> Cached {
        let within_ttl = |at: Instant| now.saturating_duration_since(at) < self.ttl;
        let verified = {
            let entries = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
            entries.get(key).map(|entry| within_ttl(entry.verified_at).then(|| entry.clone()))
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

    fn remember_verified(&self, key: KeyOf, verified: Verified) {
        if self.enabled() {
            let mut entries = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
            insert_bounded(&mut entries, key, verified, self.max_entries, self.ttl, |entry| entry.verified_at);
        }
    }

    fn remember_refused(&self, key: KeyOf, at: Instant) {
        // A revoked key is no longer taken for a real one: its reads wait among the made-up keys'.
        self.verified.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
        if self.enabled() {
            let mut entries = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
            insert_bounded(&mut entries, key, at, self.max_entries, self.ttl, |at| *at);
        }
    }

    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        let verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner).len();
        (verified, self.refused.lock().unwrap_or_else(PoisonError::into_inner).len())
    }
}

/// Inserts into a map of at most `max` entries: when it is full, entries older than `keep` go
/// first, then the oldest.
fn insert_bounded<V>(
    entries: &mut HashMap<KeyOf, V>,
    key: KeyOf,
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
    use std::sync::atomic::{AtomicUsize, Ordering};

    use actix_web::http::header::HeaderValue;

    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn the_bearer_token_is_taken_from_exactly_one_authorization_header() {
        let cases: [(&[&str], Option<&str>); 8] = [
            (&["Bearer opk_abc"], Some("opk_abc")),
            (&["bearer opk_abc"], Some("opk_abc")),
            (&["BEARER   opk_abc  "], Some("opk_abc")),
            (&[], None),
            (&["Basic dXNlcjpwYXNz"], None),
            (&["Bearer"], None),
            (&["Bearer "], None),
            (&["Bearer opk_a", "Bearer opk_b"], None),
        ];
        for (values, expected) in cases {
            let headers = headers(values);
            assert_eq!(bearer_token(&headers).ok(), expected, "{values:?}");
        }
    }

    fn verified(at: Instant) -> Verified {
        Verified { secret_sha256: vec![7; 32], rate_limit_per_second: None, provider_account: None, verified_at: at }
    }

    fn key() -> KeyOf {
        let tenant = TenantId::generate();
        (tenant, api_key::generate(tenant).key_id)
    }

    /// What the cache holds for `key` at `now`, by name.
    fn state(cache: &KeyCache, key: &KeyOf, now: Instant) -> &'static str {
        match cache.check(key, now) {
            Cached::Fresh(_) => "fresh",
            Cached::Refused => "refused",
            Cached::Expired => "expired",
            Cached::Unknown => "unknown",
        }
    }

    #[test]
    fn a_verified_key_is_fresh_within_the_ttl_and_never_after() {
        let cache = KeyCache::new(Duration::from_secs(5), 10);
        let key = key();
        let start = Instant::now();
        cache.remember_verified(key.clone(), verified(start));

        let cases = [(0, "fresh"), (4_999, "fresh"), (5_000, "expired"), (60_000, "expired"), (3_600_000, "expired")];
        for (after_ms, expected) in cases {
            assert_eq!(state(&cache, &key, start + Duration::from_millis(after_ms)), expected, "{after_ms} ms");
        }
        assert_eq!(state(&cache, &self::key(), start), "unknown");
    }

    #[test]
    fn a_key_the_database_refuses_is_no_longer_taken_for_a_real_one() {
        let cache = KeyCache::new(Duration::from_secs(5), 10);
        let key = key();
        let start = Instant::now();
        cache.remember_verified(key.clone(), verified(start));
        cache.remember_refused(key.clone(), start + Duration::from_secs(6));

        assert_eq!(state(&cache, &key, start + Duration::from_secs(10)), "refused");
        assert_eq!(state(&cache, &key, start + Duration::from_secs(11)), "unknown");
    }

    #[test]
    fn a_refused_key_is_remembered_for_the_ttl_without_touching_the_verified_keys() {
        let cache = KeyCache::new(Duration::from_secs(5), 2);
        let real = key();
        let start = Instant::now();
        cache.remember_verified(real.clone(), verified(start));
        let made_up: Vec<KeyOf> = (0..10).map(|_| key()).collect();
        for (i, key) in made_up.iter().enumerate() {
            cache.remember_refused(key.clone(), start + Duration::from_millis(i as u64));
        }

        assert_eq!(state(&cache, &made_up[9], start + Duration::from_secs(4)), "refused");
        assert_eq!(state(&cache, &made_up[9], start + Duration::from_secs(6)), "unknown", "past the TTL");
        assert_eq!(state(&cache, &made_up[0], start), "unknown", "the oldest refusal was forgotten first");
        assert_eq!(state(&cache, &real, start), "fresh", "a flood never evicts a real key");
        assert_eq!(cache.len(), (1, 2));
    }

    #[test]
    fn the_cache_never_grows_past_its_bound_and_forgets_the_oldest_first() {
        let cache = KeyCache::new(Duration::from_secs(60), 3);
        let start = Instant::now();
        let keys: Vec<KeyOf> = (0..4).map(|_| key()).collect();
        for (i, key) in keys.iter().enumerate() {
            cache.remember_verified(key.clone(), verified(start + Duration::from_millis(i as u64)));
        }

        assert_eq!(cache.len(), (3, 0));
        assert_eq!(state(&cache, &keys[0], start), "unknown");
        assert!(keys[1..].iter().all(|key| state(&cache, key, start) == "fresh"));
    }

    #[test]
    fn a_full_cache_forgets_every_verification_past_the_ttl_first() {
        let cache = KeyCache::new(Duration::from_secs(5), 3);
        let now = Instant::now();
        let (fresh, expired, older, new) = (key(), key(), key(), key());
        cache.remember_verified(fresh.clone(), verified(now - Duration::from_secs(1)));
        cache.remember_verified(expired.clone(), verified(now - Duration::from_secs(6)));
        cache.remember_verified(older.clone(), verified(now - Duration::from_secs(7)));

        cache.remember_verified(new.clone(), verified(now));

        assert_eq!(cache.len(), (2, 0));
        assert_eq!(state(&cache, &expired, now), "unknown");
        assert_eq!(state(&cache, &older, now), "unknown");
        assert_eq!(state(&cache, &fresh, now), "fresh");
    }

    #[test]
    fn a_zero_ttl_disables_the_cache() {
        let cache = KeyCache::new(Duration::ZERO, 10);
        let key = key();
        cache.remember_verified(key.clone(), verified(Instant::now()));
        cache.remember_refused(key.clone(), Instant::now());

        assert_eq!(state(&cache, &key, Instant::now()), "unknown");
        assert_eq!(cache.len(), (0, 0));
    }

    /// An authenticator with a 5 s TTL and `places` places for each kind of read.
    fn authenticator(places: usize) -> Authenticator {
        Authenticator::new(&AuthSettings {
            cache_ttl_secs: 5,
            cache_max_entries: 10,
            max_concurrent_lookups: places,
            lookup_wait_ms: 50,
        })
    }

    /// A key `auth` verified longer ago than its TTL.
    fn expired_key(auth: &Authenticator) -> KeyOf {
        let key = key();
        auth.cache.remember_verified(key.clone(), verified(Instant::now() - Duration::from_secs(6)));
        key
    }

    /// A read of a key's row that finds `row` and counts itself in `reads`; other requests run while
    /// it is under way.
    async fn read(reads: &AtomicUsize, row: Option<StoredKey>) -> Result<Option<StoredKey>, ApiError> {
        reads.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        Ok(row)
    }

    fn row(revoked: bool) -> Option<StoredKey> {
        Some(StoredKey { secret_sha256: vec![7; 32], revoked, rate_limit_per_second: None, provider_account: None })
    }

    #[tokio::test]
    async fn a_fresh_key_and_a_fresh_refusal_cost_no_read() {
        let auth = authenticator(1);
        let (live, made_up) = (key(), key());
        let reads = AtomicUsize::new(0);
        assert!(auth.verify(&live, read(&reads, row(false))).await.unwrap().is_some());
        assert!(auth.verify(&made_up, read(&reads, None)).await.unwrap().is_none());

        let again =
            (auth.verify(&live, read(&reads, None)).await, auth.verify(&made_up, read(&reads, row(false))).await);

        assert!(matches!(again, (Ok(Some(_)), Ok(None))));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_key_past_its_ttl_is_read_again_and_refused_once_revoked() {
        let auth = authenticator(1);
        let key = expired_key(&auth);
        let reads = AtomicUsize::new(0);

        let verified = auth.verify(&key, read(&reads, row(true))).await;

        assert!(matches!(verified, Ok(None)));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn concurrent_requests_of_a_key_past_its_ttl_share_one_read() {
        let auth = authenticator(1);
        let key = expired_key(&auth);
        let reads = AtomicUsize::new(0);

        let requests = (0..8).map(|_| auth.verify(&key, read(&reads, row(false))));
        let verified = futures::future::join_all(requests).await;

        assert!(verified.iter().all(|verified| matches!(verified, Ok(Some(_)))));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn made_up_keys_holding_every_lookup_place_hold_up_no_real_key_past_its_ttl() {
        let auth = authenticator(1);
        let real = expired_key(&auth);
        let _flood = auth.lookups.acquire().await.unwrap();
        let reads = AtomicUsize::new(0);

        let made_up = auth.verify(&key(), read(&reads, None)).await;
        let real = auth.verify(&real, read(&reads, row(true))).await;

        assert!(matches!(made_up, Err(ApiError::KeyCheckBusy)));
        assert!(matches!(real, Ok(None)), "the revoked key was not read again");
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_key_past_its_ttl_that_cannot_be_read_fails_closed() {
        let auth = authenticator(1);
        let key = expired_key(&auth);
        let reads = AtomicUsize::new(0);
        let rereads = auth.rereads.acquire().await.unwrap();

        let busy = auth.verify(&key, read(&reads, row(false))).await;
        drop(rereads);
        let down = auth.verify(&key, async { Err(ApiError::from_store(sqlx::Error::PoolTimedOut.into())) }).await;

        assert!(matches!(busy, Err(ApiError::KeyCheckBusy)), "no place to read it");
        assert!(matches!(down, Err(ApiError::Unavailable(_))), "the database is down");
        assert_eq!(reads.load(Ordering::SeqCst), 0);
        assert_eq!(state(&auth.cache, &key, Instant::now()), "expired");
    }
}
