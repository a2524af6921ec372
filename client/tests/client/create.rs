//! `Client::create`: one key per intent, retries of what is safe to retry, never of a rejection.

use std::time::{Duration, SystemTime};

use oncepay_client::{Error, PaymentIntent, PaymentStatus, RetryPolicy};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{
    API_KEY, DroppingFront, Script, accepted, builder, client, fast_retries, header, header_in_head, payment_json,
    problem,
};

fn intent() -> PaymentIntent {
    PaymentIntent::builder(1999, "EUR", "cus_42").description("two coffees").metadata("order", "A-17").build()
}

async fn api_answering(responses: Vec<ResponseTemplate>) -> (MockServer, crate::support::Arrivals) {
    let server = MockServer::start().await;
    let (script, arrivals) = Script::new(responses);
    Mock::given(method("POST")).and(path("/v1/payments")).respond_with(script).mount(&server).await;
    (server, arrivals)
}

#[tokio::test]
async fn every_retry_of_an_intent_carries_the_same_key_and_body_until_it_is_accepted() {
    let (server, _) = api_answering(vec![
        problem(503, "service-unavailable", Some("0")),
        problem(409, "idempotency-key-in-use", Some("0")),
        problem(429, "rate-limited", Some("0")),
        ResponseTemplate::new(502).set_body_string("<html>bad gateway</html>"),
        accepted("pending"),
    ])
    .await;
    let intent = intent();

    let created = client(&server.uri()).create(&intent).await.unwrap();

    assert_eq!(created.payment.status, PaymentStatus::Pending);
    assert!(!created.replayed);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 5);
    for request in &requests {
        assert_eq!(header(request, "idempotency-key"), Some(intent.key().as_str()));
        assert_eq!(header(request, "authorization"), Some(format!("Bearer {API_KEY}").as_str()));
        assert_eq!(header(request, "content-type"), Some("application/json"));
        assert_eq!(request.body, requests[0].body);
    }
    assert_eq!(
        requests[0].body_json::<Value>().unwrap(),
        json!({
            "amount": 1999, "currency": "EUR", "customer_id": "cus_42", "description": "two coffees",
            "metadata": {"order": "A-17"},
        })
    );
}

#[tokio::test]
async fn sending_the_same_intent_again_later_reuses_its_key() {
    let (server, _) = api_answering(vec![accepted("pending")]).await;
    let client = client(&server.uri());
    let intent = intent();

    client.create(&intent).await.unwrap();
    client.create(&intent.clone()).await.unwrap();

    let keys: Vec<_> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|request| header(request, "idempotency-key").unwrap().to_owned())
        .collect();
    assert_eq!(keys, [intent.key().as_str(), intent.key().as_str()]);
}

#[tokio::test]
async fn a_dropped_connection_is_retried_under_the_same_key() {
    let (server, _) = api_answering(vec![accepted("pending")]).await;
    let front = DroppingFront::start(&server, 1).await;
    let intent = intent();

    let created = client(&front.uri).create(&intent).await.unwrap();

    assert_eq!(created.payment.status, PaymentStatus::Pending);
    let dropped = front.dropped_heads();
    assert_eq!(dropped.len(), 1);
    assert_eq!(header_in_head(&dropped[0], "idempotency-key").as_deref(), Some(intent.key().as_str()));
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    assert_eq!(header(&requests[0], "idempotency-key"), Some(intent.key().as_str()));
}

#[tokio::test]
async fn a_request_that_times_out_is_retried_under_the_same_key() {
    let (server, _) =
        api_answering(vec![accepted("pending").set_delay(Duration::from_secs(3)), accepted("pending")]).await;
    let client = builder(&server.uri()).timeout(Duration::from_millis(200)).build().unwrap();
    let intent = intent();

    let created = client.create(&intent).await.unwrap();

    assert_eq!(created.payment.status, PaymentStatus::Pending);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    assert!(requests.iter().all(|request| header(request, "idempotency-key") == Some(intent.key().as_str())));
}

#[tokio::test]
async fn the_next_attempt_never_comes_before_retry_after_in_seconds() {
    let (server, arrivals) =
        api_answering(vec![problem(503, "service-unavailable", Some("1")), accepted("pending")]).await;

    client(&server.uri()).create(&intent()).await.unwrap();

    let times = arrivals.times();
    assert_eq!(times.len(), 2);
    let gap = times[1].duration_since(times[0]).unwrap();
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}, Retry-After was 1 s");
}

#[tokio::test]
async fn the_next_attempt_never_comes_before_a_retry_after_date() {
    let not_before = SystemTime::now() + Duration::from_secs(2);
    let date = httpdate::fmt_http_date(not_before);
    let (server, arrivals) =
        api_answering(vec![problem(409, "idempotency-key-in-use", Some(&date)), accepted("pending")]).await;

    client(&server.uri()).create(&intent()).await.unwrap();

    let times = arrivals.times();
    assert_eq!(times.len(), 2);
    // The date has whole seconds: not before it, truncated.
    assert!(times[1] >= httpdate::parse_http_date(&date).unwrap(), "retried before {date}");
}

