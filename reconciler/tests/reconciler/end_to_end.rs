//! End to end, every process real: the provider simulator hangs after creating each charge, longer
//! than the worker waits, so the worker records the payment `unknown`; the reconciler settles it as
//! `succeeded`, and the provider holds exactly one charge for it.
//!
//! Needs the worker and simulator binaries built (`cargo build --workspace --bins`; the test command
//! builds every binary first). The simulator's ledger (`GET /_sim/charges`) is the ground truth.

use std::time::Duration;

use oncepay_devkit::ports;
use oncepay_devkit::process::{Child, Spec};
use oncepay_devkit::workspace;
use oncepay_domain::ids::PaymentId;
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::Charge;
use oncepay_simulator::client::SimulatorClient;
use oncepay_store::fixtures::tenant;
use oncepay_webhook_signature::WebhookSecret;
use sqlx::PgPool;
use sqlx::postgres::PgListener;

use crate::support::{self, reaches};

const SIMULATOR_API_KEY: &str = "sk_test_oncepay_simulator";
/// The worker gives up on an answer after this long; the simulator holds each answer longer.
const REQUEST_TIMEOUT_MS: u64 = 1_000;
const HANG_MS: u64 = 4_000;

struct World {
    logs: tempfile::TempDir,
    simulator: SimulatorClient,
    // Held for their lifetime: a child is killed when dropped.
    _children: Vec<Child>,
}

impl World {
    /// Starts the simulator (hanging after every charge, webhooks to the reconciler unless
    /// `webhooks` is false), a worker and a reconciler, all on this test's database.
    async fn start(pool: &PgPool, webhooks: bool) -> Self {
        let logs = tempfile::Builder::new().prefix("oncepay-reconciler-e2e-").tempdir().unwrap();
        let database_url = support::reconciler_url_of(pool);
        let (simulator_port, worker_port, reconciler_port) =
            (ports::reserve().unwrap(), ports::reserve().unwrap(), ports::reserve().unwrap());
        let simulator_url = format!("http://127.0.0.1:{simulator_port}");
        let reconciler_url = format!("http://127.0.0.1:{reconciler_port}");
        let webhook_secret = WebhookSecret::generate();

        let simulator = Spec::new("simulator", binary("oncepay-simulator"), logs.path())
            .port(simulator_port)
            .setting("telemetry.log_format", "text")
            .setting("faults.hang_after_rate", "1.0")
            .setting("faults.hang_ms", HANG_MS.to_string())
            .setting("faults.webhook_drop_rate", if webhooks { "0.0" } else { "1.0" })
            .setting("simulator.webhook_url", format!("{reconciler_url}/webhooks/provider"))
            .setting("simulator.webhook_secret", &webhook_secret);
        let worker = Spec::new("worker", binary("oncepay-worker"), logs.path())
            .env("DATABASE_URL", &database_url)
            .port(worker_port)
            .setting("telemetry.log_format", "text")
            .setting("provider.base_url", &simulator_url)
            .setting("provider.api_key", SIMULATOR_API_KEY)
            .setting("provider.request_timeout_ms", REQUEST_TIMEOUT_MS.to_string())
            .setting("worker.poll_interval_ms", "100");
        let reconciler = Spec::new("reconciler", env!("CARGO_BIN_EXE_oncepay-reconciler"), logs.path())
            .env("DATABASE_URL", &database_url)
            .port(reconciler_port)
            .setting("provider.base_url", &simulator_url)
            .setting("provider.api_key", SIMULATOR_API_KEY)
            .setting("poller.interval_ms", "100")
            .setting("poller.backoff.base_ms", "200")
            .setting("poller.backoff.max_ms", "500")
            .setting_list("webhooks.secrets", &[&webhook_secret]);

        let mut children = Vec::new();
        for (spec, ready) in [
            (simulator, format!("{simulator_url}/readyz")),
            (worker, format!("http://127.0.0.1:{worker_port}/readyz")),
            (reconciler, format!("{reconciler_url}/readyz")),
        ] {
            let mut child = Child::spawn(spec).await.unwrap();
            child.wait_until_ready(&ready, Duration::from_secs(30)).await.unwrap();
            children.push(child);
        }
        Self { logs, simulator: SimulatorClient::new(&simulator_url), _children: children }
    }

