//! Authentication: `Authorization: Bearer <api key>` → the tenant making the request; a broker
//! message's user (`user_id`, which the broker checks) → the tenant it publishes for.
//!
//! Invariants: a token, a secret or a hash is never logged, never echoed in a problem detail and
//! never kept anywhere but as the stored hash in the cache; a key that cannot be checked fails
//! closed (503) and never lets a request through. A key or a broker user is admitted only on a
//! database read made less than `auth.cache_ttl_secs` ago, flood or not, so a revocation (or a
//! broker user's removal) takes effect within that time. Unauthenticated requests must not cost the
//! tenants anything.

use std::future::Future;
use std::hash::Hash;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use actix_web::http::header::{self, HeaderMap};
use oncepay_domain::api_key::{self, KeyId};
use oncepay_domain::ids::TenantId;
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_store::broker_users::{self, BrokerTenant};
use oncepay_store::connections::Connections;
use oncepay_store::tenants::{self, StoredKey};
use tokio::sync::Semaphore;

use crate::errors::ApiError;
use crate::read_cache::{Cached, ReadCache};
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

/// Verifies API keys and broker users, through the caches when it can. One per process, shared by
/// every worker and the broker consumer.
pub struct Authenticator {
    keys: ReadCache<KeyOf, Verified>,
    broker_users: ReadCache<String, Caller>,
    /// Places for reads of credentials this process has not verified (`auth.max_concurrent_lookups`):
    /// a flood of made-up keys can take these, never the connections that real tenants' requests use.
    lookups: Semaphore,
    /// As many places again, for reading a credential this process verified before once its TTL has
    /// passed. Only a credential the database holds, live, is ever verified, and then read about once
    /// a TTL, so a flood of made-up keys cannot take these: a real key is read again under a flood
    /// rather than admitted on an old read.
    rereads: Semaphore,
    lookup_wait: Duration,
}

impl Authenticator {
    /// An authenticator with the `[auth]` settings.
    pub fn new(settings: &AuthSettings) -> Self {
        let ttl = Duration::from_secs(settings.cache_ttl_secs);
        Self {
            keys: ReadCache::new(ttl, settings.cache_max_entries),
            broker_users: ReadCache::new(ttl, settings.cache_max_entries),
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

        let verified = self.verify(&key, || find(connections, &key)).await?.ok_or(NOT_VALID)?;
        if !presented.secret_hash.matches(&verified.secret_sha256) {
            return Err(NOT_VALID);
        }
        Ok(Caller {
            tenant_id: key.0,
            rate_limit_per_second: verified.rate_limit_per_second,
            provider_account: verified.provider_account,
        })
    }

    /// The tenant the broker user `user` publishes for, or 401 for a message without a user or with
    /// one no admin has mapped to a tenant. Users the cache does not hold fresh are read through
    /// `connections`, as keys are.
    pub async fn broker_caller(&self, user: Option<&str>, connections: &Connections) -> Result<Caller, ApiError> {
        let user = user.ok_or(ApiError::Unauthorized("The message has no user_id."))?;
        let read = || async {
            let mapped = find_broker_user(connections, user).await?;
            Ok(mapped.map(|tenant| Caller {
                tenant_id: tenant.tenant_id,
                rate_limit_per_second: rate_limit(tenant.rate_limit_per_second),
                provider_account: tenant.provider_account,
            }))
        };
        let caller = self.admit(&self.broker_users, &user.to_owned(), read).await?;
        caller.ok_or(ApiError::Unauthorized("The message's user_id is not mapped to a tenant."))
    }

    /// The key as verified less than a TTL ago: from the cache, else from `read` (the key's row).
    async fn verify<Read: Future<Output = Result<Option<StoredKey>, ApiError>>>(
        &self,
        key: &KeyOf,
        read: impl FnOnce() -> Read,
    ) -> Result<Option<Verified>, ApiError> {
        let read = || async {
            // The stored hash, whatever was presented: a wrong secret for a real key then costs no
            // read either.
            Ok(read().await?.filter(|stored| !stored.revoked).map(|stored| Verified {
                secret_sha256: stored.secret_sha256,
                rate_limit_per_second: rate_limit(stored.rate_limit_per_second),
                provider_account: stored.provider_account,
            }))
        };
        self.admit(&self.keys, key, read).await
    }

    /// What the database said less than a TTL ago of `key`: from `cache`, else from `read` once a
    /// place among the reads is free. `None` if the database refused it; 503 if no place came free
    /// within `auth.lookup_wait_ms`. (`read` makes the read's future only when it is needed, and
    /// keeps this future small.)
    async fn admit<K: Hash + Eq + Clone, V: Clone, Read: Future<Output = Result<Option<V>, ApiError>>>(
        &self,
        cache: &ReadCache<K, V>,
        key: &K,
        read: impl FnOnce() -> Read,
    ) -> Result<Option<V>, ApiError> {
        let budget = match cache.check(key, Instant::now()) {
            Cached::Fresh(value) => return Ok(Some(value)),
            Cached::Refused => return Ok(None),
            Cached::Expired => &self.rereads,
            Cached::Unknown => &self.lookups,
        };
        let Ok(Ok(_place)) = tokio::time::timeout(self.lookup_wait, budget.acquire()).await else {
            return Err(ApiError::KeyCheckBusy);
        };
        // Checked again: the callers of a key that waited here together share the first one's read.
        match cache.check(key, Instant::now()) {
            Cached::Fresh(value) => return Ok(Some(value)),
            Cached::Refused => return Ok(None),
            Cached::Expired | Cached::Unknown => {}
        }
        // Taken before the read, so the TTL runs from a moment before the database was asked.
        let read_at = Instant::now();
        let found = read().await?;
        match &found {
            Some(value) => cache.remember_verified(key.clone(), value.clone(), read_at),
            None => cache.remember_refused(key.clone(), read_at),
        }
        Ok(found)
    }
}

/// A tenant's stored rate limit, if it has a usable one.
fn rate_limit(stored: Option<i32>) -> Option<NonZeroU32> {
    stored.and_then(|rate| u32::try_from(rate).ok()).and_then(NonZeroU32::new)
}

/// Reads the key's row.
#[tracing::instrument(name = "auth.lookup", skip_all, fields(tenant.id = %key.0))]
async fn find(connections: &Connections, key: &KeyOf) -> Result<Option<StoredKey>, ApiError> {
    let mut conn = connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let stored = tenants::find_api_key(&mut conn, key.0, &key.1).await.map_err(ApiError::from_store)?;
    conn.release();
    Ok(stored)
}

/// Reads the broker user's mapping.
#[tracing::instrument(name = "auth.broker_user_lookup", skip_all)]
async fn find_broker_user(connections: &Connections, user: &str) -> Result<Option<BrokerTenant>, ApiError> {
    let mut conn = connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let found = broker_users::tenant_of(&mut conn, user).await.map_err(ApiError::from_store)?;
    conn.release();
    Ok(found)
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
}

/// A key: its tenant and id.
type KeyOf = (TenantId, KeyId);

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

