//! The operations endpoints, the OpenAPI document, errors actix raises itself, and the rate limit.

use oncepay_api::Application;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{self, TestApp, assert_problem, body, create_tenant, header};

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_openapi_document_is_generated_json_describing_both_endpoints(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;

    let response = app.request(Method::GET, "/openapi.json").send().await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    let document: Value = response.json().await.unwrap();
    assert!(document["openapi"].as_str().unwrap().starts_with("3."));
    assert!(document["paths"]["/v1/payments"]["post"]["responses"]["202"].is_object());
    assert!(document["paths"]["/v1/payments/{id}"]["get"]["responses"]["200"].is_object());
    assert!(document["components"]["schemas"]["PaymentResource"].is_object());
    assert!(document["components"]["schemas"]["Problem"].is_object());
    assert_eq!(document["components"]["securitySchemes"]["api_key"]["scheme"], "bearer");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_unknown_route_is_a_not_found_problem(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;

    for (method, path) in [(Method::GET, "/"), (Method::GET, "/v2/payments"), (Method::POST, "/v1/refunds")] {
        let response = app.request(method, path).send().await.unwrap();

        assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    }
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_wrong_method_is_a_method_not_allowed_problem(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let payment = format!("/v1/payments/{}", uuid::Uuid::now_v7());
    let cases = [
        (Method::GET, "/v1/payments", "POST"),
        (Method::DELETE, "/v1/payments", "POST"),
        (Method::PUT, payment.as_str(), "GET"),
        (Method::POST, "/openapi.json", "GET"),
        (Method::POST, "/healthz", "GET"),
        (Method::DELETE, "/metrics", "GET"),
    ];

    for (method, path, allow) in cases {
        let response = app.request(method.clone(), path).send().await.unwrap();

        let (headers, _) = assert_problem(response, StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed").await;
        assert_eq!(header(&headers, "allow"), Some(allow), "{method} {path}");
    }
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_api_is_healthy_and_ready_when_the_schema_is_current(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;

    let healthz = app.request(Method::GET, "/healthz").send().await.unwrap();
    let readyz = app.request(Method::GET, "/readyz").send().await.unwrap();

    assert_eq!(healthz.status(), StatusCode::OK);
    assert_eq!(readyz.status(), StatusCode::OK);
    app.stop().await;
}

#[sqlx::test(migrations = false)]
async fn the_api_is_not_ready_when_migrations_have_not_been_applied(_: PgPoolOptions, options: PgConnectOptions) {
    oncepay_service::tls::install_provider();
    let application = Application::build_with(helpers::settings(), options).unwrap();
    let address = format!("http://127.0.0.1:{}", application.port());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(application.run_until_stopped(shutdown.clone()));
    let client = reqwest::Client::new();

    let healthz = client.get(format!("{address}/healthz")).send().await.unwrap();
    let readyz = client.get(format!("{address}/readyz")).send().await.unwrap();

    assert_eq!(healthz.status(), StatusCode::OK);
    let (headers, _) = assert_problem(readyz, StatusCode::SERVICE_UNAVAILABLE, "service-unavailable").await;
    assert!(headers.get("retry-after").is_some());
    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_tenant_over_its_rate_limit_is_told_when_to_retry(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let slow = create_tenant(&app.db, "slow", Some(1)).await;

    let first = app.post_payment_as(&slow, "order-1", &body()).send().await.unwrap();
    let second = app.post_payment_as(&slow, "order-2", &body()).send().await.unwrap();
    let other_tenant = app.post_payment("order-2", &body()).send().await.unwrap();

    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let (headers, _) = assert_problem(second, StatusCode::TOO_MANY_REQUESTS, "rate-limited").await;
    let retry_after: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    assert_eq!(other_tenant.status(), StatusCode::ACCEPTED, "another tenant's bucket is its own");
    assert_eq!(app.rows().await.payments, 2);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn intake_outcomes_and_request_latency_are_exported_as_metrics(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    app.post_payment("order-1", &body()).send().await.unwrap();
    app.post_payment("order-1", &body()).send().await.unwrap();
    app.request(Method::POST, "/v1/payments").json(&body()).send().await.unwrap();

    let metrics = app.metrics().await;

    for line in [
        r#"oncepay_api_intake_total{outcome="created"} 1"#,
        r#"oncepay_api_intake_total{outcome="replayed"} 1"#,
        r#"oncepay_api_intake_total{outcome="unauthorized"} 1"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} missing from\n{metrics}");
    }
    assert!(
        metrics.lines().any(|l| l.starts_with("oncepay_api_request_duration_seconds_count")
            && l.contains(r#"route="/v1/payments""#)
            && l.contains(r#"method="POST""#)),
        "{metrics}"
    );
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn with_an_operations_port_the_operations_endpoints_are_served_there_and_only_there(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    let mut settings = helpers::settings();
    settings.http.listen.ops_port = Some(0);
    let application = Application::build_with(settings, helpers::as_api(options.clone())).unwrap();
    let ops = format!("http://127.0.0.1:{}", application.ops_port().expect("an operations port was asked for"));
    let app = TestApp::start(application, pool_options.connect_with(options).await.unwrap()).await;
    let client = reqwest::Client::new();
    let status = |url: String| {
        let client = client.clone();
        async move { client.get(url).send().await.unwrap().status() }
    };

    let on_ops = [status(format!("{ops}/metrics")).await, status(format!("{ops}/readyz")).await];
    let on_public =
        [status(format!("{}/metrics", app.address)).await, status(format!("{}/healthz", app.address)).await];
    let api_on_ops = status(format!("{ops}/openapi.json")).await;
    let payment = app.post_payment("order-1", &body()).send().await.unwrap().status();

    assert_eq!(on_ops, [StatusCode::OK, StatusCode::OK]);
    assert_eq!(on_public, [StatusCode::NOT_FOUND, StatusCode::NOT_FOUND]);
    assert_eq!((api_on_ops, payment), (StatusCode::NOT_FOUND, StatusCode::ACCEPTED));
    app.stop().await;
}
