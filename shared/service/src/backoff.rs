//! Exponential backoff with full jitter, so that clients that failed together spread out instead of
//! retrying in lock-step.
//!
//! The delay before retry `n` (1 for the first) is uniformly random in
//! `[0, min(max, base * 2^(n-1))]`. Pure apart from the random source.

use std::time::Duration;

use rand::Rng;
use serde::Deserialize;

/// A backoff policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Backoff {
    /// The cap of the first retry's delay.
    #[serde(with = "millis", rename = "base_ms")]
    pub base: Duration,
    /// The largest delay ever used.
    #[serde(with = "millis", rename = "max_ms")]
    pub max: Duration,
}

impl Backoff {
    /// The upper bound of the delay before retry `attempt` (1-based), before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        self.base.saturating_mul(1u32 << doublings.min(31)).min(self.max)
    }

    /// A jittered delay before retry `attempt` (1-based).
    pub fn delay(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(attempt);
        let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rng.random_range(0..=millis))
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const POLICY: Backoff = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(10) };

    #[test]
    fn the_ceiling_doubles_until_the_cap() {
        let ceilings: Vec<u128> = (1..=9).map(|n| POLICY.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]);
        assert_eq!(POLICY.ceiling(u32::MAX), Duration::from_secs(10));
    }

    proptest! {
        #[test]
        fn a_delay_never_exceeds_its_ceiling(attempt in 0u32..100, seed in any::<u64>()) {
            use rand::SeedableRng;
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            prop_assert!(POLICY.delay(attempt, &mut rng) <= POLICY.ceiling(attempt));
        }
    }
}
