//! The HTTP intake: authenticates tenants, accepts payment requests idempotently, serves their status
//!
//! Scaffolding: the binary is being built; see the open issues.

fn main() {}