    fn verified() -> Verified {
        Verified { secret_sha256: vec![7; 32], rate_limit_per_second: None, provider_account: None }
    }

    fn key() -> KeyOf {
        let tenant = TenantId::generate();
        (tenant, api_key::generate(tenant).key_id)
    }

    /// What the cache holds for `key` at `now`, by name.
    fn state(cache: &ReadCache<KeyOf, Verified>, key: &KeyOf, now: Instant) -> &'static str {
        match cache.check(key, now) {
            Cached::Fresh(_) => "fresh",
            Cached::Refused => "refused",
            Cached::Expired => "expired",
            Cached::Unknown => "unknown",
        }
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
        auth.keys.remember_verified(key.clone(), verified(), Instant::now() - Duration::from_secs(6));
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
        assert!(auth.verify(&live, || read(&reads, row(false))).await.unwrap().is_some());
        assert!(auth.verify(&made_up, || read(&reads, None)).await.unwrap().is_none());

        let again =
            (auth.verify(&live, || read(&reads, None)).await, auth.verify(&made_up, || read(&reads, row(false))).await);

        assert!(matches!(again, (Ok(Some(_)), Ok(None))));
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_key_past_its_ttl_is_read_again_and_refused_once_revoked() {
        let auth = authenticator(1);
        let key = expired_key(&auth);
        let reads = AtomicUsize::new(0);

        let verified = auth.verify(&key, || read(&reads, row(true))).await;

        assert!(matches!(verified, Ok(None)));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn concurrent_requests_of_a_key_past_its_ttl_share_one_read() {
        let auth = authenticator(1);
        let key = expired_key(&auth);
        let reads = AtomicUsize::new(0);

        let requests = (0..8).map(|_| auth.verify(&key, || read(&reads, row(false))));
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

        let made_up = auth.verify(&key(), || read(&reads, None)).await;
        let real = auth.verify(&real, || read(&reads, row(true))).await;

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

        let busy = auth.verify(&key, || read(&reads, row(false))).await;
        drop(rereads);
        let down = auth.verify(&key, || async { Err(ApiError::from_store(sqlx::Error::PoolTimedOut.into())) }).await;

        assert!(matches!(busy, Err(ApiError::KeyCheckBusy)), "no place to read it");
        assert!(matches!(down, Err(ApiError::Unavailable(_))), "the database is down");
        assert_eq!(reads.load(Ordering::SeqCst), 0);
        assert_eq!(state(&auth.keys, &key, Instant::now()), "expired");
    }
}
