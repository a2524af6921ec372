//! What every oncepay process needs to run as a service: configuration, logs and traces, metrics,
//! shutdown on a signal, retry backoff, group commit, background loops, and TLS set up once.

pub mod backoff;
pub mod config;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod group_commit;
pub mod metrics;
pub mod runner;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
