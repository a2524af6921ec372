//! Development plumbing that is not part of oncepay itself: a throwaway PostgreSQL cluster
//! ([`pg::Cluster`]), a throwaway Citus cluster of three of them ([`citus::CitusCluster`]), either
//! one as the server oncepay runs on ([`server::Server`]), supervised child processes
//! ([`process::Child`]), and localstripe as one of them ([`localstripe`]), for the tasks, the tests
//! and the benchmarks.
//! They need PostgreSQL's binaries installed (and Citus, for a Citus cluster), but no running
//! server and no Docker engine.

pub mod citus;
pub mod localstripe;
pub mod pg;
pub mod process;
pub mod server;
pub mod workspace;
