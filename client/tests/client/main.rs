//! The client against a wiremock server standing in for the api (and, for the CLI, the real
//! `oncepay` binary against the same), and its publisher and dead-letter tools against a real RabbitMQ node. Backoffs are tiny; the only real waits are the
//! `Retry-After`s and long polls a test is about.

// Helpers outside `#[test]` functions panic on purpose too: a failed step fails the test.
#![allow(clippy::unwrap_used)]

mod cli;
mod create;
mod dead_letters;
mod listen;
mod publish;
mod refunds;
mod secrets;
mod support;
mod wait;
mod webhooks;
