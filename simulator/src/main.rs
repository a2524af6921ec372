//! A payment provider simulator with fault injection: the ground truth for tests
//!
//! Scaffolding: the binary is being built; see the open issues.

fn main() {}
