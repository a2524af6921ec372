//! Accepting a payment once, replaying it, and refusing misuse of a key.

use std::time::Duration;

use oncepay_api::resource_response;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::payment_request::PaymentRequest;
use oncepay_service::telemetry;
use oncepay_store::intake::{self, NewPayment};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{self, Rows, TestApp, assert_problem, body, create_tenant, header, settle_succeeded};

const ONE_PAYMENT: Rows = Rows { payments: 1, keys: 1, outbox: 1, events: 1 };

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_new_payment_is_accepted_with_its_location_retry_after_and_key_expiry(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;

    let response = app.post_payment("order-1", &body()).send().await.unwrap();

    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let headers = response.headers().clone();
    let resource: Value = response.json().await.unwrap();
    let id = resource["id"].as_str().unwrap();
    assert_eq!(header(&headers, "location"), Some(format!("/v1/payments/{id}").as_str()));
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    assert_eq!(header(&headers, "idempotent-replayed"), None);
    let key = sqlx::query!(
        "SELECT payment_id, expires_at, created_at FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2",
        app.tenant.id.as_uuid(),
        "order-1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(key.payment_id.to_string(), id);
    assert_eq!((key.expires_at - key.created_at).whole_seconds(), 86_400);
    let expected_expiry = resource_response::http_date(key.expires_at).unwrap();
    assert_eq!(header(&headers, "idempotency-key-expires"), expected_expiry.to_str().ok());
    assert_eq!(resource["status"], "pending");
    assert_eq!(resource["amount"], 1999);
    assert_eq!(resource["currency"], "EUR");
    assert_eq!(resource["customer_id"], "cus_42");
    assert_eq!(resource["description"], "Order #42");
    assert_eq!(resource["metadata"], json!({"order": "42"}));
    assert_eq!(resource.get("payment_method"), None, "none was given");
    assert_eq!(app.rows().await, ONE_PAYMENT);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_method_is_stored_and_shown_as_requested(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let mut request = body();
    request["payment_method"] = json!("pm_card_visa");

    let response = app.post_payment("order-1", &request).send().await.unwrap();

    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let accepted: Value = response.json().await.unwrap();
    assert_eq!(accepted["payment_method"], "pm_card_visa");
    let id = accepted["id"].as_str().unwrap();
    let stored = sqlx::query_scalar!(
        "SELECT payment_method FROM payments WHERE tenant_id = $1 AND payment_id = $2",
        app.tenant.id.as_uuid(),
        id.parse::<uuid::Uuid>().unwrap(),
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(stored.as_deref(), Some("pm_card_visa"));
    let shown: Value = app.get_payment(id).send().await.unwrap().json().await.unwrap();
    assert_eq!(shown["payment_method"], "pm_card_visa");
    assert_eq!(app.rows().await, ONE_PAYMENT);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_retry_while_the_payment_is_pending_replays_202_and_writes_nothing(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let first = app.post_payment("order-1", &body()).send().await.unwrap();
    let first_headers = first.headers().clone();
    let first: Value = first.json().await.unwrap();
    // The same request, spelled differently: key order, white space, number spelling.
    let respelled = r#"{ "metadata": {"order": "42"}, "description": "Order #42",
                         "customer_id": "cus_42", "currency": "EUR", "amount": 1.999e3 }"#;

    let retry = app.post_raw("order-1", Some("application/json"), respelled).send().await.unwrap();

    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    let headers = retry.headers().clone();
    assert_eq!(header(&headers, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert_eq!(header(&headers, "location"), header(&first_headers, "location"));
    assert_eq!(header(&headers, "idempotency-key-expires"), header(&first_headers, "idempotency-key-expires"));
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(retry, first);
    assert_eq!(app.rows().await, ONE_PAYMENT);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_field_sent_as_null_and_the_same_field_left_out_are_the_same_request(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let with_nulls =
        json!({"amount": 1999, "currency": "EUR", "customer_id": "cus_42", "description": null, "metadata": null});
    let left_out = json!({"amount": 1999, "currency": "EUR", "customer_id": "cus_42"});
    let first = app.post_payment("order-1", &with_nulls).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);

    let retry = app.post_payment("order-1", &left_out).send().await.unwrap();

    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    assert_eq!(header(retry.headers(), "idempotent-replayed"), Some("true"));
    assert_eq!(app.rows().await, ONE_PAYMENT);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_retry_after_the_payment_is_final_replays_the_stored_final_response(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let first = app.post_payment("order-1", &body()).send().await.unwrap();
    let payment_id = TestApp::payment_id(first).await;
    settle_succeeded(&app.db, app.tenant.id, payment_id).await;
    let stored = sqlx::query_scalar!(
        "SELECT response_body FROM idempotency_keys WHERE tenant_id = $1 AND payment_id = $2",
        app.tenant.id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_one(&app.db)
    .await
    .unwrap()
    .expect("settle stores the final response");

    let retry = app.post_payment("order-1", &body()).send().await.unwrap();

    assert_eq!(retry.status(), StatusCode::OK);
    let headers = retry.headers().clone();
    assert_eq!(header(&headers, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&headers, "retry-after"), None);
    assert!(headers.get("idempotency-key-expires").is_some());
    let replayed: Value = retry.json().await.unwrap();
    assert_eq!(replayed, stored);
    assert_eq!(replayed["status"], "succeeded");
    assert_eq!(replayed["provider_charge_id"], "ch_test_1");
    let rows = app.rows().await;
    assert_eq!((rows.payments, rows.keys), (1, 1));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_reused_with_a_different_body_is_refused_and_nothing_is_written(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let first = app.post_payment("order-1", &body()).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let expires = first.headers().get("idempotency-key-expires").cloned();
    let mut other = body();
    other["amount"] = json!(2000);

    let reused = app.post_payment("order-1", &other).send().await.unwrap();

    let (headers, _) = assert_problem(reused, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    assert_eq!(headers.get("idempotency-key-expires"), expires.as_ref());
    assert_eq!(app.rows().await, ONE_PAYMENT);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_reused_with_another_payment_method_is_refused_and_nothing_is_written(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let mut visa = body();
    visa["payment_method"] = json!("pm_card_visa");
    let first = app.post_payment("order-1", &visa).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let mut mastercard = body();
    mastercard["payment_method"] = json!("pm_card_mastercard");

    for other in [mastercard, body()] {
        let reused = app.post_payment("order-1", &other).send().await.unwrap();

        assert_problem(reused, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    }
    let stored = sqlx::query_scalar!("SELECT payment_method FROM payments").fetch_all(&app.db).await.unwrap();
    assert_eq!(stored, [Some("pm_card_visa".to_owned())]);
    assert_eq!(app.rows().await, ONE_PAYMENT);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_being_written_by_another_transaction_gets_409_after_the_lock_wait(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let key = IdempotencyKey::parse(b"order-1").unwrap();
    let request_body = body();
    let request = PaymentRequest::from_json(&request_body).unwrap();
    let fingerprint = Fingerprint::of("POST", "/v1/payments", &request_body);
    // Another request's transaction has written the key and not yet committed.
    let mut holder = app.db.begin().await.unwrap();
    let new = NewPayment {
        tenant_id: app.tenant.id,
        key,
        fingerprint,
        request,
        provider_account: None,
        retention: Duration::from_secs(86_400),
        lock_wait: None,
        trace: None,
    };
    assert!(intake::accept(&mut holder, &new).await.unwrap().created().is_some());

    let response = app.post_payment("order-1", &body()).send().await.unwrap();

    let (headers, _) = assert_problem(response, StatusCode::CONFLICT, "idempotency-key-in-use").await;
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    holder.rollback().await.unwrap();
    assert_eq!(app.rows().await, Rows { payments: 0, keys: 0, outbox: 0, events: 0 });
    let retry = app.post_payment("order-1", &body()).send().await.unwrap();
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    assert_eq!(app.rows().await, ONE_PAYMENT);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_same_key_from_two_tenants_makes_two_payments_that_neither_can_see_across(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let acme = app.tenant.clone();
    let globex = create_tenant(&app.db, "globex", None).await;

    let for_acme = app.post_payment_as(&acme, "order-1", &body()).send().await.unwrap();
    let for_globex = app.post_payment_as(&globex, "order-1", &body()).send().await.unwrap();

    assert_eq!(for_acme.status(), StatusCode::ACCEPTED);
    assert_eq!(for_globex.status(), StatusCode::ACCEPTED);
    assert_eq!(header(for_globex.headers(), "idempotent-replayed"), None);
    let acme_payment = TestApp::payment_id(for_acme).await.to_string();
    let globex_payment = TestApp::payment_id(for_globex).await.to_string();
    assert_ne!(acme_payment, globex_payment);
    assert_eq!(app.rows().await.payments, 2);
    for (tenant, foreign) in [(&acme, &globex_payment), (&globex, &acme_payment)] {
        let response = app.get_payment_as(tenant, foreign).send().await.unwrap();
        assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    }
    for (tenant, own) in [(&acme, &acme_payment), (&globex, &globex_payment)] {
        assert_eq!(app.get_payment_as(tenant, own).send().await.unwrap().status(), StatusCode::OK);
    }
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_outbox_row_continues_the_trace_of_the_request(_: PgPoolOptions, options: PgConnectOptions) {
    // The request span is at `info`: the default filter keeps it (and so its trace context).
    let _telemetry = telemetry::init("oncepay-api-tests", &helpers::settings().telemetry).unwrap();
    let app = TestApp::spawn(options).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";

    let response = app
        .post_payment("order-1", &body())
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .send()
        .await
        .unwrap();

    let payment_id = TestApp::payment_id(response).await;
    app.assert_outbox_continues(payment_id, trace_id, caller_span).await;
    app.stop().await;
}
