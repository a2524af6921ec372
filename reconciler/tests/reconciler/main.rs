//! The reconciler's integration tests, one binary: its loops (for payments and refunds), webhooks,
//! nightly run and CLI against a real PostgreSQL (each test gets a fresh, migrated database from
//! `#[sqlx::test]`; `DATABASE_URL` names the server) and a wiremock provider or Stripe, and the real
//! binaries as child processes. The suites run under nextest, a process per test, so a test may
//! install process-wide state such as the tracing subscriber.

// Helpers outside `#[test]` functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backlog;
mod cli;
mod console;
mod end_to_end;
mod merchant_events;
mod oidc;
mod operators;
mod poller;
mod reaper;
mod recon;
mod recon_refunds;
mod refund_poller;
mod refund_proposals;
mod refund_reaper;
mod refund_sweeper;
mod refund_webhooks;
mod service;
mod sign_ins;
mod stripe_refund_webhooks;
mod stripe_webhooks;
mod support;
mod sweeper;
mod trace;
mod webhook_race;
mod webhooks;
