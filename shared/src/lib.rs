//! oncepay's domain and plumbing, shared by every binary.
//!
//! The domain (what a payment is, which states it may move through, what a request must look like,
//! how a request is fingerprinted) is pure and free of I/O. The plumbing (the store, the provider
//! client, config, telemetry, metrics, the operations endpoints) is what every binary needs to talk
//! to PostgreSQL, to the provider and to operators. Binaries depend on this crate, never on each
//! other.

pub mod api_key;
pub mod backoff;
pub mod config;
pub mod connections;
pub mod db;
pub mod fingerprint;
#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod idempotency_key;
pub mod ids;
pub mod metrics;
pub mod money;
pub mod notify;
pub mod ops_http;
pub mod payment;
pub mod payment_request;
pub mod problem;
pub mod provider;
pub mod settlement;
pub mod shutdown;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod webhook_signature;
