//! Refunds over HTTP: `POST /v1/payments/{id}/refunds` under the rules of `POST /v1/payments`,
//! what only a succeeded payment with money left allows, the races between refunds of one payment,
//! and following a refund (`GET /v1/refunds/{id}`, its long poll, `GET /v1/payments/{id}/refunds`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncepay_api::provider_intake::StripeIntakeSettings;
use oncepay_api::{Application, resource_response};
use oncepay_devkit::pg::{Cluster, Durability};
use oncepay_domain::ids::{PaymentId, RefundId};
use oncepay_provider::ProviderKind;
use oncepay_provider::stripe::StripeMode;
use oncepay_store::db;
use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::Barrier;

use crate::helpers::{
    self, RefundRows, TestApp, assert_problem, body, claim, claim_refund, create_tenant, header, refund_rows, refunded,
    settle_refund,
};

const NO_REFUND: RefundRows = RefundRows { refunds: 0, keys: 0, outbox: 0, events: 0 };
const ONE_REFUND: RefundRows = RefundRows { refunds: 1, keys: 1, outbox: 1, events: 1 };

/// The amount of every payment these tests refund ([`body`]), in EUR cents.
const CHARGED: i64 = 1999;

/// The refund id in a refund response's body.
async fn refund_id(response: Response) -> RefundId {
    let body: Value = response.json().await.unwrap();
    body["id"].as_str().unwrap().parse().unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_of_a_succeeded_payment_is_accepted_with_its_location_retry_after_and_key_expiry(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let payment_id = app.succeeded_payment("order-1").await;
    let request = json!({"amount": 500, "reason": "requested_by_customer", "metadata": {"ticket": "T-1"}});

    let response = app.post_refund(&payment_id.to_string(), "refund-1", &request).send().await.unwrap();

    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let headers = response.headers().clone();
    let resource: Value = response.json().await.unwrap();
    let id = resource["id"].as_str().unwrap();
    assert_eq!(header(&headers, "location"), Some(format!("/v1/refunds/{id}").as_str()));
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    assert_eq!(header(&headers, "idempotent-replayed"), None);
    let key = sqlx::query!(
        "SELECT refund_id, expires_at, created_at FROM refund_keys WHERE tenant_id = $1 AND idempotency_key = $2",
        app.tenant.id.as_uuid(),
        "refund-1",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(key.refund_id.to_string(), id);
    assert_eq!((key.expires_at - key.created_at).whole_seconds(), 86_400, "the payments' key retention");
    let expected_expiry = resource_response::http_date(key.expires_at).unwrap();
    assert_eq!(header(&headers, "idempotency-key-expires"), expected_expiry.to_str().ok());
    assert_eq!(resource["payment_id"], payment_id.to_string());
    assert_eq!(resource["status"], "pending");
    assert_eq!(resource["amount"], 500);
    assert_eq!(resource["currency"], "EUR");
    assert_eq!(resource["reason"], "requested_by_customer");
    assert_eq!(resource["metadata"], json!({"ticket": "T-1"}));
    let requested_by = sqlx::query_scalar!("SELECT requested_by FROM refunds WHERE refund_id = $1", key.refund_id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(requested_by, "api");
    assert_eq!(refund_rows(&app.db).await, ONE_REFUND);
    assert_eq!(refunded(&app.db, payment_id).await, (500, 0));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_retry_while_the_refund_is_pending_replays_202_and_writes_nothing(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let payment = app.succeeded_payment("order-1").await.to_string();
    let first = app.post_refund(&payment, "refund-1", &json!({"amount": 500, "reason": "duplicate"})).send();
    let first = first.await.unwrap();
    let first_headers = first.headers().clone();
    let first: Value = first.json().await.unwrap();
    // The same request, spelled differently: key order, white space, number spelling, a null.
    let respelled = r#"{ "reason": "duplicate", "metadata": null, "amount": 5e2 }"#;

    let retry = app
        .client
        .post(format!("{}/v1/payments/{payment}/refunds", app.address))
        .bearer_auth(&app.tenant.token)
        .header("Idempotency-Key", "refund-1")
        .header("Content-Type", "application/json")
        .body(respelled)
        .send()
        .await
        .unwrap();

    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    let headers = retry.headers().clone();
    assert_eq!(header(&headers, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert_eq!(header(&headers, "location"), header(&first_headers, "location"));
    assert_eq!(header(&headers, "idempotency-key-expires"), header(&first_headers, "idempotency-key-expires"));
    let retry: Value = retry.json().await.unwrap();
    assert_eq!(retry, first);
    assert_eq!(refund_rows(&app.db).await, ONE_REFUND);
    assert_eq!(refunded(&app.db, payment.parse().unwrap()).await, (500, 0));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_retry_after_the_refund_is_final_replays_the_stored_final_response(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let payment = app.succeeded_payment("order-1").await.to_string();
    let refund = refund_id(app.post_refund(&payment, "refund-1", &json!({"amount": 500})).send().await.unwrap()).await;
    claim_refund(&app.db, app.tenant.id, refund).await;
    settle_refund(&app.db, app.tenant.id, refund, true).await;
    let stored = sqlx::query_scalar!("SELECT response_body FROM refund_keys WHERE refund_id = $1", refund.as_uuid())
        .fetch_one(&app.db)
        .await
        .unwrap()
        .expect("settling stores the final response");

    let retry = app.post_refund(&payment, "refund-1", &json!({"amount": 500})).send().await.unwrap();

    assert_eq!(retry.status(), StatusCode::OK);
    let headers = retry.headers().clone();
    assert_eq!(header(&headers, "idempotent-replayed"), Some("true"));
    assert_eq!(header(&headers, "retry-after"), None);
    assert!(headers.get("idempotency-key-expires").is_some());
    let replayed: Value = retry.json().await.unwrap();
    assert_eq!(replayed, stored);
    assert_eq!(replayed["status"], "succeeded");
    assert_eq!(replayed["provider_refund_id"], format!("re_test_{refund}"));
    assert_eq!(refund_rows(&app.db).await.refunds, 1);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_reused_with_another_body_or_for_another_payment_is_refused_and_nothing_is_written(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let payment = app.succeeded_payment("order-1").await.to_string();
    let other_payment = app.succeeded_payment("order-2").await.to_string();
    let first = app.post_refund(&payment, "refund-1", &json!({"amount": 500})).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let expires = first.headers().get("idempotency-key-expires").cloned();

    let other_amount = app.post_refund(&payment, "refund-1", &json!({"amount": 501})).send().await.unwrap();
    let other_reason =
        app.post_refund(&payment, "refund-1", &json!({"amount": 500, "reason": "fraudulent"})).send().await.unwrap();
    let other_target = app.post_refund(&other_payment, "refund-1", &json!({"amount": 500})).send().await.unwrap();

    for reused in [other_amount, other_reason, other_target] {
        let (headers, _) = assert_problem(reused, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
        assert_eq!(headers.get("idempotency-key-expires"), expires.as_ref());
    }
    assert_eq!(refund_rows(&app.db).await, ONE_REFUND);
    assert_eq!(refunded(&app.db, payment.parse().unwrap()).await, (500, 0));
    assert_eq!(refunded(&app.db, other_payment.parse().unwrap()).await, (0, 0));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_used_for_a_payment_may_be_used_for_a_refund(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let payment = app.succeeded_payment("order-1").await.to_string();

    let refund = app.post_refund(&payment, "order-1", &json!({"amount": 500})).send().await.unwrap();

    assert_eq!(refund.status(), StatusCode::ACCEPTED);
    assert_eq!(header(refund.headers(), "idempotent-replayed"), None);
    assert_eq!(refund_rows(&app.db).await, ONE_REFUND);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn another_tenants_payment_and_unknown_or_malformed_payment_ids_are_not_found(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let other = create_tenant(&app.db, "globex", None).await;
    let payment = app.succeeded_payment("order-1").await;
    let unknown = uuid::Uuid::now_v7().to_string();

    let theirs = app.post_refund_as(&other, &payment.to_string(), "refund-1", &json!({})).send().await.unwrap();
    let theirs_listed = app.list_refunds_as(&other, &payment.to_string()).send().await.unwrap();
    let (_, theirs) = assert_problem(theirs, StatusCode::NOT_FOUND, "not-found").await;
    for id in [unknown.as_str(), "not-a-uuid", "1"] {
        let response = app.post_refund(id, "refund-1", &json!({})).send().await.unwrap();
        let (_, problem) = assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
        assert_eq!(problem, theirs, "{id}: another tenant's payment is told apart from {id}");
        let listed = app.list_refunds_as(&app.tenant, id).send().await.unwrap();
        assert_problem(listed, StatusCode::NOT_FOUND, "not-found").await;
    }

    assert_problem(theirs_listed, StatusCode::NOT_FOUND, "not-found").await;
    assert_eq!(refund_rows(&app.db).await, NO_REFUND);
    assert_eq!(refunded(&app.db, payment).await, (0, 0));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_that_has_not_succeeded_cannot_be_refunded_and_nothing_is_written(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let claimed = TestApp::payment_id(app.post_payment("order-1", &body()).send().await.unwrap()).await;
    let waiting = TestApp::payment_id(app.post_payment("order-2", &body()).send().await.unwrap()).await;
    claim(&app.db, app.tenant.id, claimed).await;
    let cases = [(claimed, "processing"), (waiting, "pending")];

    for (payment_id, status) in cases {
        let response = app.post_refund(&payment_id.to_string(), &format!("refund-{status}"), &json!({})).send();
        let response = response.await.unwrap();

        let (headers, problem) = assert_problem(response, StatusCode::CONFLICT, "payment-not-refundable").await;
        assert_eq!(header(&headers, "retry-after"), None, "retrying at once will not help");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(&format!("is {status}")), "{detail}");
    }
    assert_eq!(refund_rows(&app.db).await, NO_REFUND);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_of_more_than_is_left_is_refused_saying_how_much_is_left_and_nothing_is_written(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let payment_id = app.succeeded_payment("order-1").await;
    let payment = payment_id.to_string();
    let too_much_at_once = app.post_refund(&payment, "refund-0", &json!({"amount": CHARGED + 1})).send();
    let (_, problem) =
        assert_problem(too_much_at_once.await.unwrap(), StatusCode::UNPROCESSABLE_ENTITY, "refund-exceeds-payment")
            .await;
    assert!(problem["detail"].as_str().unwrap().contains("only 1999 (minor units of EUR)"), "{problem}");
    let first = app.post_refund(&payment, "refund-1", &json!({"amount": 1500})).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);

    let too_much = app.post_refund(&payment, "refund-2", &json!({"amount": 500})).send().await.unwrap();

    let (headers, problem) = assert_problem(too_much, StatusCode::UNPROCESSABLE_ENTITY, "refund-exceeds-payment").await;
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("asks for 500 but only 499 (minor units of EUR) is left"), "{detail}");
    assert_eq!(header(&headers, "idempotency-key-expires"), None, "the key was not stored");
    assert_eq!(refund_rows(&app.db).await, ONE_REFUND);
    assert_eq!(refunded(&app.db, payment_id).await, (1500, 0));
    // Nothing was written under the refused key: it is free for the request that fits.
    let fits = app.post_refund(&payment, "refund-2", &json!({"amount": 499})).send().await.unwrap();
    assert_eq!(fits.status(), StatusCode::ACCEPTED);
    assert_eq!(header(fits.headers(), "idempotent-replayed"), None);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_without_an_amount_refunds_all_that_is_left_and_then_nothing_is_left(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let payment_id = app.succeeded_payment("order-1").await;
    let payment = payment_id.to_string();
    let first = app.post_refund(&payment, "refund-1", &json!({"amount": 500})).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);

    let rest = app.post_refund(&payment, "refund-2", &json!({})).send().await.unwrap();
    let after_all = app.post_refund(&payment, "refund-3", &json!({"amount": 1})).send().await.unwrap();
    let after_all_again = app.post_refund(&payment, "refund-4", &json!({})).send().await.unwrap();

    assert_eq!(rest.status(), StatusCode::ACCEPTED);
    let rest: Value = rest.json().await.unwrap();
    assert_eq!(rest["amount"], CHARGED - 500);
    for refused in [after_all, after_all_again] {
        let (_, problem) = assert_problem(refused, StatusCode::UNPROCESSABLE_ENTITY, "nothing-to-refund").await;
        assert!(problem["detail"].as_str().unwrap().contains("nothing was recorded"), "{problem}");
    }
    assert_eq!(refund_rows(&app.db).await.refunds, 2);
    assert_eq!(refunded(&app.db, payment_id).await, (CHARGED, 0));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_failed_refund_gives_its_amount_back_to_be_refunded_again(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let payment_id = app.succeeded_payment("order-1").await;
    let payment = payment_id.to_string();
    let refund = refund_id(app.post_refund(&payment, "refund-1", &json!({})).send().await.unwrap()).await;
    claim_refund(&app.db, app.tenant.id, refund).await;

    settle_refund(&app.db, app.tenant.id, refund, false).await;
    let again = app.post_refund(&payment, "refund-2", &json!({})).send().await.unwrap();

    assert_eq!(again.status(), StatusCode::ACCEPTED);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["amount"], CHARGED);
    let failed: Value = app.get_refund_as(&app.tenant, &refund.to_string()).send().await.unwrap().json().await.unwrap();
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["failure"]["code"], "refund_failed");
    assert_eq!(refunded(&app.db, payment_id).await, (CHARGED, 0));
    app.stop().await;
}

/// One of two racing requests: its status and problem type.
async fn outcome(response: Response) -> (StatusCode, String) {
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    (status, body["type"].as_str().unwrap_or_default().rsplit('/').next().unwrap_or_default().to_owned())
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn two_refunds_that_together_ask_for_more_than_the_charge_get_one_202_and_never_reserve_more(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    const ROUNDS: usize = 12;
    let app = TestApp::spawn(options).await;

    for round in 0..ROUNDS {
        let payment_id = app.succeeded_payment(&format!("order-{round}")).await;
        // Half the rounds name amounts that fit alone but not together, half ask for all that is left.
        let request = if round % 2 == 0 { json!({"amount": 1000}) } else { json!({}) };
        let barrier = Arc::new(Barrier::new(2));
        let racers: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|racer| {
                let send = app.post_refund(&payment_id.to_string(), &format!("refund-{round}-{racer}"), &request);
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    outcome(send.send().await.unwrap()).await
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for racer in racers {
            outcomes.push(racer.await.unwrap());
        }

        let accepted = outcomes.iter().filter(|(status, _)| *status == StatusCode::ACCEPTED).count();
        assert_eq!(accepted, 1, "round {round}: {outcomes:?}");
        let refused = outcomes.iter().find(|(status, _)| *status != StatusCode::ACCEPTED).unwrap();
        let expected = if round % 2 == 0 { "refund-exceeds-payment" } else { "nothing-to-refund" };
        assert!(
            *refused == (StatusCode::UNPROCESSABLE_ENTITY, expected.to_owned())
                || *refused == (StatusCode::CONFLICT, "idempotency-key-in-use".to_owned()),
            "round {round}: {outcomes:?}"
        );
        let (reserved, _) = refunded(&app.db, payment_id).await;
        let amount: i64 = sqlx::query_scalar!(
            r#"SELECT coalesce(sum(amount), 0)::bigint AS "sum!" FROM refunds WHERE payment_id = $1"#,
            payment_id.as_uuid()
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        assert!(reserved <= CHARGED, "round {round}: {reserved} reserved of {CHARGED}");
        assert_eq!(reserved, amount, "round {round}: the reservation is the accepted refund's amount");
        assert_eq!(reserved, if round % 2 == 0 { 1000 } else { CHARGED }, "round {round}");
    }
    assert_eq!(refund_rows(&app.db).await.refunds, i64::try_from(ROUNDS).unwrap());
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn concurrent_duplicates_of_one_key_make_one_refund_and_all_get_its_id_or_409(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    const REQUESTS: usize = 20;
    let app = TestApp::spawn(options).await;
    let payment_id = app.succeeded_payment("order-1").await;
    let barrier = Arc::new(Barrier::new(REQUESTS));
    let racers: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let send = app.post_refund(&payment_id.to_string(), "refund-1", &json!({"amount": 500}));
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                let response = send.send().await.unwrap();
                let status = response.status();
                let replayed = response.headers().get("idempotent-replayed").is_some();
                let body: Value = response.json().await.unwrap();
                (status, replayed, body)
            })
        })
        .collect();

    let mut responses = Vec::with_capacity(REQUESTS);
    for racer in racers {
        responses.push(racer.await.unwrap());
    }

    let (accepted, busy): (Vec<_>, Vec<_>) =
        responses.iter().partition(|(status, _, _)| *status == StatusCode::ACCEPTED);
    assert!(
        busy.iter().all(|(status, _, body)| *status == StatusCode::CONFLICT
            && body["type"] == "https://oncepay.dev/problems/idempotency-key-in-use"),
        "{busy:?}"
    );
    assert!(!accepted.is_empty());
    let ids: Vec<&Value> = accepted.iter().map(|(_, _, body)| &body["id"]).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(accepted.iter().filter(|(_, replayed, _)| !replayed).count(), 1, "exactly one request created it");
    assert_eq!(refund_rows(&app.db).await, ONE_REFUND);
    assert_eq!(refunded(&app.db, payment_id).await, (500, 0));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_is_served_to_its_own_tenant_with_retry_after_until_it_is_final(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let other = create_tenant(&app.db, "globex", None).await;
    let payment = app.succeeded_payment("order-1").await.to_string();
    let created = app.post_refund(&payment, "refund-1", &json!({"amount": 500})).send().await.unwrap();
    let created: Value = created.json().await.unwrap();
    let id = created["id"].as_str().unwrap();

    let pending = app.get_refund_as(&app.tenant, id).send().await.unwrap();
    let theirs = app.get_refund_as(&other, id).send().await.unwrap();

    assert_eq!(pending.status(), StatusCode::OK);
    assert_eq!(header(pending.headers(), "retry-after"), Some("1"));
    assert_eq!(header(pending.headers(), "preference-applied"), None);
    assert_eq!(pending.json::<Value>().await.unwrap(), created);
    let (_, theirs) = assert_problem(theirs, StatusCode::NOT_FOUND, "not-found").await;
    for unknown in [uuid::Uuid::now_v7().to_string(), "not-a-uuid".to_owned(), payment.clone()] {
        let response = app.get_refund_as(&app.tenant, &unknown).send().await.unwrap();
        let (_, problem) = assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
        assert_eq!(problem, theirs, "{unknown}");
    }
    let refund: RefundId = id.parse().unwrap();
    claim_refund(&app.db, app.tenant.id, refund).await;
    settle_refund(&app.db, app.tenant.id, refund, true).await;
    let settled = app.get_refund_as(&app.tenant, id).send().await.unwrap();
    assert_eq!(header(settled.headers(), "retry-after"), None);
    assert_eq!(settled.json::<Value>().await.unwrap()["status"], "succeeded");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payments_refunds_are_listed_oldest_first(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let payment = app.succeeded_payment("order-1").await.to_string();
    let without_refunds = TestApp::payment_id(app.post_payment("order-2", &body()).send().await.unwrap()).await;
    let mut created = Vec::new();
    for (key, amount) in [("refund-1", 300), ("refund-2", 200), ("refund-3", 100)] {
        let response = app.post_refund(&payment, key, &json!({"amount": amount})).send().await.unwrap();
        created.push(response.json::<Value>().await.unwrap());
    }

    let listed = app.list_refunds_as(&app.tenant, &payment).send().await.unwrap();
    let empty = app.list_refunds_as(&app.tenant, &without_refunds.to_string()).send().await.unwrap();

    assert_eq!(listed.status(), StatusCode::OK);
    assert_eq!(header(listed.headers(), "retry-after"), None);
    assert_eq!(listed.json::<Value>().await.unwrap(), json!({"data": created}));
    assert_eq!(empty.status(), StatusCode::OK);
    assert_eq!(empty.json::<Value>().await.unwrap(), json!({"data": []}));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_long_poll_returns_when_the_refund_settles_and_the_payment_then_shows_it_refunded(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let payment_id = app.succeeded_payment("order-1").await;
    let payment = payment_id.to_string();
    let refund = refund_id(app.post_refund(&payment, "refund-1", &json!({"amount": 500})).send().await.unwrap()).await;
    claim_refund(&app.db, app.tenant.id, refund).await;
    let before: Value = app.get_payment(&payment).send().await.unwrap().json().await.unwrap();
    let started = Instant::now();
    let poll = tokio::spawn(app.get_refund_as(&app.tenant, &refund.to_string()).header("Prefer", "wait=20").send());
    app.until_long_polls_waiting(1).await;

    settle_refund(&app.db, app.tenant.id, refund, true).await;
    let response = poll.await.unwrap().unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(response.headers(), "preference-applied"), Some("wait=20"));
    assert_eq!(header(response.headers(), "retry-after"), None);
    let served: Value = response.json().await.unwrap();
    assert_eq!(served["status"], "succeeded");
    // A sanity bound, not a timing assertion: it was the change that ended the wait.
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    let after: Value = app.get_payment(&payment).send().await.unwrap().json().await.unwrap();
    assert_eq!((before["amount_refunded"].clone(), after["amount_refunded"].clone()), (json!(0), json!(500)));
    assert_eq!(after["status"], "succeeded");
    assert_eq!(refunded(&app.db, payment_id).await, (500, 500));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_long_poll_returns_the_unchanged_refund_when_the_wait_is_over(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let payment = app.succeeded_payment("order-1").await.to_string();
    let refund = refund_id(app.post_refund(&payment, "refund-1", &json!({})).send().await.unwrap()).await;

    let response = app.get_refund_as(&app.tenant, &refund.to_string()).header("Prefer", "wait=1").send();
    let response = response.await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(response.headers(), "preference-applied"), Some("wait=1"));
    assert_eq!(header(response.headers(), "retry-after"), Some("1"));
    assert_eq!(response.json::<Value>().await.unwrap()["status"], "pending");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_request_is_checked_before_the_store_and_refused_with_nothing_written(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let payment_id = app.succeeded_payment("order-1").await;
    let url = format!("{}/v1/payments/{payment_id}/refunds", app.address);
    let post = || app.client.post(&url).bearer_auth(&app.tenant.token);
    let cases = [
        (post().json(&json!({})), StatusCode::BAD_REQUEST, "missing-idempotency-key"),
        (post().header("Idempotency-Key", "a b").json(&json!({})), StatusCode::BAD_REQUEST, "invalid-idempotency-key"),
        (
            post().header("Idempotency-Key", "k").body("{}"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
        ),
        (
            post().header("Idempotency-Key", "k").header("Content-Type", "application/json").body("x".repeat(70_000)),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
        ),
        (
            post().header("Idempotency-Key", "k").header("Content-Type", "application/json").body("{"),
            StatusCode::BAD_REQUEST,
            "invalid-request",
        ),
        (
            app.client.post(&url).header("Idempotency-Key", "k").json(&json!({})),
            StatusCode::UNAUTHORIZED,
            "unauthorized",
        ),
    ];
    for (request, status, slug) in cases {
        assert_problem(request.send().await.unwrap(), status, slug).await;
    }

    let invalid = json!({"amount": 0, "reason": "changed_my_mind", "currency": "EUR", "metadata": {"k": 1}});
    let response = app.post_refund(&payment_id.to_string(), "k", &invalid).send().await.unwrap();

    let (_, problem) = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
    let mut fields: Vec<&str> =
        problem["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
    fields.sort_unstable();
    assert_eq!(fields, ["amount", "currency", "metadata.k", "reason"]);
    assert_eq!(refund_rows(&app.db).await, NO_REFUND);
    assert_eq!(refunded(&app.db, payment_id).await, (0, 0));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_refund_routes_refuse_other_methods_and_anonymous_reads(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let refunds_of = format!("/v1/payments/{}/refunds", PaymentId::generate());
    let refund = format!("/v1/refunds/{}", RefundId::generate());

    for (method, path, allow) in [
        (Method::PUT, refunds_of.as_str(), "GET, POST"),
        (Method::DELETE, refunds_of.as_str(), "GET, POST"),
        (Method::POST, refund.as_str(), "GET"),
    ] {
        let response = app.request(method.clone(), path).send().await.unwrap();
        let (headers, _) = assert_problem(response, StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed").await;
        assert_eq!(header(&headers, "allow"), Some(allow), "{method} {path}");
    }
    for path in [refunds_of.as_str(), refund.as_str()] {
        let response = app.request(Method::GET, path).send().await.unwrap();
        assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    app.stop().await;
}

#[tokio::test]
async fn a_refund_fails_closed_while_the_database_is_down_and_its_retry_is_accepted_once() {
    // Arrange: a cluster of the test's own, so it can crash, and a succeeded payment on it. The API
    // key stays verified while PostgreSQL is down, so the refund itself meets the dead store.
    let mut cluster = Cluster::start(Durability::Fast).await.unwrap();
    cluster.create_database("oncepay").await.unwrap();
    let url = cluster.url("oncepay");
    let pool = PgPoolOptions::new().max_connections(2).connect(&url).await.unwrap();
    db::migrate(&pool).await.unwrap();
    let mut settings = helpers::settings();
    settings.database.url = cluster.url_as("oncepay_api", "oncepay").into();
    settings.database.acquire_timeout_ms = 500;
    settings.auth.cache_ttl_secs = 3_600;
    let app = TestApp::start(Application::build(settings).unwrap(), pool).await;
    let payment_id = app.succeeded_payment("order-1").await;
    let refund = || app.post_refund(&payment_id.to_string(), "refund-1", &json!({"amount": 500})).send();

    // Act: refund while PostgreSQL is down, then retry with the same key once it is back, as a
    // client told to retry would (the first tries may meet connections that died in the crash).
    cluster.crash().await.unwrap();
    let refused = refund().await.unwrap();
    cluster.resume().await.unwrap();
    let mut retries = Vec::new();
    let accepted = loop {
        let response = refund().await.unwrap();
        if response.status() != StatusCode::SERVICE_UNAVAILABLE || retries.len() == 10 {
            break response;
        }
        retries.push(response.status());
    };

    // Assert: a 503 that says to retry, nothing of it in the database, and the retry accepted as new.
    let (headers, problem) = assert_problem(refused, StatusCode::SERVICE_UNAVAILABLE, "service-unavailable").await;
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert!(problem["detail"].as_str().unwrap().contains("Retry with the same Idempotency-Key"), "{problem}");
    assert_eq!(accepted.status(), StatusCode::ACCEPTED, "after {retries:?}");
    assert_eq!(header(accepted.headers(), "idempotent-replayed"), None, "the refused request left nothing");
    assert_eq!(refund_rows(&app.db).await, ONE_REFUND);
    assert_eq!(refunded(&app.db, payment_id).await, (500, 0));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_stripe_could_never_make_is_refused_before_anything_is_written(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn_with(options, |settings| {
        settings.provider.kind = ProviderKind::Stripe;
        settings.provider.stripe = Some(StripeIntakeSettings { mode: StripeMode::Direct });
    })
    .await;
    let payment_id = app.succeeded_payment("order-1").await;
    // Stripe keeps 50 metadata keys, and oncepay adds three of its own to a refund.
    let metadata: serde_json::Map<String, Value> = (0..48).map(|i| (format!("k{i}"), json!("v"))).collect();

    let response =
        app.post_refund(&payment_id.to_string(), "refund-1", &json!({"metadata": metadata})).send().await.unwrap();

    let (_, problem) = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
    assert_eq!(problem["errors"][0]["field"], "metadata", "{problem}");
    assert_eq!(refund_rows(&app.db).await, NO_REFUND);
    assert_eq!(refunded(&app.db, payment_id).await, (0, 0));
    app.stop().await;
}