#[tokio::test]
async fn a_retry_after_longer_than_the_client_will_wait_ends_the_retries_at_once() {
    let (server, _) = api_answering(vec![problem(503, "service-unavailable", Some("3600")), accepted("pending")]).await;

    let error = client(&server.uri()).create(&intent()).await.unwrap_err();

    assert!(matches!(&error, Error::GaveUp { attempts: 1, .. }), "{error:?}");
    assert_eq!(error.status(), Some(503));
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_rejection_is_not_retried_and_its_problem_details_surface() {
    let cases = [
        (400, "invalid-request"),
        (401, "unauthorized"),
        (404, "not-found"),
        (413, "payload-too-large"),
        (415, "unsupported-media-type"),
        (422, "idempotency-key-reused"),
    ];
    for (status, slug) in cases {
        let (server, _) = api_answering(vec![problem(status, slug, Some("0")), accepted("pending")]).await;

        let error = client(&server.uri()).create(&intent()).await.unwrap_err();

        let Error::Problem { status: answered, problem } = error else { panic!("{status}: {error:?}") };
        assert_eq!(answered, status);
        assert_eq!(problem.type_uri, format!("https://oncepay.dev/problems/{slug}"));
        assert_eq!(problem.kind(), slug);
        assert_eq!(problem.title, format!("title of {slug}"));
        assert_eq!(problem.detail, format!("detail of {slug}"));
        assert_eq!(server.received_requests().await.unwrap().len(), 1, "{status} was retried");
    }
}

#[tokio::test]
async fn field_errors_of_an_invalid_request_surface() {
    let body = json!({
        "type": "https://oncepay.dev/problems/invalid-request",
        "title": "Invalid request",
        "status": 400,
        "detail": "1 field is invalid",
        "errors": [{"field": "currency", "message": "must be three upper-case letters"}],
    });
    let (server, _) =
        api_answering(vec![ResponseTemplate::new(400).set_body_raw(body.to_string(), "application/problem+json")])
            .await;
    let intent = PaymentIntent::builder(1999, "eur", "cus_42").build();

    let error = client(&server.uri()).create(&intent).await.unwrap_err();

    let problem = error.problem().unwrap();
    assert_eq!(problem.errors.len(), 1);
    assert_eq!(problem.errors[0].field, "currency");
    assert!(error.to_string().contains("currency: must be three upper-case letters"), "{error}");
}

#[tokio::test]
async fn the_client_gives_up_after_max_attempts_with_the_last_error() {
    let (server, _) = api_answering(vec![
        problem(409, "idempotency-key-in-use", Some("0")),
        problem(503, "service-unavailable", Some("0")),
    ])
    .await;
    let client =
        builder(&server.uri()).retry_policy(RetryPolicy { max_attempts: 3, ..fast_retries() }).build().unwrap();

    let error = client.create(&intent()).await.unwrap_err();

    let Error::GaveUp { attempts, last } = error else { panic!("{error:?}") };
    assert_eq!(attempts, 3);
    assert!(matches!(*last, Error::Problem { status: 503, .. }), "{last:?}");
    assert_eq!(server.received_requests().await.unwrap().len(), 3);
}

#[tokio::test]
async fn an_unreachable_api_is_given_up_on_with_the_transport_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let client = builder(&format!("http://{closed}"))
        .retry_policy(RetryPolicy { max_attempts: 2, ..fast_retries() })
        .build()
        .unwrap();

    let error = client.create(&intent()).await.unwrap_err();

    let Error::GaveUp { attempts: 2, last } = error else { panic!("{error:?}") };
    assert!(matches!(*last, Error::Http(_)), "{last:?}");
}

#[tokio::test]
async fn a_replayed_answer_is_reported_as_a_replay_and_pay_does_not_poll_a_final_one() {
    let (server, _) = api_answering(vec![
        ResponseTemplate::new(200)
            .insert_header("Idempotent-Replayed", "true")
            .set_body_json(payment_json("succeeded")),
    ])
    .await;
    let client = client(&server.uri());
    let intent = intent();

    let created = client.create(&intent).await.unwrap();
    let paid = client.pay(&intent, Duration::from_secs(30)).await.unwrap();

    assert!(created.replayed);
    assert_eq!(created.payment.status, PaymentStatus::Succeeded);
    assert_eq!(paid, created.payment);
    let requests = server.received_requests().await.unwrap();
    assert!(requests.iter().all(|request| request.method.as_str() == "POST"), "polled a final payment");
}

#[tokio::test]
async fn an_answer_that_is_not_a_payment_is_a_decode_error_and_not_retried() {
    let (server, _) = api_answering(vec![ResponseTemplate::new(202).set_body_string("accepted!")]).await;

    let error = client(&server.uri()).create(&intent()).await.unwrap_err();

    assert!(matches!(error, Error::Decode { status: 202, .. }), "{error:?}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}
