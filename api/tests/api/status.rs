//! `GET /v1/payments/{id}`, plain and as a long poll.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{TestApp, assert_problem, body, claim, header, settle_succeeded};

#[sqlx::test(migrator = "oncepay_shared::db::MIGRATOR")]
async fn a_pending_payment_is_served_with_retry_after(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let created = app.post_payment("order-1", &body()).send().await.unwrap();
    let created: Value = created.json().await.unwrap();

    let response = app.get_payment(created["id"].as_str().unwrap()).send().await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(response.headers(), "retry-after"), Some("1"));
    assert_eq!(header(response.headers(), "preference-applied"), None);
    let served: Value = response.json().await.unwrap();
    assert_eq!(served, created);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_shared::db::MIGRATOR")]
async fn a_final_payment_is_served_without_retry_after(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let payment_id = TestApp::payment_id(app.post_payment("order-1", &body()).send().await.unwrap()).await;
    settle_succeeded(&app.db, app.tenant.id, payment_id).await;

    let response = app.get_payment(&payment_id.to_string()).send().await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(response.headers(), "retry-after"), None);
    let served: Value = response.json().await.unwrap();
    assert_eq!(served["status"], "succeeded");
    assert_eq!(served["provider_charge_id"], "ch_test_1");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_shared::db::MIGRATOR")]
async fn unknown_and_malformed_payment_ids_are_not_found(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;

    for id in [uuid::Uuid::now_v7().to_string(), "not-a-uuid".into(), "1".into()] {
        let response = app.get_payment(&id).send().await.unwrap();

        assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    }
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_shared::db::MIGRATOR")]
async fn a_long_poll_returns_as_soon_as_another_connection_changes_the_status(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let payment_id = TestApp::payment_id(app.post_payment("order-1", &body()).send().await.unwrap()).await;
    let started = Instant::now();
    let poll = tokio::spawn(app.get_payment(&payment_id.to_string()).header("Prefer", "wait=20").send());
    app.until_long_polls_waiting(1).await;

    claim(&app.db, app.tenant.id, payment_id).await;
    let response = poll.await.unwrap().unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(response.headers(), "preference-applied"), Some("wait=20"));
    let served: Value = response.json().await.unwrap();
    assert_eq!(served["status"], "processing");
    // A sanity bound, not a timing assertion: it was the change that ended the wait.
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_shared::db::MIGRATOR")]
async fn a_long_poll_returns_the_unchanged_payment_when_the_wait_is_over(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let payment_id = TestApp::payment_id(app.post_payment("order-1", &body()).send().await.unwrap()).await;

    let response = app.get_payment(&payment_id.to_string()).header("Prefer", "wait=1").send().await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(response.headers(), "preference-applied"), Some("wait=1"));
    assert_eq!(header(response.headers(), "retry-after"), Some("1"));
    let served: Value = response.json().await.unwrap();
    assert_eq!(served["status"], "pending");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_shared::db::MIGRATOR")]
async fn a_long_poll_longer_than_the_maximum_is_capped(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn_with(options, |settings| settings.long_poll.max_wait_secs = 1).await;
    let payment_id = TestApp::payment_id(app.post_payment("order-1", &body()).send().await.unwrap()).await;

    let response = app.get_payment(&payment_id.to_string()).header("Prefer", "wait=600").send().await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(response.headers(), "preference-applied"), Some("wait=1"));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_shared::db::MIGRATOR")]
async fn a_long_poll_on_a_final_payment_answers_without_waiting(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let payment_id = TestApp::payment_id(app.post_payment("order-1", &body()).send().await.unwrap()).await;
    settle_succeeded(&app.db, app.tenant.id, payment_id).await;
    let started = Instant::now();

    let response = app.get_payment(&payment_id.to_string()).header("Prefer", "wait=30").send().await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    let served: Value = response.json().await.unwrap();
    assert_eq!(served["status"], "succeeded");
    // A sanity bound: a final payment cannot change, so there is nothing to wait for.
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_shared::db::MIGRATOR")]
async fn a_long_poll_is_released_when_the_api_shuts_down(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let payment_id = TestApp::payment_id(app.post_payment("order-1", &body()).send().await.unwrap()).await;
    let poll = tokio::spawn(app.get_payment(&payment_id.to_string()).header("Prefer", "wait=30").send());
    app.until_long_polls_waiting(1).await;
    let started = Instant::now();

    app.stop().await;
    let response = poll.await.unwrap().unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    let served: Value = response.json().await.unwrap();
    assert_eq!(served["status"], "pending");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
}
