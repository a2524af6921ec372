//! The reconciler as a service: the real binary answers the operations endpoints, settles an
//! `unknown` payment from a signed webhook and another by polling a (wiremock) provider, and exits 0
//! on SIGTERM; the real application, built in the test, serves each of its listeners on port 0.

use std::time::Duration;

use oncepay_devkit::ports;
use oncepay_devkit::process::{Child, Spec};
use oncepay_domain::status::PaymentStatus;
use oncepay_ops::operators::accounts;
use oncepay_provider::ChargeStatus;
use oncepay_provider::wire::{EventType, WebhookEvent};
use oncepay_reconciler::settings::Settings;
use oncepay_reconciler::startup::Application;
use oncepay_store::fixtures::tenant;
use oncepay_webhook_signature::WebhookSecret;
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, charge, reaches, unknown_payment};

const WAIT: Duration = Duration::from_secs(20);

/// The webhook signing secret the service is given.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_service_settles_by_webhook_and_by_polling_and_stops_cleanly_on_sigterm(pool: PgPool) {
    oncepay_service::tls::install_provider();
    let tenant_id = tenant(&pool, "acme").await;
    let by_webhook = unknown_payment(&pool, tenant_id, "order-1", 100, 60).await;
    let provider = MockServer::start().await;
    // The webhook's payment is not at the provider yet (as far as a lookup can tell); the other one is.
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(query_param("idempotency_key", by_webhook.downstream_key().as_str()))
        .respond_with(ResponseTemplate::new(503))
        .mount(&provider)
        .await;
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen("oncepay_payment").await.unwrap();
    let port = ports::reserve().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let spec = Spec::new("reconciler", env!("CARGO_BIN_EXE_oncepay-reconciler"), logs.path())
        .env("DATABASE_URL", support::reconciler_url_of(&pool))
        .port(port)
        .setting("provider.base_url", provider.uri())
        .setting("poller.interval_ms", "50")
        .setting_list("webhooks.secrets", &[SECRET]);
    let mut reconciler = Child::spawn(spec).await.unwrap();
    let base = format!("http://127.0.0.1:{port}");
    reconciler.wait_until_ready(&format!("{base}/readyz"), Duration::from_secs(20)).await.unwrap();

    // A webhook signed with the configured secret.
    let secret = WebhookSecret::parse(SECRET).unwrap();
    let data = charge(tenant_id, by_webhook, "ch_1", ChargeStatus::Succeeded, 100);
    let body =
        serde_json::to_vec(&WebhookEvent { event_type: EventType::ChargeSucceeded, created: data.created, data })
            .unwrap();
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let answer = reqwest::Client::new()
        .post(format!("{base}/webhooks/provider"))
        .header("webhook-id", "msg_1")
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", secret.sign("msg_1", now, &body))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    assert!(reaches(&mut listener, &pool, tenant_id, by_webhook, PaymentStatus::Succeeded, WAIT).await);

    // A payment that becomes unknown while the service runs is found by the poller.
    let by_polling = unknown_payment(&pool, tenant_id, "order-2", 200, 60).await;
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(query_param("idempotency_key", by_polling.downstream_key().as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"data": [charge(tenant_id, by_polling, "ch_2", ChargeStatus::Failed, 200)], "has_more": false}),
        ))
        .mount(&provider)
        .await;
    assert!(reaches(&mut listener, &pool, tenant_id, by_polling, PaymentStatus::Failed, WAIT).await);

    let metrics = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"oncepay_reconciler_webhooks_total{verdict="applied"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"oncepay_reconciler_unknown_resolved_total{how="poll_declined"} 1"#), "{metrics}");

    let exit = reconciler.terminate(Duration::from_secs(15)).await.unwrap();
    assert!(exit.success(), "{exit:?}\n{}", reconciler.log().await.unwrap());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_service_refuses_to_start_without_a_configured_webhook_secret(pool: PgPool) {
    let logs = tempfile::tempdir().unwrap();
    let spec = Spec::new("reconciler", env!("CARGO_BIN_EXE_oncepay-reconciler"), logs.path())
        .env("DATABASE_URL", support::reconciler_url_of(&pool))
        .port(ports::reserve().unwrap());
    let mut reconciler = Child::spawn(spec).await.unwrap();

    let status = reconciler.exited(WAIT).await.expect("the reconciler should refuse to start, not serve");

    assert_eq!(status.code(), Some(78), "EX_CONFIG");
    let log = std::fs::read_to_string(logs.path().join("reconciler.log")).unwrap();
    assert!(log.contains("webhooks.secrets"), "{log}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn with_an_operations_port_the_operations_endpoints_are_served_there_and_only_there(pool: PgPool) {
    let (port, ops_port) = (ports::reserve().unwrap(), ports::reserve().unwrap());
    let logs = tempfile::tempdir().unwrap();
    let spec = Spec::new("reconciler", env!("CARGO_BIN_EXE_oncepay-reconciler"), logs.path())
        .env("DATABASE_URL", support::reconciler_url_of(&pool))
        .port(port)
        .setting("http.ops_port", ops_port.to_string())
        .setting_list("webhooks.secrets", &[SECRET]);
    let mut reconciler = Child::spawn(spec).await.unwrap();
    let (public, ops) = (format!("http://127.0.0.1:{port}"), format!("http://127.0.0.1:{ops_port}"));
    reconciler.wait_until_ready(&format!("{ops}/readyz"), WAIT).await.unwrap();
    let client = reqwest::Client::new();
    let status = |url: String| {
        let client = client.clone();
        async move { client.get(url).send().await.unwrap().status().as_u16() }
    };

    let on_ops = [status(format!("{ops}/metrics")).await, status(format!("{ops}/healthz")).await];
    let on_public = [status(format!("{public}/metrics")).await, status(format!("{public}/readyz")).await];
    let webhooks_on_ops = status(format!("{ops}/webhooks/provider")).await;
    let webhooks_on_public = status(format!("{public}/webhooks/provider")).await;

    assert_eq!(on_ops, [200, 200]);
    assert_eq!(on_public, [404, 404]);
    assert_eq!((webhooks_on_ops, webhooks_on_public), (404, 405), "webhooks stay on the public port");
    reconciler.terminate(WAIT).await.unwrap();
}

/// The real application, on port 0 in this process: each listener answers what it serves, an
/// operator's queued reconciliation run is run by the application's own loop, and it stops when
/// told.
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_application_binds_every_listener_on_port_0_runs_a_queued_run_and_stops_when_told(pool: PgPool) {
    oncepay_service::tls::install_provider();
    let provider = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [], "has_more": false})))
        .mount(&provider)
        .await;
    let mut settings = Settings::load(None).unwrap();
    settings.database.url = support::reconciler_url_of(&pool).into();
    (settings.http.port, settings.http.ops_port, settings.operators.port) = (0, Some(0), Some(0));
    settings.webhooks.secrets = vec![SECRET.into()];
    settings.provider.base_url = provider.uri();
    settings.recon.queue_interval_ms = 50;
    let mut conn = pool.acquire().await.unwrap();
    let admin = accounts::bootstrap(&mut conn, "root", Duration::from_secs(3600)).await.unwrap().token;

    let application = Application::build(settings).unwrap();
    let (public, probes) = (application.port(), application.probe_port().unwrap());
    let operator = application.operator_port().unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(application.run_until_stopped(shutdown.clone()));
    let http = reqwest::Client::new();
    let status = |url: String| {
        let http = http.clone();
        async move { http.get(url).send().await.unwrap().status().as_u16() }
    };
    let ready = status(format!("http://127.0.0.1:{probes}/readyz")).await;
    let webhooks = status(format!("http://127.0.0.1:{public}/webhooks/provider")).await;
    let sign_in_page = status(format!("http://127.0.0.1:{operator}/console/sign-in")).await;
    let queued: serde_json::Value = http
        .post(format!("http://127.0.0.1:{operator}/v1/recon/runs"))
        .bearer_auth(&admin)
        .json(&json!({"from": "2026-01-10", "to": "2026-01-11", "reason": "month end"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_url = format!("http://127.0.0.1:{operator}/v1/recon/runs/{}", queued["run_id"].as_str().unwrap());
    let mut run = serde_json::Value::Null;
    for _ in 0..200 {
        run = http.get(&run_url).bearer_auth(&admin).send().await.unwrap().json().await.unwrap();
        if run["run"]["status"] == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let stopped = tokio::time::timeout(WAIT, running).await;

    assert_eq!((ready, webhooks, sign_in_page), (200, 405, 200));
    assert_eq!(queued["status"], "queued", "{queued}");
    assert_eq!(run["run"]["status"], "completed", "{run}");
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
}
