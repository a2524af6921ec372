//! Authentication: `Authorization: Bearer <api key>` → the tenant making the request.
//!
//! A token names its tenant and key id (`oncepay_shared::api_key`), so verifying it is one
//! primary-key read (`store::tenants::find_api_key`) and a constant-time comparison of the
//! presented secret's hash with the stored one. A small bounded cache remembers keys verified in
//! the last `auth.cache_ttl_secs`, so a request usually needs no database round trip to
//! authenticate: the cached entry holds the *stored* hash, and every request still compares its own
//! presented hash with it in constant time. Consequence, by design: a revoked key (or a changed
//! tenant rate limit) takes effect within the TTL, not instantly. Failed verifications are not
//! cached, so a key created a moment ago works at once.
//!
//! Invariants: a token, a secret or a hash is never logged, never echoed in a problem detail and
//! never kept anywhere but as the stored hash in the cache; a database that cannot be reached fails
//! closed (503), it never lets a request through.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix_web::http::header::{self, HeaderMap};
use oncepay_shared::api_key::{self, KeyId};
use oncepay_shared::connections::Connections;
use oncepay_shared::ids::TenantId;
use oncepay_shared::store::{StoreError, tenants};

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

/// Verifies API keys, through the cache when it can. One per process, shared by every worker.
pub struct Authenticator {
    cache: KeyCache,
    retry_after_secs: u64,
}

impl Authenticator {
    /// An authenticator; `retry_after_secs` goes on a 503.
    pub fn new(settings: &AuthSettings, retry_after_secs: u64) -> Self {
        Self {
            cache: KeyCache::new(Duration::from_secs(settings.cache_ttl_secs), settings.cache_max_entries),
            retry_after_secs,
        }
    }

    /// The tenant whose live API key the request presents, or 401. Keys the cache does not hold
    /// are read through `connections`.
    pub async fn authenticate(&self, headers: &HeaderMap, connections: &Connections) -> Result<Caller, ApiError> {
        let token = bearer_token(headers)?;
        let presented = api_key::parse(token).ok_or(ApiError::Unauthorized("The API key is not a valid key."))?;
        let tenant_id = presented.tenant_id;

        let verified = match self.cache.get(tenant_id, &presented.key_id, Instant::now()) {
            Some(cached) => cached,
            None => {
                let stored = self.lookup(connections, tenant_id, &presented.key_id).await?;
                let stored =
                    stored.filter(|key| !key.revoked).ok_or(ApiError::Unauthorized("The API key is not valid."))?;
                let verified = Verified {
                    secret_sha256: stored.secret_sha256,
                    rate_limit_per_second: stored
                        .rate_limit_per_second
                        .and_then(|rate| u32::try_from(rate).ok())
                        .and_then(NonZeroU32::new),
                    verified_at: Instant::now(),
                };
                // Only a key whose presented secret matched is remembered.
                if presented.secret_hash.matches(&verified.secret_sha256) {
                    self.cache.insert(tenant_id, presented.key_id.clone(), verified.clone());
                }
                verified
            }
        };
        if !presented.secret_hash.matches(&verified.secret_sha256) {
            return Err(ApiError::Unauthorized("The API key is not valid."));
        }
        Ok(Caller { tenant_id, rate_limit_per_second: verified.rate_limit_per_second })
    }

    #[tracing::instrument(name = "auth.lookup", skip_all, fields(tenant.id = %tenant_id))]
    async fn lookup(
        &self,
        connections: &Connections,
        tenant_id: TenantId,
        key_id: &KeyId,
    ) -> Result<Option<tenants::StoredKey>, ApiError> {
        let to_api = |error: StoreError| ApiError::from_store(error, self.retry_after_secs);
        let mut conn = connections.acquire().await.map_err(|e| to_api(e.into()))?;
        let stored = tenants::find_api_key(&mut conn, tenant_id, key_id).await.map_err(to_api)?;
        conn.release();
        Ok(stored)
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

/// A key verified against the database a moment ago.
#[derive(Clone)]
struct Verified {
    /// The stored hash (never the secret).
    secret_sha256: Vec<u8>,
    rate_limit_per_second: Option<NonZeroU32>,
    verified_at: Instant,
}

/// Verified keys by (tenant, key id), each trusted for `ttl`, at most `max_entries` of them.
struct KeyCache {
    ttl: Duration,
    max_entries: usize,
    entries: Mutex<HashMap<(TenantId, KeyId), Verified>>,
}

impl KeyCache {
    fn new(ttl: Duration, max_entries: usize) -> Self {
        Self { ttl, max_entries, entries: Mutex::new(HashMap::new()) }
    }

    fn enabled(&self) -> bool {
        !self.ttl.is_zero() && self.max_entries > 0
    }

    fn get(&self, tenant_id: TenantId, key_id: &KeyId, now: Instant) -> Option<Verified> {
        if !self.enabled() {
            return None;
        }
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .get(&(tenant_id, key_id.clone()))
            .filter(|entry| now.saturating_duration_since(entry.verified_at) < self.ttl)
            .cloned()
    }

    fn insert(&self, tenant_id: TenantId, key_id: KeyId, verified: Verified) {
        if !self.enabled() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.max_entries && !entries.contains_key(&(tenant_id, key_id.clone())) {
            let now = Instant::now();
            entries.retain(|_, entry| now.saturating_duration_since(entry.verified_at) < self.ttl);
            if entries.len() >= self.max_entries {
                let oldest = entries.iter().min_by_key(|(_, entry)| entry.verified_at).map(|(key, _)| key.clone());
                if let Some(oldest) = oldest {
                    entries.remove(&oldest);
                }
            }
        }
        entries.insert((tenant_id, key_id), verified);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
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

    fn key_id() -> KeyId {
        api_key::generate(TenantId::generate()).key_id
    }

    #[test]
    fn a_cached_key_is_trusted_only_within_the_ttl() {
        let cache = KeyCache::new(Duration::from_secs(5), 10);
        let tenant = TenantId::generate();
        let key = key_id();
        let start = Instant::now();
        cache.insert(tenant, key.clone(), verified(start));

        assert!(cache.get(tenant, &key, start + Duration::from_secs(4)).is_some());
        assert!(cache.get(tenant, &key, start + Duration::from_secs(5)).is_none());
        assert!(cache.get(TenantId::generate(), &key, start).is_none());
    }

    #[test]
    fn the_cache_never_grows_past_its_bound_and_forgets_the_oldest_first() {
        let cache = KeyCache::new(Duration::from_secs(60), 3);
        let tenant = TenantId::generate();
        let start = Instant::now();
        let keys: Vec<KeyId> = (0..4).map(|_| key_id()).collect();
        for (i, key) in keys.iter().enumerate() {
            cache.insert(tenant, key.clone(), verified(start + Duration::from_millis(i as u64)));
        }

        assert_eq!(cache.len(), 3);
        assert!(cache.get(tenant, &keys[0], start).is_none());
        assert!(keys[1..].iter().all(|key| cache.get(tenant, key, start).is_some()));
    }

    #[test]
    fn a_zero_ttl_disables_the_cache() {
        let cache = KeyCache::new(Duration::ZERO, 10);
        let tenant = TenantId::generate();
        let key = key_id();
        cache.insert(tenant, key.clone(), verified(Instant::now()));

        assert!(cache.get(tenant, &key, Instant::now()).is_none());
        assert_eq!(cache.len(), 0);
    }
}
