//! The real `oncepay-worker` binary against the real provider simulator, as child processes: a
//! worker killed with SIGKILL after the provider charged and before it recorded causes no second
//! charge (the payment ends `succeeded` once its lease is swept, or `unknown` past the provider's key
//! window), and SIGTERM lets a send in flight finish and be recorded before the process exits 0.
//!
//! Needs the simulator binary built (`cargo build -p oncepay-simulator`; the test command builds
//! every binary first). The simulator's ledger (`GET /_sim/charges`) is the ground truth.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use oncepay_devkit::ports;
use oncepay_devkit::process::{Child, Spec};
use oncepay_devkit::wait::wait_until;
use oncepay_devkit::workspace;
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::Charge;
use oncepay_provider::KeyWindow;
use oncepay_simulator::client::SimulatorClient;
use oncepay_simulator::faults::FaultsPatch;
use oncepay_store::fixtures;
use oncepay_store::leases::{self, SweepCounts};
use sqlx::PgPool;

use crate::support::{self, Accepted, accept, tenant};

/// The simulator's only accepted credential (its default).
const SIMULATOR_API_KEY: &str = "sk_test_oncepay_simulator";

/// How long the simulator holds a charge's answer (the key in flight) after creating it. The
/// worker's request timeout is longer, so only the kill ends its wait, and the worker's lease is
/// longer still, so the hang is over before the sweeper can hand the payment to another worker.
const HANG_MS: u64 = 1_500;
const REQUEST_TIMEOUT_MS: u64 = 3_000;
const LEASE_SECS: u64 = 5;

const KEY_WINDOW: KeyWindow =
    KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3_600) };

struct Processes {
    logs: tempfile::TempDir,
    // Held for its lifetime: a child is killed when dropped.
    _simulator: Child,
    simulator_url: String,
    database_url: String,
    simulator_client: SimulatorClient,
}

impl Processes {
    /// Starts the simulator with `faults` (`faults.*` settings) against this test's database.
    async fn start(pool: &PgPool, faults: &[(&str, &str)]) -> Self {
        let logs = tempfile::Builder::new().prefix("oncepay-worker-process-").tempdir().unwrap();
        let port = ports::reserve().unwrap();
        // The simulator refuses settings it does not know, and `config::load` reads DATABASE_URL
        // (which this test process has) as `database.url`: start it without that variable.
        let mut spec = Spec::new("simulator", "env", logs.path())
            .arg("-u")
            .arg("DATABASE_URL")
            .arg(simulator_binary().to_string_lossy())
            .port(port)
            .setting("telemetry.log_format", "text");
        for (key, value) in faults {
            spec = spec.setting(&format!("faults.{key}"), *value);
        }
        let mut simulator = Child::spawn(spec).await.unwrap();
        let simulator_url = format!("http://127.0.0.1:{port}");
        simulator.wait_until_ready(&format!("{simulator_url}/readyz"), Duration::from_secs(30)).await.unwrap();
        Self {
            logs,
            _simulator: simulator,
            simulator_client: SimulatorClient::new(&simulator_url),
            simulator_url,
            database_url: support::database_url(pool).await,
        }
    }

    /// Starts a worker process named `id` and waits until it is ready.
    async fn worker(&self, id: &str) -> Child {
        let port = ports::reserve().unwrap();
        let spec = Spec::new(id, env!("CARGO_BIN_EXE_oncepay-worker"), self.logs.path())
            .env("DATABASE_URL", &self.database_url)
            .port(port)
            .setting("telemetry.log_format", "text")
            .setting("provider.base_url", &self.simulator_url)
            .setting("provider.api_key", SIMULATOR_API_KEY)
            .setting("provider.request_timeout_ms", REQUEST_TIMEOUT_MS.to_string())
            .setting("worker.id", id)
            .setting("worker.lease_secs", LEASE_SECS.to_string())
            .setting("worker.poll_interval_ms", "100");
        let mut worker = Child::spawn(spec).await.unwrap();
        worker.wait_until_ready(&format!("http://127.0.0.1:{port}/readyz"), Duration::from_secs(30)).await.unwrap();
        worker
    }

    /// The charges the simulator made for a payment, and how many POSTs carried its key.
    async fn charges_and_posts(&self, accepted: Accepted) -> (Vec<Charge>, u64) {
        let key = accepted.payment_id.downstream_key();
        let truth = self.simulator_client.ground_truth().await.unwrap();
        (truth.charges_with_key(key.as_str()).into_iter().cloned().collect(), truth.posts_with_key(key.as_str()))
    }

    /// Waits for `condition`, failing with the processes' logs after `timeout`.
    async fn wait_for<F: Future<Output = bool>>(
        &self,
        what: &str,
        timeout: Duration,
        mut condition: impl FnMut() -> F,
    ) {
        if let Err(timed_out) = wait_until(what, timeout, || {
            let done = condition();
            async move { done.await.then_some(()) }
        })
        .await
        {
            panic!("{timed_out}\n{}", self.logs_so_far().await);
        }
    }

    async fn logs_so_far(&self) -> String {
        let mut all = String::new();
        let mut entries = tokio::fs::read_dir(self.logs.path()).await.unwrap();
        while let Some(entry) = entries.next_entry().await.unwrap() {
            let text = tokio::fs::read_to_string(entry.path()).await.unwrap_or_default();
            all.push_str(&format!("--- {}\n{text}\n", entry.file_name().to_string_lossy()));
        }
        all
    }
}

