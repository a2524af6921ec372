//! The reaper across processes: with short retentions, the real reconciler deletes the idempotency
//! keys of settled payments and the webhook ids it has seen, and nothing else. Runs on one
//! PostgreSQL, and on Citus under `cargo xtask test --citus`, where each delete must stay on its
//! tenant's shard.

// Helpers outside `#[test]` functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use oncepay_devkit::pg::Durability;
use oncepay_devkit::process::setting_variable;
use oncepay_devkit::wait::wait_until;
use oncepay_tests::system::{Binaries, Provider, Role, System, SystemConfig, Timing, Topology};
use serde_json::json;
use sqlx::PgPool;

const PAYMENTS_PER_TENANT: usize = 6;
/// How long to wait for what the processes do on their own.
const PATIENCE: Duration = Duration::from_secs(30);

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
        env: Vec::new(),
        broker: false,
    })
    .await
    .unwrap();
    let env = |settings: &[(&str, &str)]| -> Vec<(String, String)> {
        settings.iter().map(|(key, value)| (setting_variable(key), (*value).to_owned())).collect()
    };
    system.restart(Role::Api, 0, &env(&[("intake.key_retention_secs", "1")])).await.unwrap();
    let reaper = [("reaper.interval_ms", "200"), ("reaper.webhook_retention_secs", "1")];
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

    let pool = system.pool();
    wait_until("every payment to settle", PATIENCE, || async {
        let settled =
            sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM payments WHERE status IN ('succeeded', 'failed')"#)
                .fetch_one(pool)
                .await
                .unwrap();
        (settled == payments as i64).then_some(())
    })
    .await
    .unwrap();
    let webhooks = webhook_ids(pool).await;
    wait_until("every key to be reaped", PATIENCE, || async { (keys(pool).await == 0).then_some(()) }).await.unwrap();
    wait_until("every webhook id to be reaped", PATIENCE, || async { (webhook_ids(pool).await == 0).then_some(()) })
        .await
        .unwrap_or_else(|timed_out| panic!("{timed_out}: {webhooks} webhook ids were seen"));

    // The reaper did it, without a failed pass, and there were webhook ids to reap.
    let reconciler = system.url(Role::Reconciler, 0).unwrap();
    let metrics = http.get(format!("{reconciler}/metrics")).send().await.unwrap().text().await.unwrap();
    let reaped_keys = sum(&metrics, "oncepay_reconciler_reaped_keys_total");
    let webhooks_received = sum(&metrics, "oncepay_reconciler_webhooks_total");
    let reaper_errors = sum(&metrics, "oncepay_reconciler_loop_errors_total{loop=\"reaper\"");

    assert_eq!(reaped_keys, payments as f64, "every key was deleted by the reaper\n{metrics}");
    assert!(webhooks_received > 0.0, "the provider's webhooks arrived, so there were webhook ids to reap");
    assert_eq!(reaper_errors, 0.0, "no reaper pass failed\n{metrics}");
    let kept = sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM payments"#).fetch_one(pool).await.unwrap();
    assert_eq!(kept, payments as i64, "payments are never reaped");
    let ledger =
        sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM ledger_entries"#).fetch_one(pool).await.unwrap();
    let succeeded = sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM payments WHERE status = 'succeeded'"#)
        .fetch_one(pool)
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

/// How many idempotency keys are stored.
async fn keys(pool: &PgPool) -> i64 {
    sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM idempotency_keys"#).fetch_one(pool).await.unwrap()
}

/// How many webhook ids are remembered.
async fn webhook_ids(pool: &PgPool) -> i64 {
    sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM webhook_events"#).fetch_one(pool).await.unwrap()
}
