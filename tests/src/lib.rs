//! The cross-process suite and the chaos harness: real binaries, a throwaway PostgreSQL, the
//! provider simulator.
//!
//! One library, three users: the end-to-end tests (`tests/e2e.rs`), the short chaos profile that
//! runs with the test command (`tests/chaos.rs`), and the `oncepay-chaos` binary (any profile, any
//! seed). They share everything, so they can never check different things:
//!
//! - [`system`]: the launcher — cluster, migrations, tenants, simulator, N api / worker /
//!   reconciler processes; kill, restart, pause, resume any of them; crash and resume PostgreSQL.
//! - [`workload`]: the seeded workload driven through the client library from many tasks.
//! - [`faults`]: the seeded fault schedule and the worker's fail points.
//! - [`checker`]: settling, then the contract's five invariants against the database and the
//!   simulator's ground truth.
//! - [`chaos`]: a whole harness run; [`report`]: what it prints.
//!
//! Nothing here is part of oncepay: it drives the system only through its processes, its HTTP API,
//! its operator CLI and the simulator's control endpoints, and only reads the database.

pub mod chaos;
pub mod checker;
pub mod faults;
pub mod report;
pub mod system;
pub mod workload;
