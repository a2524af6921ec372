//! Authentication: `Authorization: Bearer <api key>` → the tenant making the request.
//!
//! Invariants: a token, a secret or a hash is never logged, never echoed in a problem detail and
//! never kept anywhere but as the stored hash in the cache; a key that cannot be checked fails
//! closed (503) and never lets a request through. Unauthenticated requests must not cost the
//! tenants anything.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix_web::http::header::{self, HeaderMap};
use oncepay_domain::api_key::{self, KeyId};
use oncepay_domain::ids::TenantId;
use oncepay_store::connections::Connections;
use oncepay_store::tenants;
use tokio::sync::Semaphore;

use crate::errors::ApiError;
use crate::settings::AuthSettings;

/// The authenticated tenant of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// Who is calling.
    pub tenant_id: TenantId,
    /// The tenant's own rate limit, if it has one.
    pub rate_limit_per_second: Option<NonZeroU32>,
}

/// How many TTLs old a verification may be and still admit its key while no read can be made.
pub const STALE_TTLS: u32 = 12;

/// Verifies API keys, through the cache when it can. One per process, shared by every worker.
pub struct Authenticator {
    cache: KeyCache,
    /// Places for reads of keys not in the cache (`auth.max_concurrent_lookups`): a flood of
    /// unknown keys can take these, never the connections that real tenants' requests use.
    lookups: Semaphore,
    lookup_wait: Duration,
}

/// What a key read found.
enum Lookup {
    /// The key as stored, if it exists.
    Read(Option<tenants::StoredKey>),
    /// No place among the reads came free in time.
    Busy,
}

impl Authenticator {
    /// An authenticator with the `[auth]` settings.
    pub fn new(settings: &AuthSettings) -> Self {
        Self {
            cache: KeyCache::new(Duration::from_secs(settings.cache_ttl_secs), settings.cache_max_entries),
            lookups: Semaphore::new(settings.max_concurrent_lookups),
            lookup_wait: Duration::from_millis(settings.lookup_wait_ms),
        }
    }

    /// The tenant whose live API key the request presents, or 401. Keys the cache does not hold
    /// are read through `connections`, within the lookup budget.
    ///
    /// A token names its tenant and key id (`oncepay_domain::api_key`), so a check is one
    /// primary-key read (`store::tenants::find_api_key`) and a constant-time comparison of the
    /// presented secret's hash with the stored one.
    pub async fn authenticate(&self, headers: &HeaderMap, connections: &Connections) -> Result<Caller, ApiError> {
        const NOT_VALID: ApiError = ApiError::Unauthorized("The API key is not valid.");
        let token = bearer_token(headers)?;
        let presented = api_key::parse(token).ok_or(ApiError::Unauthorized("The API key is not a valid key."))?;
        let tenant_id = presented.tenant_id;
        let id = (tenant_id, presented.key_id.clone());

        let verified = match self.cache.verified(&id, Instant::now(), self.cache.ttl) {
            Some(cached) => cached,
            None if self.cache.refused(&id, Instant::now()) => return Err(NOT_VALID),
            None => match self.lookup(connections, tenant_id, &presented.key_id).await? {
                Lookup::Read(Some(stored)) if !stored.revoked => {
                    let verified = Verified {
                        secret_sha256: stored.secret_sha256,
                        rate_limit_per_second: stored
                            .rate_limit_per_second
                            .and_then(|rate| u32::try_from(rate).ok())
                            .and_then(NonZeroU32::new),
                        verified_at: Instant::now(),
                    };
                    // The stored hash, whatever was presented: a wrong secret for a real key then
                    // costs no read either.
                    self.cache.remember_verified(id, verified.clone());
                    verified
                }
                Lookup::Read(_) => {
                    self.cache.remember_refused(id, Instant::now());
                    return Err(NOT_VALID);
                }
                // No place among the reads within `auth.lookup_wait_ms`: admitted if the key was
                // verified in the last `STALE_TTLS` TTLs, else 503.
                Lookup::Busy => self
                    .cache
                    .verified(&id, Instant::now(), self.cache.ttl.saturating_mul(STALE_TTLS))
                    .ok_or(ApiError::KeyCheckBusy)?,
            },
        };
        if !presented.secret_hash.matches(&verified.secret_sha256) {
            return Err(NOT_VALID);
        }
        Ok(Caller { tenant_id, rate_limit_per_second: verified.rate_limit_per_second })
    }

