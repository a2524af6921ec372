//! Development plumbing that is not part of oncepay itself: a throwaway PostgreSQL cluster
//! ([`pg::Cluster`]) and supervised child processes ([`process::Child`]), for the tasks, the tests
//! and the benchmarks. They need PostgreSQL's binaries installed, but no running server and no
//! Docker engine.

pub mod pg;
pub mod process;
pub mod workspace;
