//! `oncepay-bench`: oncepay measured against PostgreSQL running the same SQL, on one machine, in
//! one run, on one throwaway PostgreSQL.
//!
//! [`raw`] makes the pgbench baselines from the project's own SQL; [`loadgen`], [`services`] and
//! [`measure`] drive the release binaries, [`closed_loop`] the reconciler's endpoints
//! ([`webhooks`], [`console`]), [`broker`] a RabbitMQ node and the api taking payments from it,
//! and [`receiver`] stands in for a merchant's endpoint; [`cpu`] records what each process spent;
//! [`run`] orders the phases and [`report`] prints and keeps the results, [`targets`] checking the
//! issues' targets among them.
//! Timing lives here and only here: this crate's tests check its logic (script generation, parsing,
//! percentiles), never a speed.

pub mod broker;
pub mod closed_loop;
pub mod console;
pub mod cpu;
pub mod dataset;
pub mod latency;
pub mod loadgen;
pub mod machine;
pub mod measure;
pub mod pgbench;
pub mod pgbench_script;
pub mod raw;
pub mod receiver;
pub mod report;
pub mod run;
pub mod services;
pub mod targets;
pub mod webhooks;