    /// Reads the key, once a place among the reads is free.
    #[tracing::instrument(name = "auth.lookup", skip_all, fields(tenant.id = %tenant_id))]
    async fn lookup(&self, connections: &Connections, tenant_id: TenantId, key_id: &KeyId) -> Result<Lookup, ApiError> {
        let Ok(Ok(_place)) = tokio::time::timeout(self.lookup_wait, self.lookups.acquire()).await else {
            return Ok(Lookup::Busy);
        };
        let mut conn = connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
        let stored = tenants::find_api_key(&mut conn, tenant_id, key_id).await.map_err(ApiError::from_store)?;
        conn.release();
        Ok(Lookup::Read(stored))
    }
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
    verified_at: Instant,
}

/// A key: its tenant and id.
type KeyOf = (TenantId, KeyId);

/// Keys verified lately, and keys the database refused lately, each map bounded on its own.
///
/// A request with a cached key needs no database round trip, yet still compares its own presented
/// hash with the stored one in constant time. By design, a revoked key (or a changed tenant rate
/// limit) takes effect within the TTL (`auth.cache_ttl_secs`), not at once.
struct KeyCache {
    ttl: Duration,
    max_entries: usize,
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

    /// The key's verification, if it is younger than `max_age`.
    fn verified(&self, key: &KeyOf, now: Instant, max_age: Duration) -> Option<Verified> {
        let entries = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        entries.get(key).filter(|entry| now.saturating_duration_since(entry.verified_at) < max_age).cloned()
    }

    /// Whether the database refused the key within the TTL.
    fn refused(&self, key: &KeyOf, now: Instant) -> bool {
        let entries = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        entries.get(key).is_some_and(|at| now.saturating_duration_since(*at) < self.ttl)
    }

    fn remember_verified(&self, key: KeyOf, verified: Verified) {
        if self.enabled() {
            // Kept as long as a busy budget may still admit it.
            let keep = self.ttl.saturating_mul(STALE_TTLS);
            let mut entries = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
            insert_bounded(&mut entries, key, verified, self.max_entries, keep, |entry| entry.verified_at);
        }
    }

    fn remember_refused(&self, key: KeyOf, at: Instant) {
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
        Verified { secret_sha256: vec![7; 32], rate_limit_per_second: None, verified_at: at }
    }

    fn key() -> KeyOf {
        let tenant = TenantId::generate();
        (tenant, api_key::generate(tenant).key_id)
    }

    #[test]
    fn a_cached_key_is_trusted_only_within_the_age_asked_for() {
        let cache = KeyCache::new(Duration::from_secs(5), 10);
        let key = key();
        let start = Instant::now();
        cache.remember_verified(key.clone(), verified(start));

        let ttl = Duration::from_secs(5);
        assert!(cache.verified(&key, start + Duration::from_secs(4), ttl).is_some());
        assert!(cache.verified(&key, start + Duration::from_secs(5), ttl).is_none());
        assert!(cache.verified(&key, start + Duration::from_secs(5), ttl * STALE_TTLS).is_some(), "stale");
        assert!(cache.verified(&self::key(), start, ttl).is_none());
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

        assert!(cache.refused(&made_up[9], start + Duration::from_secs(4)));
        assert!(!cache.refused(&made_up[9], start + Duration::from_secs(6)), "past the TTL");
        assert!(!cache.refused(&made_up[0], start), "the oldest refusal was forgotten first");
        assert!(cache.verified(&real, start, Duration::from_secs(5)).is_some(), "a flood never evicts a real key");
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

        let ttl = Duration::from_secs(60);
        assert_eq!(cache.len(), (3, 0));
        assert!(cache.verified(&keys[0], start, ttl).is_none());
        assert!(keys[1..].iter().all(|key| cache.verified(key, start, ttl).is_some()));
    }

    #[test]
    fn a_zero_ttl_disables_the_cache() {
        let cache = KeyCache::new(Duration::ZERO, 10);
        let key = key();
        cache.remember_verified(key.clone(), verified(Instant::now()));
        cache.remember_refused(key.clone(), Instant::now());

        assert!(cache.verified(&key, Instant::now(), Duration::from_secs(60)).is_none());
        assert!(!cache.refused(&key, Instant::now()));
        assert_eq!(cache.len(), (0, 0));
    }
}
