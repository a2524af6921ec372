//! Benchmarks oncepay against raw PostgreSQL running the same SQL
//!
//! Scaffolding: the binary is being built; see the open issues.

fn main() {}
