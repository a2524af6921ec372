//! The API key is a secret: no Debug output, error message or cause chain may contain it.

use std::error::Error as _;

use oncepay_client::{Client, PaymentIntent, RetryPolicy};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer};

use crate::support::{API_KEY, builder, fast_retries, problem};

/// The part of the key after its public prefix.
const SECRET_PART: &str = "TestSecretPart0123456789";

fn assert_no_key(text: &str) {
    assert!(!text.contains(API_KEY) && !text.contains(SECRET_PART), "the API key leaked into: {text}");
}

fn everything_said_about(error: &oncepay_client::Error) -> String {
    let mut text = format!("{error} / {error:?}");
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(" / {cause} / {cause:?}"));
        source = cause.source();
    }
    text
}

#[tokio::test]
async fn the_api_key_never_appears_in_debug_output_or_error_messages() {
    let server = MockServer::start().await;
    Mock::given(method("POST")).respond_with(problem(401, "unauthorized", None)).mount(&server).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let intent = PaymentIntent::builder(1999, "EUR", "cus_42").build();

    let unbuilt = Client::builder(server.uri(), API_KEY);
    let builder_debug = format!("{unbuilt:?}");
    let client = unbuilt.retry_policy(fast_retries()).build().unwrap();
    let rejected = client.create(&intent).await.unwrap_err();
    let unreachable = builder(&format!("http://{closed}"))
        .retry_policy(RetryPolicy { max_attempts: 2, ..fast_retries() })
        .build()
        .unwrap()
        .create(&intent)
        .await
        .unwrap_err();

    assert!(builder_debug.contains("redacted"), "{builder_debug}");
    assert_no_key(&builder_debug);
    assert_no_key(&format!("{client:?}"));
    assert_no_key(&format!("{:?}", builder(&server.uri())));
    assert_eq!(rejected.status(), Some(401));
    assert_no_key(&everything_said_about(&rejected));
    assert_no_key(&everything_said_about(&unreachable));
    // The key did go where it belongs.
    let sent = server.received_requests().await.unwrap();
    assert_eq!(sent[0].headers.get("authorization").unwrap(), format!("Bearer {API_KEY}").as_str());
}

#[test]
fn a_client_that_cannot_be_built_does_not_repeat_its_key() {
    let bad_url = Client::new("not a url", API_KEY).unwrap_err();
    let bad_key = Client::new("http://127.0.0.1:8080", format!("{API_KEY}\n")).unwrap_err();

    assert_no_key(&format!("{bad_url} / {bad_url:?}"));
    assert_no_key(&format!("{bad_key} / {bad_key:?}"));
}
