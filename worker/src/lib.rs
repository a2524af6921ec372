//! The worker: drains the outbox and asks the provider to charge, at most once per payment.
//!
//! - [`outbox`]: the claim (lease, fencing token, `pending → processing` in one statement), the
//!   fenced take and release that end a send.
//! - [`decision`]: what a provider outcome means for the payment (pure).
//! - [`record`]: writing that decision in one transaction guarded by the fencing token.
//! - [`group_commit`]: recording the decisions of sends that finish together in one transaction.
//! - [`drainer`]: the loop that claims, sends with bounded concurrency, and records.
//! - [`wake`]: `LISTEN` for queued payments.
//! - [`settings`], [`app`], [`metrics`]: configuration, wiring, and what the worker measures.
//! - `failpoints` (only with the `failpoints` feature): crash points for the chaos harness.
//!
//! Expired leases are taken back by `oncepay_store::leases::sweep`, which the reconciler
//! runs. `main.rs` only loads the settings, starts telemetry, and runs [`app::App`] until SIGTERM.

pub mod app;
pub mod decision;
pub mod drainer;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod group_commit;
pub mod metrics;
pub mod outbox;
pub mod record;
pub mod settings;
pub mod wake;

pub use drainer::{Counts, Drainer, DrainerConfig};
