//! The worker process as `main` runs it, in-process: built from its settings, serving `/healthz`,
//! `/readyz` and `/metrics` on its ops port, draining into the provider, stopping on shutdown.

// Helpers outside `#[test]` functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use oncepay_domain::status::PaymentStatus;
use oncepay_service::config;
use oncepay_worker::app::App;
use oncepay_worker::settings::{DEFAULTS, Settings};
use sqlx::PgPool;
use support::{Charges, accept, tenant};
use tokio_util::sync::CancellationToken;
use wiremock::MockServer;

/// The defaults, pointed at this test's database and provider, on a free port.
async fn settings(pool: &PgPool, provider_url: &str) -> Settings {
    let mut settings: Settings = config::load(DEFAULTS, None).unwrap();
    let database: String = sqlx::query_scalar("SELECT current_database()").fetch_one(pool).await.unwrap();
    let server_url = std::env::var("DATABASE_URL").unwrap();
    let (server, _) = server_url.rsplit_once('/').unwrap();
    settings.database.url = format!("{server}/{database}").into();
    settings.http.port = 0;
    settings.provider.base_url = provider_url.to_owned();
    settings.worker.poll_interval_ms = 50;
    settings.validate().unwrap();
    settings
}

async fn get(port: u16, path: &str) -> (u16, String) {
    let response = reqwest::get(format!("http://127.0.0.1:{port}{path}")).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_worker_serves_its_ops_endpoints_and_drains_until_shutdown(pool: PgPool) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let app = App::build(&settings(&pool, &server.uri()).await).await.unwrap();
    let port = app.port().unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(app.run(shutdown.clone()));

    let accepted = accept(&pool, tenant(&pool).await, 1234).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while support::status(&pool, accepted).await != PaymentStatus::Succeeded {
        assert!(tokio::time::Instant::now() < deadline, "the payment was not drained");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    assert_eq!(get(port, "/healthz").await.0, 200);
    assert_eq!(get(port, "/readyz").await.0, 200);
    let (status, metrics) = get(port, "/metrics").await;
    assert_eq!(status, 200);
    for expected in [
        "oncepay_worker_claims_total 1",
        "oncepay_worker_provider_outcomes_total{class=\"charged\"} 1",
        "oncepay_worker_drain_latency_seconds_count 1",
        "oncepay_worker_provider_call_duration_seconds_count 1",
    ] {
        assert!(metrics.contains(expected), "{expected} missing from\n{metrics}");
    }

    shutdown.cancel();
    let counts = running.await.unwrap().unwrap();

    assert_eq!(counts.succeeded, 1);
}
