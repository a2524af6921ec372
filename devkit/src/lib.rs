//! Development plumbing that is not part of oncepay itself: a throwaway PostgreSQL cluster
//! ([`pg::Cluster`]) and supervised child processes ([`process::Child`]).
//!
//! The test command, the run command, the cross-process tests, the chaos harness and the
//! benchmarks all bring up what they need with these, on a machine with PostgreSQL's binaries
//! installed and no server running, and with no Docker engine.

pub mod pg;
pub mod process;
pub mod workspace;
