//! The api over HTTP against a real PostgreSQL: each test gets a fresh, migrated database
//! (`#[sqlx::test]`, `DATABASE_URL` names the server) and the api on a free port. The crash test
//! brings up a throwaway cluster of its own, so it can crash it; the Schemathesis test checks every
//! answer against the OpenAPI document.

// Helpers outside `#[test]` functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth;
mod concurrency;
mod connect;
mod crash;
mod helpers;
mod intake;
mod ops;
mod replays;
mod schemathesis;
mod status;
mod validation;
