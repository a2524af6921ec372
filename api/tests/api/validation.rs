//! 400, 413 and 415: requests refused before anything is written, each with a problem saying why.

use futures::stream;
use reqwest::StatusCode;
use reqwest::header::HeaderValue;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use oncepay_api::provider_intake::StripeIntakeSettings;
use oncepay_provider::stripe::StripeMode;

use crate::helpers::{Rows, TestApp, assert_problem, body};

const NOTHING: Rows = Rows { payments: 0, keys: 0, outbox: 0, events: 0 };

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_without_an_idempotency_key_is_refused(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;

    let response = app
        .request(reqwest::Method::POST, "/v1/payments")
        .bearer_auth(&app.tenant.token)
        .json(&body())
        .send()
        .await
        .unwrap();

    assert_problem(response, StatusCode::BAD_REQUEST, "missing-idempotency-key").await;
    assert_eq!(app.rows().await, NOTHING);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn malformed_idempotency_keys_are_refused(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let too_long = "k".repeat(256);
    let malformed: [&[u8]; 7] =
        [b"", b"a b", b"\"unterminated", b"\"a\" trailing", b"\"a\\nb\"", too_long.as_bytes(), b"caf\xc3\xa9"];

    for raw in malformed {
        let response = app
            .request(reqwest::Method::POST, "/v1/payments")
            .bearer_auth(&app.tenant.token)
            .header("Idempotency-Key", HeaderValue::from_bytes(raw).unwrap())
            .json(&body())
            .send()
            .await
            .unwrap();

        assert_problem(response, StatusCode::BAD_REQUEST, "invalid-idempotency-key").await;
    }
    assert_eq!(app.rows().await, NOTHING);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_idempotency_key_sent_twice_is_refused(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;

    let response = app.post_payment("k-1", &body()).header("Idempotency-Key", "k-1").send().await.unwrap();

    let (_, problem) = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-idempotency-key").await;
    assert!(problem["detail"].as_str().unwrap().contains("exactly once"), "{problem}");
    assert_eq!(app.rows().await, NOTHING);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_bare_and_quoted_forms_of_a_key_name_the_same_key(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;

    let bare = app.post_payment("order-42", &body()).send().await.unwrap();
    let quoted = app.post_payment("\"order-42\"", &body()).send().await.unwrap();

    assert_eq!(bare.status(), StatusCode::ACCEPTED);
    assert_eq!(quoted.status(), StatusCode::ACCEPTED);
    assert_eq!(quoted.headers().get("idempotent-replayed").unwrap(), "true");
    let bare: Value = bare.json().await.unwrap();
    let quoted: Value = quoted.json().await.unwrap();
    assert_eq!(bare["id"], quoted["id"]);
    assert_eq!(app.rows().await.payments, 1);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_body_that_is_not_json_is_refused(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;

    for text in ["", "{", r#"{"amount": 1,}"#, "[1, 2", r#"{"amount": 1} trailing"#] {
        let response = app.post_raw("k-1", Some("application/json"), text).send().await.unwrap();

        let (_, problem) = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
        assert!(problem["detail"].as_str().unwrap().contains("not valid JSON"), "{text:?}: {problem}");
    }
    assert_eq!(app.rows().await, NOTHING);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn every_invalid_field_is_named(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let cases = [
        (json!({}), vec!["amount", "currency", "customer_id"]),
        (json!({"amount": 0, "currency": "EUR", "customer_id": "c"}), vec!["amount"]),
        (json!({"amount": 1_000_000_000_001_i64, "currency": "EUR", "customer_id": "c"}), vec!["amount"]),
        (json!({"amount": 10.5, "currency": "EUR", "customer_id": "c"}), vec!["amount"]),
        (json!({"amount": "10", "currency": "EUR", "customer_id": "c"}), vec!["amount"]),
        (json!({"amount": 10, "currency": "eur", "customer_id": "c"}), vec!["currency"]),
        (json!({"amount": 10, "currency": "EUR", "customer_id": ""}), vec!["customer_id"]),
        (
            json!({"amount": 10, "currency": "EUR", "customer_id": "c", "description": "x".repeat(1001)}),
            vec!["description"],
        ),
        (json!({"amount": 10, "currency": "EUR", "customer_id": "c", "metadata": {"k": 1}}), vec!["metadata.k"]),
        (json!({"amount": -1, "currency": 7, "customer_id": ["c"]}), vec!["amount", "currency", "customer_id"]),
        (json!([1, 2]), vec!["(body)"]),
        // PostgreSQL cannot store U+0000 in text or jsonb: refused here, never a failed write (500).
        (json!({"amount": 10, "currency": "EUR", "customer_id": "c\u{0}"}), vec!["customer_id"]),
        (json!({"amount": 10, "currency": "EUR", "customer_id": "c", "description": "\u{0}"}), vec!["description"]),
        (json!({"amount": 10, "currency": "EUR", "customer_id": "c", "metadata": {"k": "v\u{0}"}}), vec!["metadata.k"]),
        (json!({"amount": 10, "currency": "EUR", "customer_id": "c", "payment_method": ""}), vec!["payment_method"]),
        (
            json!({"amount": 10, "currency": "EUR", "customer_id": "c", "payment_method": "pm-card"}),
            vec!["payment_method"],
        ),
        (
            json!({"amount": 10, "currency": "EUR", "customer_id": "c", "payment_method": "p".repeat(256)}),
            vec!["payment_method"],
        ),
        (json!({"amount": 10, "currency": "EUR", "customer_id": "c", "payment_method": 4242}), vec!["payment_method"]),
    ];

    for (request, expected) in cases {
        let response = app.post_payment("k-1", &request).send().await.unwrap();

        let (_, problem) = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
        let mut named: Vec<&str> =
            problem["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
        named.sort_unstable();
        assert_eq!(named, expected, "{request}");
        assert!(problem["errors"].as_array().unwrap().iter().all(|e| e["message"].is_string()));
    }
    assert_eq!(app.rows().await, NOTHING);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn what_stripe_could_never_charge_is_refused_by_name_when_the_workers_charge_through_stripe(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn_with(options, |settings| {
        settings.provider.kind = oncepay_provider::ProviderKind::Stripe;
        settings.provider.stripe = Some(StripeIntakeSettings { mode: StripeMode::Direct });
        settings.provider.stripe_settlement_currency = Some("EUR".into());
    })
    .await;
    let metadata: serde_json::Map<String, Value> = (0..49).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases = [
        (json!({"amount": 10, "currency": "EUR", "customer_id": "c"}), "amount"),
        (json!({"amount": 1999, "currency": "EUR", "customer_id": "c", "metadata": metadata}), "metadata"),
    ];

    for (request, field) in cases {
        let response = app.post_payment("k-1", &request).send().await.unwrap();

        let (_, problem) = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
        assert_eq!(problem["errors"][0]["field"], field, "{request}");
    }
    assert_eq!(app.rows().await, NOTHING);
    let accepted = app.post_payment("k-2", &body()).send().await.unwrap();
    assert_eq!(accepted.status(), StatusCode::ACCEPTED, "an ordinary payment is still accepted");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_unknown_field_is_refused_by_name(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let mut request = body();
    request["amout"] = json!(10);

    let response = app.post_payment("k-1", &request).send().await.unwrap();

    let (_, problem) = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
    assert_eq!(problem["errors"], json!([{"field": "amout", "message": "is not a known field"}]));
    assert_eq!(app.rows().await, NOTHING);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_member_named_twice_at_any_depth_is_refused_by_name_and_nothing_is_written(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    // A proxy or a log that keeps the first of repeated members would see another payment than
    // the one charged, whichever oncepay kept.
    let cases = [
        (r#"{"amount":100,"amount":5000,"currency":"EUR","customer_id":"cus_42"}"#, "amount"),
        (r#"{"amount":100,"currency":"EUR","customer_id":"cus_42","amount":100}"#, "amount"),
        (
            r#"{"amount":100,"currency":"EUR","customer_id":"cus_42","metadata":{"order":"1","order":"2"}}"#,
            "metadata.order",
        ),
        (r#"{"amount":100,"currency":"EUR","customer_id":"cus_42","extra":[{"a":1,"a":1}]}"#, "extra[0].a"),
    ];

    for (text, field) in cases {
        let response = app.post_raw("k-1", Some("application/json"), text).send().await.unwrap();

        let (_, problem) = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
        assert_eq!(problem["errors"].as_array().map(Vec::len), Some(1), "{text}: {problem}");
        assert_eq!(problem["errors"][0]["field"], field, "{text}: {problem}");
        assert!(problem["errors"][0]["message"].as_str().unwrap().contains("more than once"), "{problem}");
    }
    assert_eq!(app.rows().await, NOTHING);
    // The key was not taken: a valid body with it is a new payment, not a replay or a 422.
    let accepted = app.post_payment("k-1", &body()).send().await.unwrap();
    assert_eq!(accepted.status(), StatusCode::ACCEPTED);
    assert!(accepted.headers().get("idempotent-replayed").is_none());
    let payment: Value = accepted.json().await.unwrap();
    assert_eq!(payment["amount"], body()["amount"]);
    assert_eq!(app.rows().await.payments, 1);
    app.stop().await;
}

/// A valid request whose body is `size` bytes, padded with white space.
fn padded_body(size: usize) -> String {
    let json = body().to_string();
    format!("{json}{}", " ".repeat(size - json.len()))
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_body_over_64_kib_is_refused_and_one_of_exactly_64_kib_is_accepted(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let send = |key: &'static str, text: String| app.post_raw(key, Some("application/json"), text).send();

    let too_large = send("k-1", padded_body(65_537)).await.unwrap();
    let at_limit = send("k-2", padded_body(65_536)).await.unwrap();

    assert_problem(too_large, StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large").await;
    assert_eq!(at_limit.status(), StatusCode::ACCEPTED);
    assert_eq!(app.rows().await.payments, 1);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_streamed_body_without_a_length_is_cut_off_at_64_kib(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        padded_body(80_000).into_bytes().chunks(8192).map(|chunk| Ok(chunk.to_vec())).collect();

    let response = app
        .post_raw("k-1", Some("application/json"), reqwest::Body::wrap_stream(stream::iter(chunks)))
        .send()
        .await
        .unwrap();

    assert_problem(response, StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large").await;
    assert_eq!(app.rows().await, NOTHING);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_body_that_is_not_declared_as_json_is_refused(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let text = body().to_string();

    let plain = app.post_raw("k-1", Some("text/plain"), text.clone()).send().await.unwrap();
    let undeclared = app.post_raw("k-1", None, text).send().await.unwrap();

    assert_problem(plain, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type").await;
    assert_problem(undeclared, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type").await;
    assert_eq!(app.rows().await, NOTHING);
    app.stop().await;
}
