//! Refunds: `Client::refund` under the intent's one key, retries of what is safe to retry (never of
//! a refusal about the payment), following a refund, and a payment's list of refunds.

use std::time::Duration;

use oncepay_client::{Error, PaymentId, RefundId, RefundIntent, RefundReason, RefundStatus};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{
    Arrivals, PAYMENT_ID, REFUND_ID, Script, builder, client, header, problem, refund_accepted, refund_found,
    refund_json,
};

fn payment_id() -> PaymentId {
    PAYMENT_ID.parse().unwrap()
}

fn refund_id() -> RefundId {
    REFUND_ID.parse().unwrap()
}

fn intent() -> RefundIntent {
    RefundIntent::builder(payment_id()).amount(500).reason(RefundReason::RequestedByCustomer).build()
}

async fn api_answering(responses: Vec<ResponseTemplate>) -> (MockServer, Arrivals) {
    let server = MockServer::start().await;
    let (script, arrivals) = Script::new(responses);
    Mock::given(method("POST"))
        .and(path(format!("/v1/payments/{PAYMENT_ID}/refunds")))
        .respond_with(script)
        .mount(&server)
        .await;
    (server, arrivals)
}

#[tokio::test]
async fn every_retry_of_a_refund_intent_carries_the_same_key_and_body_to_its_payments_refunds() {
    let (server, _) = api_answering(vec![
        problem(503, "service-unavailable", Some("0")),
        problem(409, "idempotency-key-in-use", Some("0")),
        ResponseTemplate::new(502).set_body_string("<html>bad gateway</html>"),
        refund_accepted("pending"),
    ])
    .await;
    let intent = intent();

    let created = client(&server.uri()).refund(&intent).await.unwrap();

    assert_eq!(created.refund.status, RefundStatus::Pending);
    assert_eq!(created.refund.id, refund_id());
    assert_eq!(created.refund.payment_id, payment_id());
    assert!(!created.replayed);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 4);
    for request in &requests {
        assert_eq!(header(request, "idempotency-key"), Some(intent.key().as_str()));
        assert_eq!(header(request, "content-type"), Some("application/json"));
        assert_eq!(request.body, requests[0].body);
    }
    assert_eq!(requests[0].body_json::<Value>().unwrap(), json!({"amount": 500, "reason": "requested_by_customer"}));
}

#[tokio::test]
async fn a_refund_of_all_that_is_left_sends_an_empty_body_and_a_replay_is_reported_as_one() {
    let (server, _) = api_answering(vec![
        ResponseTemplate::new(200).insert_header("Idempotent-Replayed", "true").set_body_json(refund_json("succeeded")),
    ])
    .await;

    let created = client(&server.uri()).refund(&RefundIntent::builder(payment_id()).build()).await.unwrap();

    assert!(created.replayed);
    assert_eq!(created.refund.status, RefundStatus::Succeeded);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests[0].body_json::<Value>().unwrap(), json!({}));
}

#[tokio::test]
async fn a_refusal_about_the_payment_is_not_retried_and_its_problem_details_surface() {
    let cases = [
        (409, "payment-not-refundable"),
        (404, "not-found"),
        (422, "nothing-to-refund"),
        (422, "refund-exceeds-payment"),
        (422, "idempotency-key-reused"),
    ];
    for (status, slug) in cases {
        let (server, _) = api_answering(vec![problem(status, slug, None), refund_accepted("pending")]).await;

        let error = client(&server.uri()).refund(&intent()).await.unwrap_err();

        let Error::Problem { status: answered, problem } = error else { panic!("{slug}: {error:?}") };
        assert_eq!(answered, status);
        assert_eq!(problem.kind(), slug);
        assert_eq!(problem.detail, format!("detail of {slug}"));
        assert_eq!(server.received_requests().await.unwrap().len(), 1, "{slug} was retried");
    }
}

#[tokio::test]
async fn a_refund_is_followed_with_long_polls_to_its_final_state() {
    let server = MockServer::start().await;
    let (script, _) = Script::new(vec![refund_found("processing", "1"), refund_found("succeeded", "1")]);
    Mock::given(method("GET")).and(path(format!("/v1/refunds/{REFUND_ID}"))).respond_with(script).mount(&server).await;
    let client = builder(&server.uri()).long_poll(Duration::from_secs(5)).build().unwrap();
    let mut seen = Vec::new();

    let refund =
        client.watch_refund(&refund_id(), Duration::from_secs(60), |refund| seen.push(refund.status)).await.unwrap();

    assert_eq!(refund.status, RefundStatus::Succeeded);
    assert_eq!(refund.provider_refund_id.as_deref(), Some("re_1"));
    assert_eq!(seen, [RefundStatus::Processing, RefundStatus::Succeeded]);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    assert!(requests.iter().all(|request| header(request, "prefer") == Some("wait=5")));
}

#[tokio::test]
async fn get_refund_asks_once_without_holding() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(format!("/v1/refunds/{REFUND_ID}")))
        .respond_with(refund_found("failed", "1"))
        .mount(&server)
        .await;

    let refund = client(&server.uri()).get_refund(&refund_id()).await.unwrap();

    assert_eq!(refund.status, RefundStatus::Failed);
    assert_eq!(refund.failure.unwrap().code, "refund_failed");
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(header(&requests[0], "prefer"), None);
}

#[tokio::test]
async fn a_payments_refunds_are_listed_as_the_api_orders_them() {
    let server = MockServer::start().await;
    let mut second = refund_json("pending");
    second["id"] = json!("0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e81");
    let (script, _) = Script::new(vec![
        problem(503, "service-unavailable", Some("0")),
        ResponseTemplate::new(200).set_body_json(json!({"data": [refund_json("succeeded"), second]})),
    ]);
    Mock::given(method("GET"))
        .and(path(format!("/v1/payments/{PAYMENT_ID}/refunds")))
        .respond_with(script)
        .mount(&server)
        .await;

    let refunds = client(&server.uri()).list_refunds(&payment_id()).await.unwrap();

    let ids: Vec<String> = refunds.iter().map(|refund| refund.id.to_string()).collect();
    assert_eq!(ids, [REFUND_ID, "0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e81"]);
    assert_eq!(server.received_requests().await.unwrap().len(), 2, "the 503 was retried");
}
