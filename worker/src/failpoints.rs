//! Crash points for the chaos harness, compiled only with the `failpoints` feature.
//!
//! The drainer evaluates three `fail::fail_point!`s on every send: `worker::after_claim` (the lease
//! is held and the payment is `processing`, nothing sent), `worker::after_provider` (the provider
//! answered, nothing recorded), and `worker::after_record` (the outcome is committed). They are
//! configured by the `FAILPOINTS` environment variable, read once at start-up, e.g.
//! `FAILPOINTS='worker::after_provider=20*off->return'`: the action `return` crashes the whole
//! process at that point (see [`crash`]), `panic` fails only that send's task (its lease expires and
//! the sweeper takes it back), `sleep(ms)` stalls it.
//!
//! This module must never be compiled into a normal build: it exists to break the worker.

/// The exit status of a worker that a fail point crashed, so a harness tells it from a real failure.
pub const CRASH_EXIT_CODE: i32 = 86;

/// Ends the process at once, as a crash would: no graceful shutdown, nothing recorded, connections
/// dropped by the kernel, every lease held left to expire.
pub fn crash(point: &str) -> ! {
    // One line on stderr, so the harness's log for this worker says why it died.
    eprintln!("fail point {point}: crashing the worker (exit {CRASH_EXIT_CODE})");
    std::process::exit(CRASH_EXIT_CODE)
}
