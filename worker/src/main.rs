//! Drains the outbox and asks the provider to charge, at most once per payment
//!
//! Scaffolding: the binary is being built; see the open issues.

fn main() {}
