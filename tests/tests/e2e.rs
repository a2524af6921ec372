//! End to end, every process real: PostgreSQL, the provider simulator, two api processes, two
//! workers and a reconciler, driven through the client library by many concurrent tasks of two
//! tenants, who also refund some of their payments, then every invariant of the contract checked
//! against the database and the simulator's ground truth. Process faults are the chaos harness's
//! (`tests/chaos.rs`).
//!
//! Needs every binary built (`cargo build --workspace --bins`; the test command does it first).

// Helpers outside `#[test]` functions fail loudly too: clippy's test exemption does not reach them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use oncepay_devkit::pg::Durability;
use oncepay_simulator::control::PlantCharge;
use oncepay_simulator::faults::FaultsPatch;
use oncepay_tests::checker::{self, Verdict};
use oncepay_tests::refunds::RefundPlan;
use oncepay_tests::report::Report;
use oncepay_tests::system::{Binaries, Provider, System, SystemConfig, Timing, Topology};
use oncepay_tests::workload::{self, Clients, MisuseOutcome, Observations, Plan, ProbeOutcome, WorkloadConfig};

const TOPOLOGY: Topology = Topology { apis: 2, workers: 2, reconcilers: 1 };

async fn start(seed: u64) -> System {
    System::start(SystemConfig {
        binaries: Binaries::built().unwrap(),
        topology: TOPOLOGY,
        tenants: vec!["acme".into(), "globex".into()],
        durability: Durability::Fast,
        timing: Timing::default(),
        provider: Provider::Simulator { seed },
        log_dir: None,
        env: Vec::new(),
        broker: false,
    })
    .await
    .unwrap()
}

/// A workload with duplicate storms across api processes, keys shared by both tenants, key misuse,
/// and reads of the other tenant's payments.
fn workload(seed: u64, intents: usize) -> WorkloadConfig {
    WorkloadConfig {
        seed,
        intents,
        concurrency: 32,
        spread: Duration::from_secs(4),
        storm_rate: 0.1,
        storm_size: 5,
        shared_key_rate: 0.1,
        misuse_rate: 0.1,
        probe_rate: 0.15,
        follow: Duration::from_secs(30),
        resends: 2,
        payment_methods: Vec::new(),
        refund_rate: 0.3,
        broker_rate: 0.0,
    }
}

/// Sends the workload, settles and checks.
async fn drive(system: &System, config: &WorkloadConfig) -> (Report, Plan) {
    let plan = Plan::draw(config, system.tenants().len(), TOPOLOGY.apis).unwrap();
    let clients = Clients::new(system.tenants(), &system.api_urls()).unwrap();
    let observations = workload::run(&plan, config, &clients).await;
    let settled = checker::settle(system.pool(), Duration::from_secs(60)).await.unwrap();
    let verdict = check(system, &observations).await;
    let report = Report {
        title: "oncepay end to end".into(),
        seed: config.seed,
        span: config.spread,
        topology: TOPOLOGY,
        tenants: system.tenants().len(),
        faults: Default::default(),
        plan_storms: plan.jobs.iter().filter(|job| job.copies > 1).count(),
        observations,
        settled,
        verdict,
        two_phase_commits: system.two_phase_commits_since_start().await.unwrap(),
        broker: None,
        events: None,
    };
    (report, plan)
}

