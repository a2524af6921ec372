//! Following a payment: long polls with `Prefer: wait=N`, re-polled after each response, transient
//! failures retried, and non-final states returned as they are when the caller's time is up.

use std::time::Duration;

use oncepay_client::{PaymentId, PaymentIntent, PaymentStatus};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{Arrivals, PAYMENT_ID, Script, accepted, builder, client, found, header, problem};

fn payment_id() -> PaymentId {
    PAYMENT_ID.parse().unwrap()
}

async fn api_showing(responses: Vec<ResponseTemplate>) -> (MockServer, Arrivals) {
    let server = MockServer::start().await;
    let (script, arrivals) = Script::new(responses);
    Mock::given(method("GET"))
        .and(path(format!("/v1/payments/{PAYMENT_ID}")))
        .respond_with(script)
        .mount(&server)
        .await;
    (server, arrivals)
}

#[tokio::test]
async fn wait_for_terminal_follows_the_payment_over_several_long_polls() {
    let (server, _) = api_showing(vec![found("pending", "1"), found("processing", "1"), found("succeeded", "1")]).await;
    let client = builder(&server.uri()).long_poll(Duration::from_secs(5)).build().unwrap();

    let payment = client.wait_for_terminal(&payment_id(), Duration::from_secs(60)).await.unwrap();

    assert_eq!(payment.status, PaymentStatus::Succeeded);
    assert_eq!(payment.provider_charge_id.as_deref(), Some("ch_1"));
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 3);
    for request in &requests {
        assert_eq!(header(request, "prefer"), Some("wait=5"));
    }
}

#[tokio::test]
async fn watch_reports_each_status_once_as_it_moves() {
    let (server, _) =
        api_showing(vec![found("pending", "0"), found("pending", "0"), found("processing", "0"), found("failed", "0")])
            .await;
    let mut seen = Vec::new();

    let payment = client(&server.uri())
        .watch(&payment_id(), Duration::from_secs(60), |payment| seen.push(payment.status))
        .await
        .unwrap();

    assert_eq!(payment.status, PaymentStatus::Failed);
    assert_eq!(payment.failure.unwrap().code, "card_declined");
    assert_eq!(seen, [PaymentStatus::Pending, PaymentStatus::Processing, PaymentStatus::Failed]);
    assert_eq!(server.received_requests().await.unwrap().len(), 4);
}

#[tokio::test]
async fn pay_creates_the_payment_then_follows_it_to_its_final_state() {
    let (server, _) = api_showing(vec![found("processing", "1"), found("succeeded", "1")]).await;
    Mock::given(method("POST")).and(path("/v1/payments")).respond_with(accepted("pending")).mount(&server).await;
    let intent = PaymentIntent::builder(1999, "EUR", "cus_42").build();

    let payment = client(&server.uri()).pay(&intent, Duration::from_secs(60)).await.unwrap();

    assert_eq!(payment.status, PaymentStatus::Succeeded);
    let methods: Vec<_> =
        server.received_requests().await.unwrap().iter().map(|request| request.method.to_string()).collect();
    assert_eq!(methods, ["POST", "GET", "GET"]);
}

#[tokio::test]
async fn a_poll_that_fails_transiently_is_retried() {
    let (server, _) = api_showing(vec![
        found("processing", "1"),
        problem(503, "service-unavailable", Some("0")),
        ResponseTemplate::new(504),
        found("succeeded", "1"),
    ])
    .await;

    let payment = client(&server.uri()).wait_for_terminal(&payment_id(), Duration::from_secs(60)).await.unwrap();

    assert_eq!(payment.status, PaymentStatus::Succeeded);
    assert_eq!(server.received_requests().await.unwrap().len(), 4);
}

#[tokio::test]
async fn an_unknown_payment_is_returned_unsettled_when_time_is_up_without_hammering_the_api() {
    // This api responds at once instead of holding the poll, and asks for a second between polls.
    let (server, arrivals) = api_showing(vec![found("unknown", "1")]).await;

    let payment = client(&server.uri()).wait_for_terminal(&payment_id(), Duration::from_secs(2)).await.unwrap();

    assert_eq!(payment.status, PaymentStatus::Unknown);
    assert!(!payment.status.is_terminal());
    let times = arrivals.times();
    assert!((2..=5).contains(&times.len()), "{} polls in 2 s", times.len());
    // The second response did not move and was not held: the next poll waits for Retry-After.
    if let [_, second, third, ..] = times[..] {
        let gap = third.duration_since(second).unwrap();
        assert!(gap >= Duration::from_secs(1), "re-polled an unchanged status after {gap:?}");
    }
}

#[tokio::test]
async fn a_long_poll_may_take_longer_than_the_request_timeout() {
    let (server, _) = api_showing(vec![found("succeeded", "1").set_delay(Duration::from_millis(1500))]).await;
    let client = builder(&server.uri()).timeout(Duration::from_millis(500)).build().unwrap();

    let payment = client.wait_for_terminal(&payment_id(), Duration::from_secs(10)).await.unwrap();

    assert_eq!(payment.status, PaymentStatus::Succeeded);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1, "the held poll was cut off and retried");
    assert_eq!(header(&requests[0], "prefer"), Some("wait=9"));
}

#[tokio::test]
async fn get_asks_once_without_holding() {
    let (server, _) = api_showing(vec![found("dead_lettered", "60")]).await;

    let payment = client(&server.uri()).get(&payment_id()).await.unwrap();

    assert_eq!(payment.status, PaymentStatus::DeadLettered);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(header(&requests[0], "prefer"), None);
}
