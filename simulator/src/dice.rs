//! The simulator's one random source: every fault decision, charge id, webhook id and backoff jitter
//! is drawn from it, so a seed reproduces a run's decisions (as far as the interleaving of
//! concurrent requests allows).
//!
//! Invariants: one [`Dice`] per simulator, shared by clones; each draw holds the lock only for the
//! draw itself, never across an `.await`. Nothing else in the simulator may use another source of
//! randomness; the only exception is picking the seed itself when none is configured.

use std::sync::{Arc, Mutex, PoisonError};

use rand::distr::Alphanumeric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A shared, seeded random source.
#[derive(Debug, Clone)]
pub struct Dice(Arc<Mutex<StdRng>>);

impl Dice {
    /// A source that replays the same draws for the same seed.
    pub fn seeded(seed: u64) -> Self {
        Self(Arc::new(Mutex::new(StdRng::seed_from_u64(seed))))
    }

    /// Runs `draw` with exclusive use of the source.
    pub fn with<T>(&self, draw: impl FnOnce(&mut StdRng) -> T) -> T {
        // A panic elsewhere while holding the lock leaves the generator valid; keep using it.
        let mut rng = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        draw(&mut rng)
    }

    /// `prefix` followed by 24 random alphanumeric characters, e.g. `ch_…`.
    pub fn token(&self, prefix: &str) -> String {
        self.with(|rng| {
            let mut token = String::with_capacity(prefix.len() + 24);
            token.push_str(prefix);
            token.extend((0..24).map(|_| char::from(rng.sample(Alphanumeric))));
            token
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_tokens() {
        let (a, b) = (Dice::seeded(5), Dice::seeded(5));

        let first: Vec<String> = (0..3).map(|_| a.token("ch_")).collect();
        let again: Vec<String> = (0..3).map(|_| b.token("ch_")).collect();

        assert_eq!(first, again);
        assert!(first.iter().all(|t| t.len() == 27 && t.starts_with("ch_")));
        assert_ne!(first[0], first[1]);
    }
}