    /// The charges the simulator made under the payment's key, and how many POSTs carried it.
    async fn charges_and_posts(&self, payment_id: PaymentId) -> (Vec<Charge>, u64) {
        let key = payment_id.downstream_key();
        let truth = self.simulator.ground_truth().await.unwrap();
        (truth.charges_with_key(key.as_str()).into_iter().cloned().collect(), truth.posts_with_key(key.as_str()))
    }

    async fn logs(&self) -> String {
        let mut all = String::new();
        for entry in std::fs::read_dir(self.logs.path()).unwrap() {
            let entry = entry.unwrap();
            all.push_str(&format!(
                "--- {}\n{}\n",
                entry.file_name().to_string_lossy(),
                std::fs::read_to_string(entry.path()).unwrap()
            ));
        }
        all
    }
}

fn binary(name: &str) -> std::path::PathBuf {
    workspace::binary(name).expect("build every binary first: cargo build --workspace --bins")
}

/// The payment's audit trail: (from, to, actor).
async fn trail(pool: &PgPool, payment_id: PaymentId) -> Vec<(Option<PaymentStatus>, PaymentStatus, String)> {
    sqlx::query!(
        r#"SELECT from_status AS "from_status: PaymentStatus", to_status AS "to_status: PaymentStatus", actor
           FROM payment_events WHERE payment_id = $1 ORDER BY seq"#,
        payment_id.as_uuid()
    )
    .map(|row| (row.from_status, row.to_status, row.actor))
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn a_charge_whose_answer_never_arrives_ends_succeeded_with_one_charge(
    pool: PgPool,
    webhooks: bool,
) -> Vec<String> {
    let world = World::start(&pool, webhooks).await;
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen("oncepay_payment").await.unwrap();
    let tenant_id = tenant(&pool, "acme").await;

    let payment_id = support::accept(&pool, tenant_id, "order-1", 4_200).await;

    let wait = Duration::from_secs(60);
    let settled = reaches(&mut listener, &pool, tenant_id, payment_id, PaymentStatus::Succeeded, wait).await;
    assert!(settled, "the payment never succeeded\n{}", world.logs().await);
    let (charges, posts) = world.charges_and_posts(payment_id).await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[0].amount, 4_200);
    assert_eq!(posts, 1, "the worker sent once and never resent");
    assert_eq!(support::ledger_entry(&pool, payment_id).await, (charges[0].id.clone(), 4_200));
    let trail = trail(&pool, payment_id).await;
    let moves: Vec<_> = trail.iter().map(|(from, to, _)| (*from, *to)).collect();
    assert_eq!(
        moves,
        [
            (None, PaymentStatus::Pending),
            (Some(PaymentStatus::Pending), PaymentStatus::Processing),
            (Some(PaymentStatus::Processing), PaymentStatus::Unknown),
            (Some(PaymentStatus::Unknown), PaymentStatus::Succeeded),
        ],
        "{trail:?}"
    );
    trail.into_iter().map(|(_, _, actor)| actor).collect()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn with_webhooks_a_charge_whose_answer_never_arrives_ends_succeeded_with_one_charge(pool: PgPool) {
    let actors = a_charge_whose_answer_never_arrives_ends_succeeded_with_one_charge(pool, true).await;
    // Settled by the webhook itself, or by the poller: from the webhook recorded while the worker
    // still waited, or from the provider's answer if it asked first.
    assert!(["webhook", "reconciler:poller"].contains(&actors[3].as_str()), "{actors:?}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn without_webhooks_the_poller_alone_settles_it(pool: PgPool) {
    let actors = a_charge_whose_answer_never_arrives_ends_succeeded_with_one_charge(pool, false).await;
    assert_eq!(actors[3], "reconciler:poller");
}
