//! Settles uncertain outcomes, sweeps leases, reaps keys, reconciles the ledger; the operator CLI
//!
//! Scaffolding: the binary is being built; see the open issues.

fn main() {}
