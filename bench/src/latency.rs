//! Latencies of one measured window, and their summary (p50, p95, p99, max).
//!
//! Every sample is kept, so percentiles are exact nearest-rank values rather than bucket estimates.
//! Nothing here measures time: callers record durations they measured.

use std::time::Duration;

use serde::Serialize;

/// The latencies recorded in one window.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    // Microseconds as `u32`: at 4 bytes a sample, even the longest windows stay small.
    micros: Vec<u32>,
}

/// What a window's latencies come to, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    /// How many samples.
    pub count: u64,
    /// Nearest-rank 50th percentile.
    pub p50_ms: f64,
    /// Nearest-rank 95th percentile.
    pub p95_ms: f64,
    /// Nearest-rank 99th percentile.
    pub p99_ms: f64,
    /// The slowest.
    pub max_ms: f64,
    /// The mean.
    pub mean_ms: f64,
}

impl Latencies {
    /// No samples yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one latency (saturating at `u32::MAX` microseconds, about 71 minutes).
    pub fn record(&mut self, latency: Duration) {
        self.record_micros(u32::try_from(latency.as_micros()).unwrap_or(u32::MAX));
    }

    /// Records one latency given in microseconds.
    pub fn record_micros(&mut self, micros: u32) {
        self.micros.push(micros);
    }

    /// Adds another window's samples (e.g. another connection's).
    pub fn merge(&mut self, other: Latencies) {
        self.micros.extend(other.micros);
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.micros.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.micros.is_empty()
    }

    /// The summary, or `None` without samples.
    pub fn summary(mut self) -> Option<LatencySummary> {
        if self.micros.is_empty() {
            return None;
        }
        self.micros.sort_unstable();
        let sorted = &self.micros;
        let sum: u64 = sorted.iter().map(|&m| u64::from(m)).sum();
        let count = sorted.len() as u64;
        Some(LatencySummary {
            count,
            p50_ms: millis(nearest_rank(sorted, 0.50)),
            p95_ms: millis(nearest_rank(sorted, 0.95)),
            p99_ms: millis(nearest_rank(sorted, 0.99)),
            max_ms: millis(sorted[sorted.len() - 1]),
            mean_ms: sum as f64 / count as f64 / 1000.0,
        })
    }
}

/// The nearest-rank percentile `q` (0 < q ≤ 1) of a sorted, non-empty slice: the smallest value
/// such that at least `q` of the samples are less than or equal to it.
fn nearest_rank(sorted: &[u32], q: f64) -> u32 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn millis(micros: u32) -> f64 {
    f64::from(micros) / 1000.0
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn of(micros: &[u32]) -> Latencies {
        let mut latencies = Latencies::new();
        for &m in micros {
            latencies.record_micros(m);
        }
        latencies
    }

    #[test]
    fn percentiles_are_nearest_rank_values_of_the_samples() {
        // 1..=100 ms, shuffled: p50 is the 50th value, p99 the 99th.
        let mut samples: Vec<u32> = (1..=100).map(|ms| ms * 1000).collect();
        samples.reverse();
        samples.swap(3, 77);

        let summary = of(&samples).summary().unwrap();

        assert_eq!(summary.count, 100);
        assert_eq!(summary.p50_ms, 50.0);
        assert_eq!(summary.p95_ms, 95.0);
        assert_eq!(summary.p99_ms, 99.0);
        assert_eq!(summary.max_ms, 100.0);
        assert_eq!(summary.mean_ms, 50.5);
    }

    #[test]
    fn a_single_slow_sample_shows_in_max_but_not_in_p99_of_many() {
        let mut samples = vec![1000; 999];
        samples.push(250_000);

        let summary = of(&samples).summary().unwrap();

        assert_eq!(summary.p50_ms, 1.0);
        assert_eq!(summary.p99_ms, 1.0);
        assert_eq!(summary.max_ms, 250.0);
    }

    #[test]
    fn small_windows_and_merged_windows() {
        assert_eq!(of(&[]).summary(), None);
        let one = of(&[1500]).summary().unwrap();
        assert_eq!((one.p50_ms, one.p99_ms, one.max_ms), (1.5, 1.5, 1.5));

        let mut first = of(&[1000, 3000]);
        first.merge(of(&[2000]));
        let merged = first.summary().unwrap();
        assert_eq!((merged.count, merged.p50_ms, merged.max_ms), (3, 2.0, 3.0));
    }

    #[test]
    fn durations_are_recorded_in_microseconds_and_saturate() {
        let mut latencies = Latencies::new();
        latencies.record(Duration::from_micros(1234));
        latencies.record(Duration::from_secs(10_000));

        let summary = latencies.summary().unwrap();

        assert_eq!(summary.p50_ms, 1.234);
        assert_eq!(summary.max_ms, f64::from(u32::MAX) / 1000.0);
    }

    proptest! {
        #[test]
        fn percentiles_are_samples_and_ordered(samples in proptest::collection::vec(0u32..10_000_000, 1..500)) {
            let summary = of(&samples).summary().unwrap();
            let is_sample = |ms: f64| samples.iter().any(|&m| millis(m) == ms);

            prop_assert!(is_sample(summary.p50_ms) && is_sample(summary.p95_ms) && is_sample(summary.p99_ms));
            prop_assert!(is_sample(summary.max_ms));
            prop_assert!(summary.p50_ms <= summary.p95_ms && summary.p95_ms <= summary.p99_ms);
            prop_assert!(summary.p99_ms <= summary.max_ms);
            let at_or_below_p99 = samples.iter().filter(|&&m| millis(m) <= summary.p99_ms).count();
            prop_assert!(at_or_below_p99 as f64 >= 0.99 * samples.len() as f64);
        }
    }
}
