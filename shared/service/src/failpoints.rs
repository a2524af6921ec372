//! Crash points for the chaos harness, compiled only with the `failpoints` feature. Never in a
//! normal build: this module exists to break a process.
//!
//! A process that has fail points (`fail::fail_point!`, behind its own `failpoints` feature) calls
//! [`crash`] from them. `FAILPOINTS` configures them once, at start-up, e.g.
//! `FAILPOINTS='worker::after_provider=20*off->return'`: `return` crashes the whole process,
//! `panic` fails only the task it is in, `sleep(ms)` stalls it. The points are
//! `worker::after_claim`, `worker::after_provider` and `worker::after_record` on every send, and
//! `api::broker::after_commit` between a message's commit and its acknowledgement.

/// The exit status of a process that a fail point crashed, so a harness tells it from a real
/// failure.
pub const CRASH_EXIT_CODE: i32 = 86;

/// Ends the process at once, as a crash would: no graceful shutdown, nothing recorded or
/// acknowledged, connections dropped by the kernel, every lease held left to expire.
pub fn crash(point: &str) -> ! {
    // One line on stderr, so the harness's log for this process says why it died.
    eprintln!("fail point {point}: crashing the process (exit {CRASH_EXIT_CODE})");
    std::process::exit(CRASH_EXIT_CODE)
}
