//! `GET /v1/payments/{id}`, plain and as a long poll.

use std::time::{Duration, Instant};

use oncepay_api::rereads::Rereads;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{Tenant, TestApp, assert_problem, body, claim, create_tenant, header, settle_succeeded};

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
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

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
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

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn unknown_and_malformed_payment_ids_are_not_found(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;

    for id in [uuid::Uuid::now_v7().to_string(), "not-a-uuid".into(), "1".into()] {
        let response = app.get_payment(&id).send().await.unwrap();

        assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    }
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
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

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
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

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_long_poll_longer_than_the_maximum_is_capped(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn_with(options, |settings| settings.long_poll.max_wait_secs = 1).await;
    let payment_id = TestApp::payment_id(app.post_payment("order-1", &body()).send().await.unwrap()).await;

    let response = app.get_payment(&payment_id.to_string()).header("Prefer", "wait=600").send().await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(response.headers(), "preference-applied"), Some("wait=1"));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
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

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
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

/// A status read as a long poll of `wait=20` by `tenant`, spawned.
fn long_poll(
    app: &TestApp,
    tenant: &Tenant,
    payment_id: &str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    tokio::spawn(app.get_payment_as(tenant, payment_id).header("Prefer", "wait=20").send())
}

/// Asserts that `response` is the payment as it stands, answered without honouring the wait.
async fn answered_at_once(response: reqwest::Response) {
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(response.headers(), "preference-applied"), None, "the wait was honoured");
    let served: Value = response.json().await.unwrap();
    assert_eq!(served["status"], "pending");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn long_polls_beyond_a_tenants_bound_are_answered_at_once_while_other_tenants_still_wait(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn_with(options, |settings| settings.long_poll.max_waiting_per_tenant = 1).await;
    let other = create_tenant(&app.db, "globex", None).await;
    let mine = [
        TestApp::payment_id(app.post_payment("order-1", &body()).send().await.unwrap()).await,
        TestApp::payment_id(app.post_payment("order-2", &body()).send().await.unwrap()).await,
    ];
    let theirs = TestApp::payment_id(app.post_payment_as(&other, "order-1", &body()).send().await.unwrap()).await;
    let waiting = long_poll(&app, &app.tenant, &mine[0].to_string());
    app.until_long_polls_waiting(1).await;

    let excess = long_poll(&app, &app.tenant, &mine[1].to_string()).await.unwrap().unwrap();
    let other_tenant = long_poll(&app, &other, &theirs.to_string());
    app.until_long_polls_waiting(2).await;

    answered_at_once(excess).await;
    for (tenant_id, payment_id, poll) in [(app.tenant.id, mine[0], waiting), (other.id, theirs, other_tenant)] {
        claim(&app.db, tenant_id, payment_id).await;
        let response = poll.await.unwrap().unwrap();
        assert_eq!(header(response.headers(), "preference-applied"), Some("wait=20"));
    }
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn long_polls_beyond_the_process_bound_are_answered_at_once(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn_with(options, |settings| settings.long_poll.max_waiting = 1).await;
    let other = create_tenant(&app.db, "globex", None).await;
    let mine = TestApp::payment_id(app.post_payment("order-1", &body()).send().await.unwrap()).await;
    let theirs = TestApp::payment_id(app.post_payment_as(&other, "order-1", &body()).send().await.unwrap()).await;
    let waiting = long_poll(&app, &app.tenant, &mine.to_string());
    app.until_long_polls_waiting(1).await;

    let excess = long_poll(&app, &other, &theirs.to_string()).await.unwrap().unwrap();

    answered_at_once(excess).await;
    claim(&app.db, app.tenant.id, mine).await;
    let response = waiting.await.unwrap().unwrap();
    assert_eq!(header(response.headers(), "preference-applied"), Some("wait=20"));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn re_reads_queued_together_are_read_in_one_statement_per_tenant(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let other = create_tenant(&app.db, "globex", None).await;
    let mut mine = Vec::new();
    for key in ["order-1", "order-2", "order-3"] {
        mine.push(TestApp::payment_id(app.post_payment(key, &body()).send().await.unwrap()).await);
    }
    let theirs = TestApp::payment_id(app.post_payment_as(&other, "order-1", &body()).send().await.unwrap()).await;
    let (rereads, mut rereader) = Rereads::new(app.db.clone(), 100);
    let wanted = [(app.tenant.id, mine[0]), (app.tenant.id, mine[0]), (app.tenant.id, mine[1])].into_iter().chain([
        (app.tenant.id, mine[2]),
        (other.id, theirs),
        (other.id, theirs),
    ]);
    let reads: Vec<_> = wanted
        .map(|(tenant_id, payment_id)| {
            let rereads = rereads.clone();
            (payment_id, tokio::spawn(async move { rereads.read(tenant_id, payment_id).await }))
        })
        .collect();
    while rereads.queued() < reads.len() {
        tokio::task::yield_now().await;
    }

    let statements = rereader.run_once().await;

    assert_eq!(statements, Some(2), "one statement per tenant");
    for (payment_id, read) in reads {
        let payment = read.await.unwrap().expect("every queued re-read is answered");
        assert_eq!(payment.payment_id, payment_id);
    }
    app.stop().await;
}
