//! The api over HTTP, and over RabbitMQ (`broker`), against a real PostgreSQL: each test gets a
//! fresh, migrated database (`#[sqlx::test]`, `DATABASE_URL` names the server) and the api on a free
//! port. The crash test
//! and a refund test bring up a throwaway cluster of their own, so they can crash it; the Schemathesis
//! test checks every answer against the OpenAPI document.

// Helpers outside `#[test]` functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth;
mod broker;
mod concurrency;
mod connect;
mod crash;
mod helpers;
mod intake;
mod ops;
mod refunds;
mod replays;
mod schemathesis;
mod status;
mod validation;
mod webhook_endpoints;
