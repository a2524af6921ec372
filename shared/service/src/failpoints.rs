//! Crash points for the chaos harness, compiled only with the `failpoints` feature. Never in a
//! normal build: this module exists to break the worker.
//!
//! The drainer has three points on every send: `worker::after_claim`, `worker::after_provider` and
//! `worker::after_record`. `FAILPOINTS` configures them once, at start-up, e.g.
//! `FAILPOINTS='worker::after_provider=20*off->return'`: `return` crashes the whole process
//! ([`crash`]), `panic` fails only that send's task (its lease expires and the sweeper takes it
//! back), `sleep(ms)` stalls it.

/// The exit status of a worker that a fail point crashed, so a harness tells it from a real failure.
pub const CRASH_EXIT_CODE: i32 = 86;

/// Ends the process at once, as a crash would: no graceful shutdown, nothing recorded, connections
/// dropped by the kernel, every lease held left to expire.
pub fn crash(point: &str) -> ! {
    // One line on stderr, so the harness's log for this worker says why it died.
    eprintln!("fail point {point}: crashing the worker (exit {CRASH_EXIT_CODE})");
    std::process::exit(CRASH_EXIT_CODE)
}
