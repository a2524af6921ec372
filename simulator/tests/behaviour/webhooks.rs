//! Webhooks: signed, retried, and subject to the drop, duplicate, delay and reorder faults.

use std::time::{Duration, Instant};

use oncepay_provider::wire::{
    Charge, ChargeStatus, EventType, ProviderEvent, Refund, RefundEvent, RefundEventType, WebhookEvent,
};
use oncepay_simulator::clock::unix_now;
use oncepay_simulator::control::PlantCharge;
use oncepay_simulator::faults::FaultsPatch;
use oncepay_webhook_signature::{DEFAULT_TOLERANCE_SECS, SignedHeaders, WebhookSecret, verify};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use crate::support::{Sim, body, eventually, refund_body, settings};

const HOOK_PATH: &str = "/webhooks/provider";

/// A receiver answering 200, and a simulator sending it webhooks under `faults`.
async fn setup(faults: FaultsPatch) -> (MockServer, Sim) {
    let receiver = MockServer::start().await;
    Mock::given(method("POST")).and(path(HOOK_PATH)).respond_with(ResponseTemplate::new(200)).mount(&receiver).await;
    let sim = start_for(&receiver, faults).await;
    (receiver, sim)
}

async fn start_for(receiver: &MockServer, faults: FaultsPatch) -> Sim {
    let mut settings = settings();
    settings.simulator.webhook_url = Some(format!("{}{HOOK_PATH}", receiver.uri()));
    let sim = Sim::start_with(settings).await;
    sim.control.set_faults(&faults).await.unwrap();
    sim
}

/// Waits until the receiver got at least `count` deliveries; returns them in arrival order.
async fn deliveries(receiver: &MockServer, count: usize) -> Vec<Request> {
    eventually(&format!("{count} webhook deliveries"), || async {
        let received = receiver.received_requests().await.unwrap_or_default();
        (received.len() >= count).then_some(received)
    })
    .await
}

fn header<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request.headers.get(name).and_then(|v| v.to_str().ok())
}

/// Checks the signature as the reconciler will, and reads the event.
fn verified(request: &Request, secret: &WebhookSecret) -> WebhookEvent {
    match verified_event(request, secret) {
        ProviderEvent::Charge(event) => event,
        ProviderEvent::Refund(event) => panic!("a refund event where a charge event was expected: {event:?}"),
    }
}

/// Checks the signature as the reconciler will, and reads the refund event.
fn verified_refund(request: &Request, secret: &WebhookSecret) -> RefundEvent {
    match verified_event(request, secret) {
        ProviderEvent::Refund(event) => event,
        ProviderEvent::Charge(event) => panic!("a charge event where a refund event was expected: {event:?}"),
    }
}

fn verified_event(request: &Request, secret: &WebhookSecret) -> ProviderEvent {
    let headers = SignedHeaders {
        id: header(request, "webhook-id"),
        timestamp: header(request, "webhook-timestamp"),
        signature: header(request, "webhook-signature"),
    };
    verify(std::slice::from_ref(secret), headers, &request.body, unix_now(), DEFAULT_TOLERANCE_SECS)
        .expect("the delivery is signed with the configured secret");
    serde_json::from_slice(&request.body).expect("the body is a webhook event")
}

fn charge_of(request: &Request) -> String {
    serde_json::from_slice::<WebhookEvent>(&request.body).unwrap().data.id
}

