//! Replays of final payments answered from memory (`replay_cache`): the same answer as the database
//! gives, for the same tenant and key only, never for a payment still in progress, and 422 for a
//! different request.
//!
//! Whether an answer came from memory is told by changing the stored row behind the api's back
//! (something nothing in oncepay does): an answer from memory still shows the original.

use oncepay_domain::ids::PaymentId;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{TestApp, assert_problem, body, create_tenant, header, settle_succeeded};

/// Accepts a payment under `key`, settles it and replays it once, as a client retrying after the
/// payment became final would: the api has now served its final answer. Returns the payment and that
/// first replay.
async fn replayed_once_final(app: &TestApp, key: &str) -> (PaymentId, reqwest::Response) {
    let first = app.post_payment(key, &body()).send().await.unwrap();
    let payment_id = TestApp::payment_id(first).await;
    settle_succeeded(&app.db, app.tenant.id, payment_id).await;
    let replayed = app.post_payment(key, &body()).send().await.unwrap();
    assert_eq!(replayed.status(), StatusCode::OK);
    (payment_id, replayed)
}

/// Overwrites the answer stored on every key of `db`.
async fn tamper_with_stored_answers(db: &PgPool) {
    sqlx::query!(r#"UPDATE idempotency_keys SET response_body = '{"tampered": true}' WHERE response_body IS NOT NULL"#)
        .execute(db)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn once_a_final_answer_has_been_replayed_the_next_replays_come_from_memory(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let (_, from_database) = replayed_once_final(&app, "order-1").await;
    let database_headers = from_database.headers().clone();
    let from_database: Value = from_database.json().await.unwrap();
    tamper_with_stored_answers(&app.db).await;

    let from_memory = app.post_payment("order-1", &body()).send().await.unwrap();

    assert_eq!(from_memory.status(), StatusCode::OK);
    let headers = from_memory.headers().clone();
    assert_eq!(header(&headers, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    assert_eq!(header(&headers, "idempotency-key-expires"), header(&database_headers, "idempotency-key-expires"));
    let from_memory: Value = from_memory.json().await.unwrap();
    assert_eq!(from_memory, from_database, "the original answer, not the tampered row");
    assert_eq!(from_memory["status"], "succeeded");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_different_request_under_a_remembered_key_is_refused_from_memory(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let (_, replayed) = replayed_once_final(&app, "order-1").await;
    let expires = replayed.headers().get("idempotency-key-expires").cloned();
    let mut other = body();
    other["amount"] = json!(2000);

    let reused = app.post_payment("order-1", &other).send().await.unwrap();

    let (headers, _) = assert_problem(reused, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    assert_eq!(headers.get("idempotency-key-expires"), expires.as_ref());
    let payments: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM payments"#).fetch_one(&app.db).await.unwrap();
    assert_eq!(payments, 1);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn another_tenant_using_the_same_key_never_gets_a_remembered_answer(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let other_tenant = create_tenant(&app.db, "other", None).await;
    let (payment_id, _) = replayed_once_final(&app, "shared-key").await;

    let others = app.post_payment_as(&other_tenant, "shared-key", &body()).send().await.unwrap();

    assert_eq!(others.status(), StatusCode::ACCEPTED, "a new payment of its own");
    assert_eq!(header(others.headers(), "idempotent-replayed"), None);
    let others: Value = others.json().await.unwrap();
    assert_ne!(others["id"], payment_id.to_string());
    assert_eq!(others["status"], "pending");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_still_in_progress_is_never_answered_from_memory(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let first = app.post_payment("order-1", &body()).send().await.unwrap();
    let payment_id = TestApp::payment_id(first).await;
    let in_progress = app.post_payment("order-1", &body()).send().await.unwrap();
    assert_eq!(in_progress.status(), StatusCode::ACCEPTED);

    settle_succeeded(&app.db, app.tenant.id, payment_id).await;
    let after = app.post_payment("order-1", &body()).send().await.unwrap();

    assert_eq!(after.status(), StatusCode::OK, "the final answer, not a remembered 202");
    let after: Value = after.json().await.unwrap();
    assert_eq!(after["status"], "succeeded");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn with_no_memory_for_answers_every_replay_reads_the_database(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn_with(options, |settings| settings.intake.replay_cache_bytes = 0).await;
    replayed_once_final(&app, "order-1").await;
    tamper_with_stored_answers(&app.db).await;

    let again = app.post_payment("order-1", &body()).send().await.unwrap();

    assert_eq!(again.status(), StatusCode::OK);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again, json!({"tampered": true}), "read from the database");
    app.stop().await;
}
