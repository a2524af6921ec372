//! Requests racing each other: identical ones, and one tenant's requests written together.

use std::sync::Arc;
use std::time::Duration;

use oncepay_api::Settings;
use oncepay_devkit::wait::wait_until;
use oncepay_store::fixtures::Submission;
use oncepay_store::intake;
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Postgres, Transaction};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

use crate::helpers::{Rows, TestApp, assert_problem, body, header};

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn fifty_identical_requests_released_at_once_make_one_payment_and_all_get_its_id(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    const REQUESTS: usize = 50;
    let app = TestApp::spawn(options).await;
    let barrier = Arc::new(Barrier::new(REQUESTS));
    let racers: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let request = app.post_payment("order-1", &body());
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                let response = request.send().await.unwrap();
                let status = response.status();
                let replayed = response.headers().get("idempotent-replayed").is_some();
                let body: Value = response.json().await.unwrap();
                (status, replayed, body)
            })
        })
        .collect();

    let mut answers = Vec::with_capacity(REQUESTS);
    for racer in racers {
        answers.push(racer.await.unwrap());
    }

    assert!(answers.iter().all(|(status, _, _)| !status.is_server_error()), "{answers:?}");
    assert!(answers.iter().all(|(status, _, _)| *status == StatusCode::ACCEPTED), "{answers:?}");
    let ids: Vec<&Value> = answers.iter().map(|(_, _, body)| &body["id"]).collect();
    assert!(ids[0].is_string());
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(answers.iter().filter(|(_, replayed, _)| !replayed).count(), 1, "exactly one request created it");
    assert_eq!(app.rows().await, Rows { payments: 1, keys: 1, outbox: 1, events: 1 });
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn requests_arriving_while_their_tenants_write_is_under_way_are_written_together_each_with_its_own_response(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn_with(options, a_held_write_lasts).await;
    let other = json!({"amount": 5, "currency": "EUR", "customer_id": "cus_42"});
    let (holder, first) = write_held_by_another_transaction(&app, "order-0").await;
    // Eight new keys, then a retry of one of them and a misuse of another, queued after them.
    let mut waiting: Vec<_> =
        (1..=8).map(|i| tokio::spawn(app.post_payment(&format!("order-{i}"), &body()).send())).collect();
    app.until_gauge("oncepay_api_intake_writing", 1 + 8).await;
    waiting.push(tokio::spawn(app.post_payment("order-1", &body()).send()));
    waiting.push(tokio::spawn(app.post_payment("order-2", &other).send()));
    app.until_gauge("oncepay_api_intake_writing", 1 + 10).await;

    holder.rollback().await.unwrap();

    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::ACCEPTED);
    let mut responses = Vec::new();
    for response in waiting {
        responses.push(response.await.unwrap().unwrap());
    }
    let misuse = responses.pop().unwrap();
    let retry = responses.pop().unwrap();
    assert_problem(misuse, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    assert_eq!(header(retry.headers(), "idempotent-replayed"), Some("true"));
    let retried = TestApp::payment_id(retry).await;
    let mut ids = Vec::new();
    for response in responses {
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        assert_eq!(header(response.headers(), "idempotent-replayed"), None);
        ids.push(TestApp::payment_id(response).await);
    }
    assert_eq!(retried, ids[0], "the retry names the payment of the first request with its key");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 8, "one payment per new key");
    // now() is the transaction's start: the eight were written in one transaction.
    let starts: i64 = sqlx::query_scalar!(
        r#"SELECT count(DISTINCT p.created_at) AS "starts!" FROM payments p JOIN idempotency_keys k USING (tenant_id, payment_id)
         WHERE k.idempotency_key <> 'order-0'"#
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(starts, 1);
    assert_eq!(app.rows().await, Rows { payments: 9, keys: 9, outbox: 9, events: 9 });
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_stored_key_is_answered_while_its_tenants_write_is_under_way(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn_with(options, a_held_write_lasts).await;
    let stored = app.post_payment("order-1", &body()).send().await.unwrap();
    assert_eq!(stored.status(), StatusCode::ACCEPTED);
    let stored_id = TestApp::payment_id(stored).await;
    let (holder, first) = write_held_by_another_transaction(&app, "order-0").await;

    // Neither waits for the write under way: each is answered from the stored key. (The timeout only
    // turns a request stuck behind the held write into a failure instead of a hang.)
    let answered = tokio::time::timeout(Duration::from_secs(30), async {
        let retry = app.post_payment("order-1", &body()).send().await.unwrap();
        let other = json!({"amount": 5, "currency": "EUR", "customer_id": "cus_42"});
        let misuse = app.post_payment("order-1", &other).send().await.unwrap();
        (retry, misuse)
    })
    .await;

    let (retry, misuse) = answered.expect("a stored key waited for another key's write");
    assert!(!first.is_finished(), "the write it would have waited for is still under way");
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    assert_eq!(header(retry.headers(), "idempotent-replayed"), Some("true"));
    assert_eq!(TestApp::payment_id(retry).await, stored_id);
    assert_problem(misuse, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    holder.rollback().await.unwrap();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::ACCEPTED);
    assert_eq!(app.rows().await, Rows { payments: 2, keys: 2, outbox: 2, events: 2 });
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn with_every_connection_in_use_a_retry_waits_for_the_write_under_way_instead_of_failing(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn_with(options, |settings| {
        a_held_write_lasts(settings);
        settings.http.workers = 1;
        settings.database.max_connections = 1;
        settings.database.acquire_timeout_ms = 200;
    })
    .await;
    let stored = app.post_payment("order-1", &body()).send().await.unwrap();
    let stored_id = TestApp::payment_id(stored).await;
    // The write of `order-0` holds the one connection until the other transaction ends.
    let (holder, first) = write_held_by_another_transaction(&app, "order-0").await;

    let retry = tokio::spawn(app.post_payment("order-1", &body()).send());

    app.until_gauge("oncepay_api_intake_writing", 2).await;
    holder.rollback().await.unwrap();
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::ACCEPTED);
    let retry = retry.await.unwrap().unwrap();
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    assert_eq!(header(retry.headers(), "idempotent-replayed"), Some("true"));
    assert_eq!(TestApp::payment_id(retry).await, stored_id);
    app.stop().await;
}

/// Settings under which a write held by another transaction lasts until that transaction ends (well
/// past any test), and nothing but the end of the write under way starts the next one.
fn a_held_write_lasts(settings: &mut Settings) {
    settings.intake.group_max_wait_us = 60_000_000;
    settings.intake.key_lock_wait_ms = 60_000;
    settings.database.statement_timeout_ms = 60_000;
}

/// Another process's transaction, still open, that has written `key`; and the api's request with that
/// key, sent and seen waiting for the transaction's lock: a write of the tenant under way that ends
/// only when the transaction does.
async fn write_held_by_another_transaction(
    app: &TestApp,
    key: &str,
) -> (Transaction<'static, Postgres>, JoinHandle<reqwest::Result<Response>>) {
    let mut holder = app.db.begin().await.unwrap();
    let held = Submission::new(key, &body()).for_tenant(app.tenant.id, None);
    intake::accept(&mut holder, &held).await.unwrap();
    let request = tokio::spawn(app.post_payment(key, &body()).send());
    let holder_pid = sqlx::query_scalar!(r#"SELECT pg_backend_pid() AS "pid!""#).fetch_one(&mut *holder).await.unwrap();
    wait_until("the request to wait for the holder's lock", Duration::from_secs(10), || async {
        sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))) AS "blocked!""#,
            holder_pid
        )
        .fetch_one(&app.db)
        .await
        .unwrap()
        .then_some(())
    })
    .await
    .unwrap();
    (holder, request)
}