#[tokio::test]
async fn each_outcome_is_delivered_signed_with_the_charge_as_it_is() {
    let (receiver, sim) = setup(FaultsPatch::default()).await;
    let secret = sim.settings.simulator.webhook_secret.clone();

    let charged: Charge = sim.post_charge("key-1", &body(1999)).await.json().await.unwrap();
    let received = deliveries(&receiver, 1).await;
    let declined = sim
        .control
        .plant(&PlantCharge { status: ChargeStatus::Failed, ..PlantCharge::succeeded(500, "USD") })
        .await
        .unwrap();
    let received_after = deliveries(&receiver, 2).await;

    let first = verified(&received[0], &secret);
    assert_eq!((first.event_type, &first.data), (EventType::ChargeSucceeded, &charged));
    assert!(header(&received[0], "webhook-id").unwrap().starts_with("msg_"));
    assert_eq!(header(&received[0], "content-type"), Some("application/json"));
    let second = verified(&received_after[1], &secret);
    assert_eq!((second.event_type, &second.data), (EventType::ChargeFailed, &declined));
    assert_eq!(declined.failure_code.as_deref(), Some("card_declined"));
    assert_ne!(header(&received_after[0], "webhook-id"), header(&received_after[1], "webhook-id"));
    let other_secret = WebhookSecret::parse("whsec_c29tZWJvZHkgZWxzZXMgc2VjcmV0IGtleQ==").unwrap();
    let headers = SignedHeaders {
        id: header(&received[0], "webhook-id"),
        timestamp: header(&received[0], "webhook-timestamp"),
        signature: header(&received[0], "webhook-signature"),
    };
    assert!(verify(&[other_secret], headers, &received[0].body, unix_now(), DEFAULT_TOLERANCE_SECS).is_err());
}

#[tokio::test]
async fn a_delivery_refused_with_500_is_retried_with_the_same_id_and_body() {
    let receiver = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(HOOK_PATH))
        .respond_with(ResponseTemplate::new(500))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&receiver)
        .await;
    Mock::given(method("POST")).and(path(HOOK_PATH)).respond_with(ResponseTemplate::new(200)).mount(&receiver).await;
    let sim = start_for(&receiver, FaultsPatch::default()).await;
    let secret = sim.settings.simulator.webhook_secret.clone();

    sim.post_charge("key-1", &body(1999)).await;
    let received = deliveries(&receiver, 2).await;

    assert_eq!(header(&received[0], "webhook-id"), header(&received[1], "webhook-id"));
    assert_eq!(received[0].body, received[1].body);
    assert_eq!(verified(&received[0], &secret), verified(&received[1], &secret));
}

#[tokio::test]
async fn an_unreachable_receiver_is_retried_until_it_answers() {
    // Reserve a port, point the simulator at it, and only then start listening there.
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], oncepay_devkit::ports::reserve().unwrap()));
    let mut settings = settings();
    settings.simulator.webhook_url = Some(format!("http://{address}{HOOK_PATH}"));
    settings.simulator.webhook_max_attempts = 1_000;
    let sim = Sim::start_with(settings).await;

    sim.post_charge("key-1", &body(1999)).await;
    let receiver = MockServer::builder().listener(std::net::TcpListener::bind(address).unwrap()).start().await;
    Mock::given(method("POST")).and(path(HOOK_PATH)).respond_with(ResponseTemplate::new(200)).mount(&receiver).await;
    let received = deliveries(&receiver, 1).await;

    verified(&received[0], &sim.settings.simulator.webhook_secret);
}

#[tokio::test]
async fn a_duplicated_event_is_delivered_twice_with_one_id() {
    let (receiver, sim) = setup(FaultsPatch { webhook_duplicate_rate: Some(1.0), ..Default::default() }).await;

    let charge: Charge = sim.post_charge("key-1", &body(1999)).await.json().await.unwrap();
    let received = deliveries(&receiver, 2).await;

    assert_eq!(header(&received[0], "webhook-id"), header(&received[1], "webhook-id"));
    assert_eq!(received[0].body, received[1].body);
    assert_eq!(charge_of(&received[0]), charge.id);
}

#[tokio::test]
async fn reordered_events_arrive_swapped() {
    let (receiver, sim) =
        setup(FaultsPatch { webhook_reorder: Some(true), webhook_reorder_hold_ms: Some(60_000), ..Default::default() })
            .await;

    let first: Charge = sim.post_charge("key-1", &body(100)).await.json().await.unwrap();
    let second: Charge = sim.post_charge("key-2", &body(200)).await.json().await.unwrap();
    let received = deliveries(&receiver, 2).await;

    assert_eq!([charge_of(&received[0]), charge_of(&received[1])], [second.id, first.id]);
}

