//! Final responses, remembered: a retry of a payment that has reached its final state is served
//! from this process's memory, without a round trip to the database.
//!
//! Must not: hold a response that is not final, serve one tenant another tenant's entry (the
//! tenant, from authentication, is part of the key), or serve an entry past its key's expiry.

use std::hash::{Hash, Hasher};

use actix_web::web::Bytes;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::ids::{PaymentId, TenantId};
use quick_cache::sync::Cache;
use quick_cache::{Equivalent, Weighter};
use time::OffsetDateTime;

/// A key's final response, and what a retry is checked against: a retry with another body is
/// refused with 422 from memory too.
#[derive(Debug, Clone)]
pub struct Final {
    /// The fingerprint of the request that created the key.
    pub fingerprint: Fingerprint,
    /// The payment the key created.
    pub payment_id: PaymentId,
    /// When the key may be reaped.
    pub expires_at: OffsetDateTime,
    /// The stored response's status.
    pub status: u16,
    /// The stored response's body, JSON text, as the database returned it.
    pub body: Bytes,
}

/// Final responses by (tenant, idempotency key), bounded by bytes. One per process.
///
/// Safe because the response stored on a key once its payment is terminal never changes:
/// `store::transitions::settle` writes it once, in the transaction that makes the payment
/// `succeeded` or `failed`, and no transition leaves those states; the key's fingerprint and
/// payment never change either. So an entry goes stale only when its key is deleted, and the reaper
/// deletes a key only after its retention (`expires_at`), from when on the client has been told it
/// may be forgotten (`Idempotency-Key-Expires`). For the same reason entries never disagree between
/// processes: each is a copy of a row that does not change. A payment still in progress is always
/// read from the database.
pub struct ReplayCache {
    // Keeps what is read again over what was read once: `quick_cache`'s eviction, which a run of
    // one-off keys cannot flush.
    entries: Option<Cache<Owned, Final, BytesHeld>>,
}

impl ReplayCache {
    /// A cache holding at most about `max_bytes` of keys and responses
    /// (`intake.replay_cache_bytes`); 0 remembers nothing.
    pub fn new(max_bytes: u64) -> Self {
        // quick_cache sizes its tables from an estimate of the entries; a payment's response is
        // about half a kilobyte.
        let estimated_entries = usize::try_from(max_bytes / 512).unwrap_or(usize::MAX).max(1);
        let entries = (max_bytes > 0).then(|| Cache::with_weighter(estimated_entries, max_bytes, BytesHeld));
        Self { entries }
    }

    /// The final response for `key` of `tenant`, if remembered and its key has not expired at `now`
    /// (by this process's clock). An entry found expired is dropped.
    pub fn get(&self, tenant: TenantId, key: &IdempotencyKey, now: OffsetDateTime) -> Option<Final> {
        let entries = self.entries.as_ref()?;
        let lookup = Borrowed { tenant, key: key.as_str() };
        let found = entries.get(&lookup)?;
        if now < found.expires_at {
            return Some(found);
        }
        entries.remove(&lookup);
        None
    }

    /// Remembers `response` as the final response for `key` of `tenant`.
    pub fn remember(&self, tenant: TenantId, key: &IdempotencyKey, response: Final) {
        if let Some(entries) = &self.entries {
            entries.insert(Owned { tenant, key: key.as_str().into() }, response);
        }
    }
}

/// A cache key as stored.
#[derive(Clone, PartialEq, Eq)]
struct Owned {
    tenant: TenantId,
    key: Box<str>,
}

/// A cache key as looked up, without copying the idempotency key.
struct Borrowed<'a> {
    tenant: TenantId,
    key: &'a str,
}

// Both forms hash the same fields the same way, as `Equivalent` requires.
impl Hash for Owned {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Borrowed { tenant: self.tenant, key: &self.key }.hash(state);
    }
}

impl Hash for Borrowed<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.tenant.hash(state);
        self.key.hash(state);
    }
}

impl Equivalent<Owned> for Borrowed<'_> {
    fn equivalent(&self, owned: &Owned) -> bool {
        self.tenant == owned.tenant && self.key == &*owned.key
    }
}

/// An entry weighs what it holds on the heap, plus its fixed size.
#[derive(Clone)]
struct BytesHeld;

impl Weighter<Owned, Final> for BytesHeld {
    fn weight(&self, key: &Owned, response: &Final) -> u64 {
        let fixed = std::mem::size_of::<Owned>() + std::mem::size_of::<Final>();
        (fixed + key.key.len() + response.body.len()) as u64
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(text: &str) -> IdempotencyKey {
        IdempotencyKey::parse(text.as_bytes()).unwrap()
    }

    fn final_response(expires_at: OffsetDateTime, body: &str) -> Final {
        Final {
            fingerprint: Fingerprint::from_slice(&[7; 32]).unwrap(),
            payment_id: PaymentId::generate(),
            expires_at,
            status: 200,
            body: Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    #[test]
    fn a_response_is_served_to_its_own_tenant_and_key_only() {
        let cache = ReplayCache::new(1 << 20);
        let (tenant, other_tenant) = (TenantId::generate(), TenantId::generate());
        let now = OffsetDateTime::now_utc();
        cache.remember(tenant, &key("order-1"), final_response(now + Duration::from_secs(60), r#"{"id":1}"#));

        let found = cache.get(tenant, &key("order-1"), now).unwrap();

        assert_eq!(&found.body[..], br#"{"id":1}"#);
        assert!(cache.get(other_tenant, &key("order-1"), now).is_none(), "another tenant's key");
        assert!(cache.get(tenant, &key("order-2"), now).is_none(), "another key");
        assert!(cache.get(tenant, &key("\"order-1\""), now).is_some(), "the quoted form names the same key");
    }

    #[test]
    fn a_response_is_not_served_once_its_key_has_expired() {
        let cache = ReplayCache::new(1 << 20);
        let tenant = TenantId::generate();
        let expires_at = OffsetDateTime::now_utc() + Duration::from_secs(60);
        cache.remember(tenant, &key("k"), final_response(expires_at, "{}"));

        assert!(cache.get(tenant, &key("k"), expires_at - Duration::from_millis(1)).is_some());
        assert!(cache.get(tenant, &key("k"), expires_at).is_none());
        assert!(cache.get(tenant, &key("k"), expires_at - Duration::from_secs(1)).is_none(), "and it is gone");
    }

    #[test]
    fn the_cache_holds_no_more_bytes_than_it_is_given() {
        let cache = ReplayCache::new(64 * 1024);
        let tenant = TenantId::generate();
        let later = OffsetDateTime::now_utc() + Duration::from_secs(60);
        let body = "x".repeat(1000);
        for i in 0..1000 {
            cache.remember(tenant, &key(&format!("k{i}")), final_response(later, &body));
        }

        let entries = cache.entries.as_ref().unwrap();
        assert!(entries.weight() <= 64 * 1024, "{} bytes held", entries.weight());
        assert!(entries.len() < 64, "{} responses of a kilobyte held in 64 KiB", entries.len());
    }

    #[test]
    fn a_cache_of_zero_bytes_remembers_nothing() {
        let cache = ReplayCache::new(0);
        let tenant = TenantId::generate();
        let now = OffsetDateTime::now_utc();
        cache.remember(tenant, &key("k"), final_response(now + Duration::from_secs(60), "{}"));

        assert!(cache.get(tenant, &key("k"), now).is_none());
    }
}
