//! The reconciler: where uncertain outcomes become certain, and where operators work.
//!
//! As a service ([`startup::Application`]) it settles `unknown` payments and refunds ([`unknown`])
//! from signed provider webhooks ([`webhooks`], [`refund_webhooks`]) and by polling the provider
//! ([`poller`]), dead-letters what it cannot settle, takes back expired worker leases ([`sweeper`]),
//! deletes expired idempotency keys ([`reaper`]), and reconciles the ledger with the provider every
//! night and whenever an operator queues a run ([`recon`]). It serves the operator API ([`http::operator_api`]): the console's pages
//! ([`oncepay_console`]) beside the operations API's JSON routes, where operators, signed in and limited
//! by their roles, work dead letters and approve each other's proposals (both from
//! [`oncepay_ops`]). As a CLI ([`cli`]) it is the operator's tool: migrations and the first admin
//! on the database, everything else through the operations API. `main.rs` only parses arguments,
//! loads settings, starts telemetry and runs; everything testable is here.

pub mod backlog;
pub mod cli;
pub mod http;
pub mod metrics;
pub mod poller;
pub mod reaper;
pub mod recon;
pub mod refund_webhooks;
pub mod settings;
pub mod startup;
pub mod stripe_webhooks;
pub mod sweeper;
pub mod unknown;
pub mod verdict;
pub mod webhook_outcome;
pub mod webhooks;