#[tokio::test]
async fn a_held_event_goes_alone_when_no_successor_comes() {
    let (receiver, sim) =
        setup(FaultsPatch { webhook_reorder: Some(true), webhook_reorder_hold_ms: Some(100), ..Default::default() })
            .await;

    let only: Charge = sim.post_charge("key-1", &body(100)).await.json().await.unwrap();
    let received = deliveries(&receiver, 1).await;

    assert_eq!(charge_of(&received[0]), only.id);
}

#[tokio::test]
async fn a_dropped_event_is_never_delivered() {
    // Reordering with a long hold is the barrier: events are handled one by one in order, an
    // event is held until the next one comes, and then both go newest first. If the first event
    // below were not dropped, the receiver would get the second and then the first.
    let (receiver, sim) = setup(FaultsPatch {
        webhook_drop_rate: Some(1.0),
        webhook_reorder: Some(true),
        webhook_reorder_hold_ms: Some(60_000),
        ..Default::default()
    })
    .await;

    sim.post_charge("key-dropped", &body(100)).await;
    sim.control.set_faults(&FaultsPatch { webhook_drop_rate: Some(0.0), ..Default::default() }).await.unwrap();
    let second: Charge = sim.post_charge("key-2", &body(200)).await.json().await.unwrap();
    let third: Charge = sim.post_charge("key-3", &body(300)).await.json().await.unwrap();
    let received = deliveries(&receiver, 2).await;

    assert_eq!([charge_of(&received[0]), charge_of(&received[1])], [third.id, second.id]);
}

#[tokio::test]
async fn a_delayed_event_waits_before_its_first_attempt() {
    let (receiver, sim) = setup(FaultsPatch { webhook_delay_ms: Some(500), ..Default::default() }).await;

    let started = Instant::now();
    sim.post_charge("key-1", &body(100)).await;
    deliveries(&receiver, 1).await;

    assert!(started.elapsed() >= Duration::from_millis(500), "delivered after {:?}", started.elapsed());
}

#[tokio::test]
async fn the_webhook_target_can_be_set_at_run_time_for_later_events() {
    let receiver = MockServer::start().await;
    Mock::given(method("POST")).and(path(HOOK_PATH)).respond_with(ResponseTemplate::new(200)).mount(&receiver).await;
    let sim = Sim::start().await;

    sim.post_charge("key-before", &body(100)).await;
    let target = sim.control.set_webhook_url(Some(&format!("{}{HOOK_PATH}", receiver.uri()))).await.unwrap();
    let after: Charge = sim.post_charge("key-after", &body(200)).await.json().await.unwrap();
    let planted = sim.control.plant(&PlantCharge::succeeded(300, "EUR")).await.unwrap();
    let received = deliveries(&receiver, 2).await;
    let refused = sim.control.set_webhook_url(Some("not a url")).await;

    assert_eq!(target.url, Some(format!("{}{HOOK_PATH}", receiver.uri())));
    let mut delivered: Vec<String> = received.iter().map(charge_of).collect();
    delivered.sort();
    let mut expected = vec![after.id, planted.id];
    expected.sort();
    assert_eq!(delivered, expected, "the charge made with no target has no event");
    assert!(refused.is_err());
}

