//! The `oncepay` binary against a stand-in api: what it prints, what it sends, how it exits.

use std::process::Output;

use serde_json::Value;
use wiremock::matchers::{header as has_header, method, path};
use wiremock::{Mock, MockServer};

use crate::support::{
    API_KEY, PAYMENT_ID, REFUND_ID, Script, accepted, found, header, payment_json, problem, refund_accepted,
    refund_found, refund_json,
};

async fn oncepay(server: &MockServer, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"))
        .args(args)
        .env("ONCEPAY_URL", server.uri())
        .env("ONCEPAY_API_KEY", API_KEY)
        .output()
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn api_with_payment(answers: Vec<wiremock::ResponseTemplate>) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/v1/payments")).respond_with(accepted("pending")).mount(&server).await;
    let (script, _) = Script::new(answers);
    Mock::given(method("GET"))
        .and(path(format!("/v1/payments/{PAYMENT_ID}")))
        .respond_with(script)
        .mount(&server)
        .await;
    server
}

const PAY: [&str; 7] = ["pay", "--amount", "1999", "--currency", "EUR", "--customer", "cus_42"];

#[tokio::test]
async fn pay_prints_its_key_and_follows_the_payment_to_success() {
    let server = api_with_payment(vec![found("processing", "1"), found("succeeded", "1")]).await;

    let output = oncepay(&server, &[&PAY[..], &["--metadata", "order=A-17"]].concat()).await;

    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", text(&output.stderr));
    let requests = server.received_requests().await.unwrap();
    let key = header(&requests[0], "idempotency-key").unwrap();
    assert!(stdout.contains(&format!("--key {key}")), "{stdout}");
    assert!(stdout.contains(&format!("payment {PAYMENT_ID}: pending (accepted)")), "{stdout}");
    assert!(stdout.contains(&format!("payment {PAYMENT_ID}: processing")), "{stdout}");
    assert!(stdout.contains("status       succeeded"), "{stdout}");
    assert_eq!(requests[0].body_json::<Value>().unwrap()["metadata"]["order"], "A-17");
    assert!(requests[1..].iter().all(|request| header(request, "prefer").is_some_and(|p| p.starts_with("wait="))));
}

#[tokio::test]
async fn pay_sends_the_payment_method_it_is_given_and_none_when_it_is_not() {
    let server = api_with_payment(vec![found("succeeded", "1")]).await;

    let with = oncepay(&server, &[&PAY[..], &["--payment-method", "pm_card_visa", "--no-wait"]].concat()).await;
    let without = oncepay(&server, &[&PAY[..], &["--no-wait"]].concat()).await;

    assert_eq!(with.status.code(), Some(0), "{}", text(&with.stderr));
    assert_eq!(without.status.code(), Some(0), "{}", text(&without.stderr));
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2, "--no-wait: one POST each, no polls");
    let bodies: Vec<Value> = requests.iter().map(|request| request.body_json().unwrap()).collect();
    assert_eq!(bodies[0]["payment_method"], "pm_card_visa");
    assert_eq!(bodies[1].get("payment_method"), None, "{}", bodies[1]);
}

#[tokio::test]
async fn the_help_of_pay_says_what_a_payment_method_is() {
    let server = MockServer::start().await;

    let help = oncepay(&server, &["pay", "--help"]).await;

    let help = text(&help.stdout);
    assert!(help.contains("--payment-method <REFERENCE>"), "{help}");
    assert!(help.contains("the provider's reference for it, e.g. pm_card_visa"), "{help}");
}

#[tokio::test]
async fn pay_with_a_key_sends_that_key_and_a_declined_payment_exits_3() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(has_header("idempotency-key", "order-A-17"))
        .respond_with(accepted("pending"))
        .mount(&server)
        .await;
    Mock::given(method("GET")).respond_with(found("failed", "1")).mount(&server).await;

    let output = oncepay(&server, &[&PAY[..], &["--key", "order-A-17"]].concat()).await;

    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(3), "{stdout}{}", text(&output.stderr));
    assert!(stdout.contains("idempotency key: order-A-17"), "{stdout}");
    assert!(stdout.contains("card_declined: The card was declined."), "{stdout}");
}

#[tokio::test]
async fn a_rejected_payment_exits_5_with_the_problem_on_stderr() {
    let server = MockServer::start().await;
    Mock::given(method("POST")).respond_with(problem(422, "idempotency-key-reused", None)).mount(&server).await;

    let output = oncepay(&server, &[&PAY[..], &["--key", "used-before"]].concat()).await;

    assert_eq!(output.status.code(), Some(5));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("422: title of idempotency-key-reused: detail of idempotency-key-reused"), "{stderr}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn pay_no_wait_json_prints_the_key_and_the_accepted_payment_without_polling() {
    let server = api_with_payment(vec![found("succeeded", "1")]).await;

    let output = oncepay(&server, &[&PAY[..], &["--no-wait", "--json"]].concat()).await;

    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(printed["idempotency_key"], header(&requests[0], "idempotency-key").unwrap());
    assert_eq!(printed["replayed"], false);
    assert_eq!(printed["payment"], payment_json("pending"));
}

#[tokio::test]
async fn status_json_prints_the_raw_resource() {
    let server = api_with_payment(vec![found("succeeded", "1")]).await;

    let output = oncepay(&server, &["status", PAYMENT_ID, "--json"]).await;

    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(serde_json::from_slice::<Value>(&output.stdout).unwrap(), payment_json("succeeded"));
}

