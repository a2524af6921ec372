//! The chaos harness's short profile, run by the test command: a few minutes of the real system
//! under seeded faults (processes killed, paused and crashed at fail points, PostgreSQL crashed,
//! every simulator fault, the RabbitMQ node stopped and its connections cut; under Citus, worker
//! nodes crashed too), with the events to merchants sent to a receiver that misbehaves, then every
//! invariant of the contract checked. A failure prints the report, the kept logs and the command that replays the
//! seed.

// Helpers outside `#[test]` functions fail loudly too: clippy's test exemption does not reach them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use oncepay_tests::chaos::{self, ChaosConfig, Crashable, Profile};
use oncepay_tests::receiver::Behaviour;

/// `CHAOS_SEED`, else the day's (days since 1970-01-01), so CI explores a new schedule every day.
/// Not an `ONCEPAY_` variable: that prefix configures the binaries.
fn seed() -> u64 {
    match std::env::var("CHAOS_SEED") {
        Ok(seed) => seed.parse().unwrap(),
        Err(_) => time::OffsetDateTime::now_utc().unix_timestamp().div_euclid(86_400).unsigned_abs(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_the_short_chaos_profile_every_promise_holds() {
    let seed = seed();
    // The worker and api with fail points, built into `target/chaos` first.
    let crashable = Crashable::build().await.unwrap();

    let outcome = chaos::run(&ChaosConfig::new(Profile::Short, seed), crashable).await.unwrap();

    let report = &outcome.report;
    eprintln!("{report}");
    assert!(
        outcome.passed(),
        "{report}\nlogs: {:?}\nreproduce: cargo build --workspace --bins && target/debug/oncepay-chaos --profile short --seed {seed}",
        outcome.logs
    );
    // The faults really happened, or a pass proves nothing.
    let injected = |needle: &str| report.faults.iter().any(|(kind, n)| kind.contains(needle) && *n > 0);
    for kind in [
        "SIGKILL worker",
        "SIGKILL reconciler",
        "SIGSTOP worker",
        "PostgreSQL",
        "fail point",
        "simulator: rate_limited",
        "simulator: lookup_error",
        "simulator: malformed",
        "simulator: hang_before",
        "RabbitMQ node stop",
        "RabbitMQ connections cut",
        "fail point api::broker::after_commit",
    ] {
        assert!(injected(kind), "no {kind:?} fault was injected\n{report}");
    }
    if report.two_phase_commits.is_some() {
        assert!(injected("Citus worker node"), "no worker node was stopped\n{report}");
    }
    assert!(report.observations.accepted() > 0 && report.verdict.charge_histogram[1] > 0, "{report}");
    let broker = report.broker.as_ref().expect("the short profile publishes to RabbitMQ");
    assert!(broker.confirmed > 0 && broker.payments > 0, "{report}");
    // The receiver misbehaved every way, deliveries ran out of attempts, an endpoint went away, and
    // process faults hit deliveries in flight.
    let events = report.events.as_ref().expect("the short profile subscribes a receiver");
    for behaviour in Behaviour::ALL {
        assert!(
            events.requests.get(&behaviour).is_some_and(|n| *n > 0),
            "the receiver never responded {behaviour}\n{report}"
        );
    }
    assert!(events.delivered > 0 && events.dead_lettered > 0 && events.interrupted > 0, "{report}");
    assert!(events.disabled.iter().any(|(_, reason)| reason == "gone"), "{report}");
}
