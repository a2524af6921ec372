//! Time as the simulator uses it: wall-clock Unix seconds for the protocol's `created` fields and
//! webhook timestamps, and shutdown-aware pauses for the injected delays.
//!
//! Durations (windows, hangs, backoff) use monotonic clocks, so a clock step cannot make a key
//! expire early. No pause outlives a shutdown.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

/// Seconds since the Unix epoch; 0 if the system clock is set before 1970.
pub fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Sleeps `duration`; false if `shutdown` came first.
pub async fn pause(duration: Duration, shutdown: &CancellationToken) -> bool {
    if duration.is_zero() {
        return !shutdown.is_cancelled();
    }
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(duration) => true,
    }
}