#[tokio::test]
async fn the_status_of_an_unsettled_payment_exits_4() {
    let server = api_with_payment(vec![found("unknown", "60")]).await;

    let output = oncepay(&server, &["status", PAYMENT_ID]).await;

    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("status       unknown (the provider's response was lost"));
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let server = MockServer::start().await;

    let bad_id = oncepay(&server, &["status", "../../admin"]).await;
    let bad_key = oncepay(&server, &[&PAY[..], &["--key", "has space"]].concat()).await;

    assert_eq!(bad_id.status.code(), Some(2));
    assert_eq!(bad_key.status.code(), Some(2));
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_api_key_is_never_printed_not_even_by_help() {
    let server = api_with_payment(vec![found("succeeded", "1")]).await;

    let outputs =
        [oncepay(&server, &["--help"]).await, oncepay(&server, &["pay", "--help"]).await, oncepay(&server, &PAY).await];

    for output in outputs {
        let all = format!("{}{}", text(&output.stdout), text(&output.stderr));
        assert!(!all.contains(API_KEY), "{all}");
    }
}

async fn api_with_refund(answers: Vec<wiremock::ResponseTemplate>) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(format!("/v1/payments/{PAYMENT_ID}/refunds")))
        .respond_with(refund_accepted("pending"))
        .mount(&server)
        .await;
    let (script, _) = Script::new(answers);
    Mock::given(method("GET")).and(path(format!("/v1/refunds/{REFUND_ID}"))).respond_with(script).mount(&server).await;
    server
}

#[tokio::test]
async fn refund_prints_its_key_and_follows_the_refund_to_success() {
    let server = api_with_refund(vec![refund_found("processing", "1"), refund_found("succeeded", "1")]).await;

    let output =
        oncepay(&server, &["refund", PAYMENT_ID, "--amount", "500", "--reason", "requested_by_customer"]).await;

    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", text(&output.stderr));
    let requests = server.received_requests().await.unwrap();
    let key = header(&requests[0], "idempotency-key").unwrap();
    assert!(
        stdout.contains(&format!("to retry this refund safely, run the same command with --key {key}")),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("refund {REFUND_ID}: pending (accepted)")), "{stdout}");
    assert!(stdout.contains(&format!("refund {REFUND_ID}: processing")), "{stdout}");
    assert!(stdout.contains("status       succeeded (the money went back to the customer)"), "{stdout}");
    assert_eq!(
        requests[0].body_json::<Value>().unwrap(),
        serde_json::json!({"amount": 500, "reason": "requested_by_customer"})
    );
    assert!(requests[1..].iter().all(|request| header(request, "prefer").is_some_and(|p| p.starts_with("wait="))));
}

#[tokio::test]
async fn refund_with_an_idempotency_key_sends_that_key_and_no_wait_json_does_not_poll() {
    let server = api_with_refund(vec![refund_found("succeeded", "1")]).await;

    let output =
        oncepay(&server, &["refund", PAYMENT_ID, "--idempotency-key", "refund-A-17", "--no-wait", "--json"]).await;

    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1, "--no-wait: one POST, no polls");
    assert_eq!(header(&requests[0], "idempotency-key"), Some("refund-A-17"));
    assert_eq!(requests[0].body_json::<Value>().unwrap(), serde_json::json!({}), "all that is left");
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(printed["idempotency_key"], "refund-A-17");
    assert_eq!(printed["refund"], refund_json("pending"));
}

#[tokio::test]
async fn a_refund_of_a_payment_that_has_not_succeeded_exits_5_at_once() {
    let server = MockServer::start().await;
    Mock::given(method("POST")).respond_with(problem(409, "payment-not-refundable", None)).mount(&server).await;

    let output = oncepay(&server, &["refund", PAYMENT_ID]).await;

    assert_eq!(output.status.code(), Some(5));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("409: title of payment-not-refundable: detail of payment-not-refundable"), "{stderr}");
    assert!(!stderr.contains("retrying with --key"), "a rejection is not worth retrying: {stderr}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn refund_status_json_prints_the_raw_resource_and_a_failed_refund_exits_3() {
    let server = api_with_refund(vec![refund_found("failed", "1")]).await;

    let json = oncepay(&server, &["refund-status", REFUND_ID, "--json"]).await;
    let described = oncepay(&server, &["refund-status", REFUND_ID]).await;

    assert_eq!(json.status.code(), Some(3), "{}", text(&json.stderr));
    assert_eq!(serde_json::from_slice::<Value>(&json.stdout).unwrap(), refund_json("failed"));
    assert!(text(&described.stdout).contains("failure      refund_failed: The provider failed the refund."));
}

#[tokio::test]
async fn refunds_lists_a_payments_refunds_and_a_payment_it_does_not_know_exits_5() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(format!("/v1/payments/{PAYMENT_ID}/refunds")))
        .respond_with(
            wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({"data": [refund_json("succeeded")]})),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET")).respond_with(problem(404, "not-found", None)).mount(&server).await;

    let listed = oncepay(&server, &["refunds", PAYMENT_ID]).await;
    let unknown = oncepay(&server, &["refunds", "0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e99"]).await;

    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed.stderr));
    let stdout = text(&listed.stdout);
    assert!(stdout.starts_with(&format!("{REFUND_ID}  succeeded     500 EUR")), "{stdout}");
    assert_eq!(unknown.status.code(), Some(5));
}
