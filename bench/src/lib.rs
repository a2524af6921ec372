//! `oncepay-bench`: oncepay measured against PostgreSQL running the very same SQL, on one machine,
//! in one run, on one throwaway PostgreSQL.
//!
//! The raw baselines are pgbench scripts made from the project's own statement files
//! ([`raw`], [`pgbench_script`], [`pgbench`]); the service figures come from the real release
//! binaries driven over loopback by a closed-loop HTTP/1.1 load generator on a thread of its own
//! ([`loadgen`]) and from real workers draining into the provider simulator ([`services`],
//! [`measure`]). Every window records what each process spent in CPU time ([`cpu`]), so the cost
//! per payment is known and a saturated load generator or a busy machine shows. [`run`] orders the
//! phases; [`report`] prints the table and keeps the JSON. Timing lives here and only here: tests of
//! this crate check its logic (script generation, parsing, percentiles), never a speed.

pub mod cpu;
pub mod dataset;
pub mod latency;
pub mod loadgen;
pub mod machine;
pub mod measure;
pub mod pgbench;
pub mod pgbench_script;
pub mod raw;
pub mod report;
pub mod run;
pub mod services;
pub mod webhooks;
