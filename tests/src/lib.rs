//! The cross-process suite and the chaos harness: real binaries, a throwaway PostgreSQL, and the
//! provider simulator or localstripe.
//!
//! One library for the end-to-end tests (`tests/e2e.rs`, and `tests/stripe.rs` against localstripe),
//! the short chaos profile that runs with the test command (`tests/chaos.rs`) and the
//! `oncepay-chaos` binary, so they can never check different things. Nothing here is part of
//! oncepay: it drives the system only through its processes, its HTTP API, its operator CLI, its
//! operations API and the provider's own endpoints, receives the events oncepay sends merchants,
//! and only reads the database.

pub mod broker;
pub mod chaos;
pub mod checker;
pub mod events;
pub mod faults;
pub mod localstripe;
pub mod operations;
pub mod receiver;
pub mod refunds;
pub mod report;
pub mod system;
pub mod workload;
