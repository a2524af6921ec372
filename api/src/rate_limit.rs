//! Per-tenant rate limiting: a GCRA token bucket (`governor`) per tenant; an empty bucket means 429
//! with `Retry-After`.
//!
//! The buckets live in this process: N api processes admit up to N times the rate in total. That
//! bounds the load one tenant can put on one process, which is the purpose here; it is not a global
//! contract. Nothing here does I/O.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};
use oncepay_domain::ids::TenantId;

use crate::auth::Caller;
use crate::errors::ApiError;

/// Every tenant's bucket.
pub struct RateLimits {
    default: Quota,
    clock: DefaultClock,
    // Only authenticated tenants get a bucket, so the map grows with the number of tenants (created
    // by operators), never with what an anonymous client sends.
    buckets: Mutex<HashMap<TenantId, Arc<Bucket>>>,
}

struct Bucket {
    quota: Quota,
    limiter: DefaultDirectRateLimiter,
}

impl RateLimits {
    /// Buckets with `default_per_second` and `default_burst` for tenants without their own rate.
    pub fn new(default_per_second: NonZeroU32, default_burst: NonZeroU32) -> Self {
        Self {
            default: Quota::per_second(default_per_second).allow_burst(default_burst),
            clock: DefaultClock::default(),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request from the caller's bucket, or says how long until one is available (429).
    /// The tenant's own `rate_limit_per_second` comes with a burst of one second's worth; without
    /// it, the configured default rate and burst apply.
    pub fn admit(&self, caller: &Caller) -> Result<(), ApiError> {
        let quota = caller.rate_limit_per_second.map_or(self.default, Quota::per_second);
        let bucket = self.bucket(caller.tenant_id, quota);
        bucket.limiter.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            // Whole seconds, rounded up: a client that waits this long is admitted.
            let retry_after_secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            ApiError::RateLimited { retry_after_secs: retry_after_secs.max(1) }
        })
    }

    fn bucket(&self, tenant_id: TenantId, quota: Quota) -> Arc<Bucket> {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        match buckets.get(&tenant_id) {
            Some(bucket) if bucket.quota == quota => Arc::clone(bucket),
            // A changed rate replaces the bucket the next time the tenant's key is verified (within
            // the auth cache's TTL).
            _ => {
                let bucket = Arc::new(Bucket {
                    quota,
                    limiter: DefaultDirectRateLimiter::direct_with_clock(quota, self.clock.clone()),
                });
                buckets.insert(tenant_id, Arc::clone(&bucket));
                bucket
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(rate: Option<u32>) -> Caller {
        Caller {
            tenant_id: TenantId::generate(),
            rate_limit_per_second: rate.and_then(NonZeroU32::new),
            provider_account: None,
        }
    }

    fn nz(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    #[test]
    fn a_tenant_may_burst_then_is_told_when_to_come_back() {
        let limits = RateLimits::new(nz(1), nz(3));
        let tenant = caller(None);

        let admitted = (0..3).filter(|_| limits.admit(&tenant).is_ok()).count();
        let refused = limits.admit(&tenant);

        assert_eq!(admitted, 3);
        assert!(matches!(refused, Err(ApiError::RateLimited { retry_after_secs: 1 })), "{refused:?}");
    }

    #[test]
    fn a_tenant_with_its_own_rate_gets_one_seconds_worth_of_burst() {
        let limits = RateLimits::new(nz(1000), nz(1000));
        let tenant = caller(Some(2));

        let admitted = (0..10).filter(|_| limits.admit(&tenant).is_ok()).count();

        assert_eq!(admitted, 2);
    }

    #[test]
    fn tenants_do_not_share_a_bucket() {
        let limits = RateLimits::new(nz(1), nz(1));
        let first = caller(None);
        let second = caller(None);

        assert!(limits.admit(&first).is_ok());
        assert!(limits.admit(&first).is_err());
        assert!(limits.admit(&second).is_ok());
    }

    #[test]
    fn a_changed_rate_takes_effect_with_a_fresh_bucket() {
        let limits = RateLimits::new(nz(1), nz(1));
        let mut tenant = caller(None);
        assert!(limits.admit(&tenant).is_ok());
        assert!(limits.admit(&tenant).is_err());

        tenant.rate_limit_per_second = Some(nz(5));

        assert!(limits.admit(&tenant).is_ok());
    }
}
