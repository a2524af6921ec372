//! The reaper across processes: with short retentions, the real reconciler deletes the idempotency
//! keys of settled payments and the webhook ids it has seen, and nothing else. Runs on one
//! PostgreSQL, and on Citus under `cargo xtask test --citus`, where each delete must stay on its
//! tenant's shard.

use std::time::Duration;

use oncepay_devkit::pg::Durability;
use oncepay_tests::system::{Binaries, Provider, Role, System, SystemConfig, Timing, Topology};
use serde_json::json;

const PAYMENTS_PER_TENANT: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_deletes_expired_keys_and_old_webhook_ids_of_every_tenant_and_keeps_the_payments() {
    let mut system = System::start(SystemConfig {
        binaries: Binaries::built().unwrap(),
        topology: Topology { apis: 1, workers: 1, reconcilers: 1 },
        tenants: vec!["acme".into(), "globex".into()],
        durability: Durability::Fast,
        timing: Timing::default(),
        provider: Provider::Simulator { seed: 0x5EA9 },
        log_dir: None,
    })
    .await
    .unwrap();
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    };
    system.restart(Role::Api, 0, &env(&[("ONCEPAY_INTAKE__KEY_RETENTION_SECS", "1")])).await.unwrap();
    let reaper = [("ONCEPAY_REAPER__INTERVAL_MS", "200"), ("ONCEPAY_REAPER__WEBHOOK_RETENTION_SECS", "1")];
    system.restart(Role::Reconciler, 0, &env(&reaper)).await.unwrap();

    let http = reqwest::Client::new();
    let api = system.api_urls()[0].clone();
    for tenant in system.tenants() {
        for i in 0..PAYMENTS_PER_TENANT {
            let response = http
                .post(format!("{api}/v1/payments"))
                .bearer_auth(&tenant.api_key)
                .header("Idempotency-Key", format!("reap-{i}"))
                .json(&json!({ "amount": 1000 + i, "currency": "EUR", "customer_id": "cus_reap" }))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 202, "{}", response.text().await.unwrap());
        }
    }
    let payments = PAYMENTS_PER_TENANT * system.tenants().len();

    let settled_payments = "SELECT count(*) FROM payments WHERE status IN ('succeeded', 'failed')";
    let settled = wait_for(system.pool(), settled_payments, |count| count == payments as i64).await.unwrap();
    let webhooks: i64 =
        sqlx::query_scalar("SELECT count(*) FROM webhook_events").fetch_one(system.pool()).await.unwrap();
    let keys_left = wait_for(system.pool(), "SELECT count(*) FROM idempotency_keys", |count| count == 0).await.unwrap();
    let webhooks_left =
        wait_for(system.pool(), "SELECT count(*) FROM webhook_events", |count| count == 0).await.unwrap();

    // The reaper did it, without a failed pass, and there were webhook ids to reap.
    let reconciler = system.url(Role::Reconciler, 0).unwrap();
    let metrics = http.get(format!("{reconciler}/metrics")).send().await.unwrap().text().await.unwrap();
    let reaped_keys = sum(&metrics, "oncepay_reconciler_reaped_keys_total");
    let webhooks_received = sum(&metrics, "oncepay_reconciler_webhooks_total");
    let reaper_errors = sum(&metrics, "oncepay_reconciler_loop_errors_total{loop=\"reaper\"");

    assert_eq!(settled, payments as i64);
    assert_eq!((keys_left, webhooks_left), (0, 0), "{webhooks} webhook ids were seen");
    assert_eq!(reaped_keys, payments as f64, "every key was deleted by the reaper\n{metrics}");
    assert!(webhooks_received > 0.0, "the provider's webhooks arrived, so there were webhook ids to reap");
    assert_eq!(reaper_errors, 0.0, "no reaper pass failed\n{metrics}");
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM payments").fetch_one(system.pool()).await.unwrap();
    assert_eq!(kept, payments as i64, "payments are never reaped");
    let ledger: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger_entries").fetch_one(system.pool()).await.unwrap();
    let succeeded: i64 = sqlx::query_scalar("SELECT count(*) FROM payments WHERE status = 'succeeded'")
        .fetch_one(system.pool())
        .await
        .unwrap();
    assert_eq!(ledger, succeeded, "the ledger is never reaped");
    if let Some(spanning) = system.two_phase_commits_since_start().await.unwrap() {
        assert_eq!(spanning, 0, "transactions that spanned nodes");
    }
    let unclean = system.shutdown().await.unwrap();
    assert!(unclean.is_empty(), "every process exits 0 on SIGTERM: {unclean:?}");
}

/// The sum of every sample in a Prometheus `text` whose line starts with `series` (a name, or a
/// name and the start of its labels).
fn sum(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs the count `query` until `done` says so, for at most 30 s; returns the last count read.
async fn wait_for(pool: &sqlx::PgPool, query: &'static str, done: impl Fn(i64) -> bool) -> Result<i64, sqlx::Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let count: i64 = sqlx::query_scalar(query).fetch_one(pool).await?;
        if done(count) || tokio::time::Instant::now() > deadline {
            return Ok(count);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
