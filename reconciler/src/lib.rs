//! The reconciler: where uncertain outcomes become certain, and where operators work.
//!
//! As a service (`serve`) it settles `unknown` payments from signed provider webhooks and by polling
//! the provider, dead-letters what it cannot settle, takes over expired worker leases, reaps expired
//! idempotency keys, and reconciles the ledger with the provider every night. As a CLI it is the
//! operator's tool: migrations, tenants and API keys, dead letters, reconciliation runs.
//!
//! `main.rs` only parses arguments, loads settings, starts telemetry and runs; everything testable is
//! here.

pub mod backlog;
pub mod cli;
pub mod dead_letters;
pub mod finding;
pub mod http;
pub mod metrics;
pub mod poller;
pub mod reaper;
pub mod recon;
pub mod render;
pub mod runner;
pub mod service;
pub mod settings;
pub mod sweeper;
pub mod tenants;
pub mod unknown;
pub mod webhooks;
