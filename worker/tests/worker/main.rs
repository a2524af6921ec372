//! The worker's integration tests, one binary: drainers against a real PostgreSQL (each test gets a
//! fresh, migrated database from `#[sqlx::test]`; `DATABASE_URL` names the server) and a wiremock
//! provider, the simulator or a wiremock Stripe, and the real binary as a child process. The suites
//! run under nextest, a process per test, so a test may install process-wide state such as the
//! tracing subscriber.

// Helpers outside `#[test]` functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod app;
mod concurrency;
mod events;
mod fairness;
mod fencing;
mod leases;
mod payment_method;
mod process;
mod provider_answers;
mod recording_together;
mod refunds;
mod requeued;
mod shutdown;
mod stripe;
mod support;
mod trace;
