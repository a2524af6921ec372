//! The simulator's behaviour, over HTTP: in-process simulators on port 0 (and the real binary in
//! `process`), wiremock servers as webhook receivers, oncepay's own provider client as a caller.

// Helpers outside `#[test]` functions panic on purpose too: here a panic is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod faults;
mod payment_methods;
mod process;
mod protocol;
mod refunds;
mod support;
mod webhooks;
