//! Settles uncertain outcomes, sweeps leases, reaps keys, reconciles the ledger; the operator CLI
