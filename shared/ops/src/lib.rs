//! The operators' product: who the operators are and what they may do, and the work they do on
//! what automation could not settle.
//!
//! [`operators`] holds the accounts, sign-in (passwords, sessions, personal tokens, OpenID), roles,
//! four-eyes proposals and the append-only audit trail, and the operations API's JSON routes
//! ([`operators::api`]). [`dead_letters`] is the dead-letter table and what operators do with it,
//! [`tenants`] the merchants and their keys, [`recon`] the reconciliation runs operators queue and
//! read. [`render`] prints any of it for the CLI, and [`operator_error`] is the one error of all of
//! it.
//!
//! The console's pages are not here: they read through this crate, and the reconciler's binary
//! mounts both. The settlement engine (webhooks, pollers, the nightly reconciliation) is not here
//! either: an operator's reconciliation run is a queued row the reconciler picks up.

pub mod dead_letters;
pub mod metrics;
pub mod operator_error;
pub mod operators;
pub mod recon;
pub mod render;
pub mod tenants;