fn simulator_binary() -> PathBuf {
    workspace::binary("oncepay-simulator").expect("build the simulator first: cargo build -p oncepay-simulator")
}

/// A worker that has sent `accepted` and is waiting for the provider's held answer, killed with
/// SIGKILL: the charge exists at the provider, nothing is recorded.
async fn kill_a_worker_after_the_provider_charged(processes: &Processes, pool: &PgPool) -> Accepted {
    let mut doomed = processes.worker("doomed").await;
    let accepted = accept(pool, tenant(pool).await, 4_200).await;
    processes
        .wait_for("the provider charged", Duration::from_secs(30), || async {
            !processes.charges_and_posts(accepted).await.0.is_empty()
        })
        .await;

    doomed.kill().await.unwrap();

    assert_eq!(support::status(pool, accepted).await, PaymentStatus::Processing, "nothing was recorded");
    assert_eq!(support::lease_holders(pool).await, ["doomed"]);
    accepted
}

/// Sweeps until the dead worker's lease has expired and been taken back.
async fn sweep_once_expired(processes: &Processes, pool: &PgPool) -> SweepCounts {
    let swept = wait_until("the lease to expire and be taken back", Duration::from_secs(LEASE_SECS * 4), || async {
        let mut conn = pool.acquire().await.unwrap();
        let swept = leases::sweep(&mut conn, "sweeper", KEY_WINDOW, 10).await.unwrap();
        (swept.changed() > 0).then_some(swept)
    })
    .await;
    match swept {
        Ok(swept) => swept,
        Err(timed_out) => panic!("{timed_out}\n{}", processes.logs_so_far().await),
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_worker_killed_after_the_provider_charged_causes_no_second_charge_and_the_payment_succeeds(pool: PgPool) {
    let processes = Processes::start(&pool, &[("hang_after_rate", "1.0"), ("hang_ms", &HANG_MS.to_string())]).await;
    let accepted = kill_a_worker_after_the_provider_charged(&processes, &pool).await;
    let no_hang = FaultsPatch { hang_after_rate: Some(0.0), ..FaultsPatch::default() };
    processes.simulator_client.set_faults(&no_hang).await.unwrap();

    let swept = sweep_once_expired(&processes, &pool).await;
    let mut successor = processes.worker("successor").await;
    processes
        .wait_for("the payment to succeed", Duration::from_secs(30), || async {
            support::status(&pool, accepted).await == PaymentStatus::Succeeded
        })
        .await;

    assert_eq!(swept, SweepCounts { released: 1, ..SweepCounts::default() });
    let (charges, posts) = processes.charges_and_posts(accepted).await;
    assert_eq!(charges.len(), 1, "exactly one charge at the provider: {charges:?}");
    assert_eq!(posts, 2, "the successor resent under the same key");
    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.provider_charge_id.as_deref(), Some(charges[0].id.as_str()));
    assert_eq!(payment.send_attempts, 2);
    assert_eq!(support::ledger_entry(&pool, accepted).await, Some((charges[0].id.clone(), 4_200, "EUR".to_owned())));
    assert_eq!(fixtures::count(&pool, "outbox").await, 0);
    let actors: Vec<String> = support::events(&pool, accepted).await.into_iter().map(|e| e.2).collect();
    assert_eq!(actors, ["api", "worker:doomed", "sweeper", "worker:successor", "worker:successor"]);

    let exit = successor.terminate(Duration::from_secs(30)).await.unwrap();
    assert!(exit.success(), "SIGTERM exits 0: {exit}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_worker_killed_after_the_provider_charged_past_the_key_window_leaves_the_payment_unknown(pool: PgPool) {
    let processes = Processes::start(&pool, &[("hang_after_rate", "1.0"), ("hang_ms", &HANG_MS.to_string())]).await;
    let accepted = kill_a_worker_after_the_provider_charged(&processes, &pool).await;
    // By the time the lease is taken back, the provider may have forgotten the key.
    support::age_first_send(&pool, accepted, Duration::from_secs(86_400)).await;

    let swept = sweep_once_expired(&processes, &pool).await;

    assert_eq!(swept, SweepCounts { uncertain: 1, ..SweepCounts::default() });
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Unknown);
    assert_eq!(support::unknown_entry(&pool, accepted).await.unwrap().0, "lease_expired_past_key_window");
    assert_eq!(fixtures::count(&pool, "outbox").await, 0, "no worker can resend it");
    assert_eq!(processes.charges_and_posts(accepted).await.0.len(), 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn sigterm_lets_the_send_in_flight_finish_and_be_recorded_then_exits_0(pool: PgPool) {
    // Every answer takes a second, so the send is surely in flight when SIGTERM arrives.
    let processes = Processes::start(&pool, &[("latency_ms", "1000")]).await;
    let mut worker = processes.worker("w1").await;
    let accepted = accept(&pool, tenant(&pool).await, 900).await;
    processes
        .wait_for("the charge request reached the provider", Duration::from_secs(30), || async {
            processes.charges_and_posts(accepted).await.1 == 1
        })
        .await;

    let exit = worker.terminate(Duration::from_secs(30)).await.unwrap();

    assert!(exit.success(), "SIGTERM exits 0: {exit}");
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Succeeded, "{}", processes.logs_so_far().await);
    assert_eq!(processes.charges_and_posts(accepted).await.0.len(), 1);
    assert_eq!(fixtures::count(&pool, "outbox").await, 0);
}