#[tokio::test]
async fn each_refund_outcome_is_delivered_signed_with_the_refund_as_it_is() {
    let (receiver, sim) = setup(FaultsPatch::default()).await;
    let secret = sim.settings.simulator.webhook_secret.clone();
    let charge: Charge = sim.post_charge("key-1", &body(1999)).await.json().await.unwrap();
    deliveries(&receiver, 1).await;

    let refunded: Refund = sim.post_refund("refund-1", &refund_body(&charge.id, 500)).await.json().await.unwrap();
    let after_refund = deliveries(&receiver, 2).await;
    sim.control.set_faults(&FaultsPatch { refund_failure_rate: Some(1.0), ..Default::default() }).await.unwrap();
    let failed = sim.post_refund("refund-2", &refund_body(&charge.id, 500)).await;
    let failure_body = failed.json::<serde_json::Value>().await.unwrap();
    let (failed_id, failure_code) = (&failure_body["error"]["refund"], &failure_body["error"]["code"]);
    let after_failure = deliveries(&receiver, 3).await;

    let succeeded = verified_refund(&after_refund[1], &secret);
    assert_eq!((succeeded.event_type, &succeeded.data), (RefundEventType::RefundUpdated, &refunded));
    let failure = verified_refund(&after_failure[2], &secret);
    assert_eq!(failure.event_type, RefundEventType::RefundFailed);
    assert_eq!(failure.data.id, failed_id.as_str().unwrap());
    assert_eq!(failure.data.failure_reason.as_deref(), failure_code.as_str());
    let body: serde_json::Value = serde_json::from_slice(&after_refund[1].body).unwrap();
    assert_eq!(body["type"], "refund.updated");
    assert!(serde_json::from_slice::<WebhookEvent>(&after_refund[1].body).is_err(), "no charge event");
    assert_ne!(header(&after_refund[1], "webhook-id"), header(&after_failure[2], "webhook-id"));
}

fn subject_of(request: &Request) -> String {
    match serde_json::from_slice::<ProviderEvent>(&request.body).unwrap() {
        ProviderEvent::Charge(event) => event.data.id,
        ProviderEvent::Refund(event) => event.data.id,
    }
}

#[tokio::test]
async fn a_duplicated_refund_event_is_delivered_twice_with_one_id() {
    let (receiver, sim) = setup(FaultsPatch::default()).await;
    let charge: Charge = sim.post_charge("key-1", &body(1999)).await.json().await.unwrap();
    deliveries(&receiver, 1).await;
    sim.control.set_faults(&FaultsPatch { webhook_duplicate_rate: Some(1.0), ..Default::default() }).await.unwrap();

    let refund: Refund = sim.post_refund("refund-1", &refund_body(&charge.id, 500)).await.json().await.unwrap();
    let received = deliveries(&receiver, 3).await;

    assert_eq!([subject_of(&received[1]), subject_of(&received[2])], [refund.id.clone(), refund.id]);
    assert_eq!(header(&received[1], "webhook-id"), header(&received[2], "webhook-id"));
    assert_eq!(received[1].body, received[2].body);
}

#[tokio::test]
async fn a_dropped_refund_event_is_never_delivered_and_refund_events_are_reordered() {
    // Reordering with a long hold is the barrier, as for charges: the charge's event is held until
    // the next event comes, then both go newest first. Had the first refund's event not been
    // dropped, it would have come before the charge's.
    let (receiver, sim) =
        setup(FaultsPatch { webhook_reorder: Some(true), webhook_reorder_hold_ms: Some(60_000), ..Default::default() })
            .await;
    let charge: Charge = sim.post_charge("key-1", &body(1999)).await.json().await.unwrap();

    sim.control.set_faults(&FaultsPatch { webhook_drop_rate: Some(1.0), ..Default::default() }).await.unwrap();
    sim.post_refund("refund-dropped", &refund_body(&charge.id, 100)).await;
    sim.control.set_faults(&FaultsPatch { webhook_drop_rate: Some(0.0), ..Default::default() }).await.unwrap();
    let second: Refund = sim.post_refund("refund-2", &refund_body(&charge.id, 100)).await.json().await.unwrap();
    let received = deliveries(&receiver, 2).await;

    assert_eq!([subject_of(&received[0]), subject_of(&received[1])], [second.id, charge.id]);
}