async fn check(system: &System, observations: &Observations) -> Verdict {
    let simulator = system.simulator().unwrap();
    let truth = simulator.ground_truth().await.unwrap();
    let refunds = simulator.refund_truth().await.unwrap();
    checker::check(system.pool(), &truth.charges, &refunds.refunds, system.tenants(), observations).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_clients_of_two_tenants_are_charged_at_most_once_and_every_payment_settles() {
    let seed = 0x0E2E_5EED;
    let mut system = start(seed).await;
    // The provider declines some charges and responds uncertainly to some (5xx, a dropped
    // connection or a hang after charging, replayed 5xx), and duplicates and reorders webhooks, so
    // the reconciler's paths run too.
    system
        .simulator()
        .unwrap()
        .set_faults(&FaultsPatch {
            decline_rate: Some(0.15),
            refund_failure_rate: Some(0.15),
            error_after_rate: Some(0.04),
            drop_after_rate: Some(0.03),
            hang_after_rate: Some(0.03),
            replay_stored_5xx: Some(true),
            webhook_duplicate_rate: Some(0.3),
            webhook_reorder: Some(true),
            webhook_reorder_hold_ms: Some(300),
            ..FaultsPatch::default()
        })
        .await
        .unwrap();

    let (report, plan) = drive(&system, &workload(seed, 240)).await;

    // Shown by the test runner when asked (`--no-capture`), and with any failure.
    eprintln!("{report}");
    let passed = report.passed();
    let logs = if passed { None } else { Some(system.keep_logs()) };
    assert!(passed, "{report}\nlogs: {logs:?}");
    // The run really did what it claims: otherwise a pass would prove nothing.
    let o = &report.observations;
    let v = &report.verdict;
    assert_eq!(o.accepted(), plan.jobs.len(), "every intent was answered\n{report}");
    assert!(o.intents.values().any(|r| r.replayed > 0), "duplicates were replayed\n{report}");
    let misuses: Vec<_> = o.intents.values().filter_map(|r| r.misuse.as_ref()).collect();
    assert!(!misuses.is_empty() && misuses.iter().all(|m| **m == MisuseOutcome::Rejected), "{report}");
    assert!(!o.probes.is_empty() && o.probes.iter().all(|p| p.outcome == ProbeOutcome::NotFound), "{report}");
    let shared_keys =
        o.intents.keys().filter(|(tenant, key)| o.intents.contains_key(&(1 - tenant, key.clone()))).count();
    assert!(shared_keys >= 2, "some keys were used by both tenants\n{report}");
    assert_eq!(v.payments, plan.jobs.len(), "one payment per (tenant, key)\n{report}");
    for status in ["succeeded", "failed"] {
        assert!(v.by_status.get(status).is_some_and(|n| *n > 0), "some payments {status}\n{report}");
    }
    assert_eq!(v.charge_histogram[2], 0, "{report}");
    // Refunds ran every plan: some went back, some the provider failed, a storm of one refund got
    // one refund, and two refunds that together asked for too much were not both accepted.
    for status in ["succeeded", "failed"] {
        assert!(v.refunds.by_status.get(status).is_some_and(|n| *n > 0), "some refunds {status}\n{report}");
    }
    let storms = o.refunds.values().filter(|r| r.plan == RefundPlan::Storm && r.answered > 1);
    assert!(storms.count() > 0, "refund storms were answered\n{report}");
    assert!(v.refunds.refused_too_much > 0, "a refund of more than was left was refused\n{report}");
    let unclean = system.shutdown().await.unwrap();
    assert!(unclean.is_empty(), "every process exits 0 on SIGTERM: {unclean:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checker_reports_a_second_charge_missing_ledger_entries_and_a_charge_nobody_asked_for() {
    let seed = 0x0C4E_CCE2;
    let system = start(seed).await;
    let (report, _) = drive(&system, &workload(seed, 20)).await;
    assert!(report.passed(), "{report}");
    let succeeded: Vec<(uuid::Uuid, uuid::Uuid, i64, String)> = sqlx::query!(
        "SELECT tenant_id, payment_id, amount, currency FROM payments WHERE status = 'succeeded' ORDER BY payment_id LIMIT 2"
    )
    .fetch_all(system.pool())
    .await
    .unwrap()
    .into_iter()
    .map(|payment| (payment.tenant_id, payment.payment_id, payment.amount, payment.currency))
    .collect();
    let [(tenant, charged_twice, amount, currency), (_, unbooked, _, _)] = &succeeded[..] else {
        panic!("two succeeded payments expected\n{report}")
    };

    // A second provider charge for one payment, as a double send would make it.
    let mut second = PlantCharge::succeeded(*amount, currency);
    second.metadata.insert("oncepay_tenant_id".into(), tenant.to_string());
    second.metadata.insert("oncepay_payment_id".into(), charged_twice.to_string());
    system.simulator().unwrap().plant(&second).await.unwrap();
    // A ledger entry lost.
    sqlx::query!("DELETE FROM ledger_entries WHERE payment_id = $1", unbooked).execute(system.pool()).await.unwrap();
    // A refund's ledger entry lost.
    let unbooked_refund: uuid::Uuid =
        sqlx::query_scalar!("SELECT refund_id FROM refund_ledger_entries ORDER BY refund_id LIMIT 1")
            .fetch_one(system.pool())
            .await
            .expect("a refund succeeded");
    sqlx::query!("DELETE FROM refund_ledger_entries WHERE refund_id = $1", unbooked_refund)
        .execute(system.pool())
        .await
        .unwrap();
    // A charge for no payment at all, as a provider call made without an accepted payment would.
    let mut stray = PlantCharge::succeeded(500, "EUR");
    stray.idempotency_key = Some(format!("oncepay-{}", uuid::Uuid::now_v7()));
    system.simulator().unwrap().plant(&stray).await.unwrap();
    let verdict = check(&system, &report.observations).await;

    let found: Vec<(u8, &str)> = verdict.violations.iter().map(|v| (v.invariant, v.what.as_str())).collect();
    let mentions = |invariant: u8, id: &uuid::Uuid| {
        verdict.violations.iter().any(|v| v.invariant == invariant && v.evidence.contains(&id.to_string()))
    };
    assert!(mentions(1, charged_twice), "{found:?}");
    assert!(mentions(4, unbooked), "{found:?}");
    assert!(mentions(8, &unbooked_refund), "{found:?}");
    assert!(
        found.contains(&(1, "the provider charged for a payment that was never accepted (not failing closed)")),
        "{found:?}"
    );
    assert_eq!(verdict.charge_histogram[2], 1, "{found:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_process_connects_as_its_own_role_and_none_as_a_superuser() {
    let seed = 0x0001_2013;
    let system = start(seed).await;
    // One payment each way, so that every process has its connections open.
    let (report, _) = drive(&system, &workload(seed, 4)).await;
    assert!(report.passed(), "{report}");

    let connected: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT DISTINCT a.application_name::text, a.usename::text, r.rolsuper FROM pg_stat_activity a \
         JOIN pg_roles r ON r.rolname = a.usename \
         WHERE a.datname = current_database() AND a.application_name IN ('oncepay-api', 'oncepay-worker', 'oncepay-reconciler') \
         ORDER BY 1",
    )
    .fetch_all(system.pool())
    .await
    .unwrap();
    assert_eq!(
        connected,
        [
            ("oncepay-api".to_owned(), "oncepay_api".to_owned(), false),
            ("oncepay-reconciler".to_owned(), "oncepay_reconciler".to_owned(), false),
            ("oncepay-worker".to_owned(), "oncepay_worker".to_owned(), false),
        ],
        "each process's connections, by the role they signed in as"
    );
}
