//! The worker process as `main` runs it, in-process: built from its settings, serving `/healthz`,
//! `/readyz` and `/metrics` on its ops port, draining both outboxes (payments and refunds) into the
//! provider, stopping on shutdown.

use std::time::Duration;

use oncepay_devkit::wait::wait_until;
use oncepay_domain::refund_status::RefundStatus;
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::wire::CreateRefund;
use oncepay_service::config;
use oncepay_store::refunds;
use oncepay_worker::app::App;
use oncepay_worker::settings::{DEFAULTS, Settings};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use crate::support::{self, Charges, accept, refund, tenant};

/// The defaults, pointed at this test's database and provider, on a free port.
async fn settings(pool: &PgPool, provider_url: &str) -> Settings {
    let mut settings: Settings = config::load(DEFAULTS, None).unwrap();
    settings.database.url = support::database_url(pool).await.into();
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
async fn the_worker_serves_its_ops_endpoints_and_drains_both_outboxes_until_shutdown(pool: PgPool) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let app = App::build(&settings(&pool, &server.uri()).await).await.unwrap();
    let port = app.port().unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(app.run(shutdown.clone()));

    let accepted = accept(&pool, tenant(&pool).await, 1234).await;
    wait_until("the payment to be drained", Duration::from_secs(30), || async {
        (support::status(&pool, accepted).await == PaymentStatus::Succeeded).then_some(())
    })
    .await
    .unwrap();
    // A provider that makes every refund it is asked for, as asked.
    Mock::given(method("POST"))
        .and(path("/v1/refunds"))
        .respond_with(|request: &Request| {
            let sent: CreateRefund = request.body_json().unwrap();
            ResponseTemplate::new(201).set_body_json(json!({
                "id": "re_1",
                "status": "succeeded",
                "charge": sent.charge,
                "amount": sent.amount,
                "currency": "EUR",
                "idempotency_key": request.headers["idempotency-key"].to_str().unwrap(),
                "created": 1_763_800_000,
                "metadata": {},
            }))
        })
        .mount(&server)
        .await;
    let asked = refund(&pool, accepted, 500).await;
    wait_until("the refund to be sent", Duration::from_secs(30), || async {
        let mut conn = pool.acquire().await.unwrap();
        let refund = refunds::find(&mut conn, asked.tenant_id, asked.refund_id).await.unwrap().unwrap();
        (refund.status == RefundStatus::Succeeded).then_some(())
    })
    .await
    .unwrap();

    assert_eq!(get(port, "/healthz").await.0, 200);
    assert_eq!(get(port, "/readyz").await.0, 200);
    let (status, metrics) = get(port, "/metrics").await;
    assert_eq!(status, 200);
    for expected in [
        "oncepay_worker_claims_total{kind=\"payment\"} 1",
        "oncepay_worker_provider_outcomes_total{kind=\"payment\",class=\"charged\"} 1",
        "oncepay_worker_drain_latency_seconds_count{kind=\"payment\"} 1",
        "oncepay_worker_provider_call_duration_seconds_count{kind=\"payment\"} 1",
        // A refund's send is counted beside the payments', under its own kind and outcome.
        "oncepay_worker_claims_total{kind=\"refund\"} 1",
        "oncepay_worker_provider_outcomes_total{kind=\"refund\",class=\"refunded\"} 1",
        "oncepay_worker_provider_outcomes_total{kind=\"refund\",class=\"uncertain\"} 0",
        "oncepay_worker_provider_call_duration_seconds_count{kind=\"refund\"} 1",
        "oncepay_worker_drain_latency_seconds_count{kind=\"refund\"} 1",
        "oncepay_worker_lease_lost_total{kind=\"refund\"} 0",
    ] {
        assert!(metrics.contains(expected), "{expected} missing from\n{metrics}");
    }

    shutdown.cancel();
    let counts = running.await.unwrap().unwrap();

    assert_eq!(counts.succeeded, 1);
}
