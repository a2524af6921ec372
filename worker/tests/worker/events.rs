//! Events to merchants, end to end in the worker: a change writes its event in its transaction, and
//! the event sender delivers it to a real receiver on 127.0.0.1 that verifies every delivery with
//! the reference implementation (`standardwebhooks` 1.0.1), in order per payment, with retries,
//! dead letters, disabling, the address rules and fencing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use oncepay_devkit::rabbitmq;
use oncepay_domain::endpoint_url::UrlPolicy;
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_provider::http::HttpProvider;
use oncepay_store::connections::Connections;
use oncepay_store::merchant_deliveries::{
    self, Attempt, ClaimedDelivery, Health, Next, Record, Recording, WriterLease,
};
use oncepay_store::merchant_endpoints::{self, NewEndpoint};
use oncepay_store::transitions::{self, Change, Settlement};
use oncepay_webhook_signature::WebhookSecret;
use oncepay_worker::Drainer;
use oncepay_worker::events::exchange::Publisher;
use oncepay_worker::events::http::Sender;
use oncepay_worker::events::verdict::Rules;
use oncepay_worker::events::{EventSender, EventSenderConfig};
use secrecy::SecretString;
use serde_json::Value;
use sqlx::PgPool;
use standardwebhooks::Webhook;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::support::{self, Accepted};

/// What the receiver saw of one delivery.
#[derive(Debug, Clone)]
struct Seen {
    id: String,
    body: Value,
    raw: Vec<u8>,
    headers: http::HeaderMap,
}

/// A merchant's receiver: verifies every delivery with the reference implementation against its
/// secret, keeps what it verified, and answers from a script (204 once the script is spent).
#[derive(Clone)]
struct Receiver {
    secret: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    refused: Arc<Mutex<u32>>,
    answers: Arc<Mutex<VecDeque<ResponseTemplate>>>,
}

impl Receiver {
    async fn start(answers: Vec<ResponseTemplate>) -> (MockServer, Self) {
        let receiver = Self {
            secret: WebhookSecret::generate(),
            seen: Arc::default(),
            refused: Arc::default(),
            answers: Arc::new(Mutex::new(answers.into())),
        };
        let server = MockServer::start().await;
        Mock::given(wiremock::matchers::method("POST")).respond_with(receiver.clone()).mount(&server).await;
        (server, receiver)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Respond for Receiver {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        if Webhook::new(&self.secret).unwrap().verify(&request.body, &request.headers).is_err() {
            *self.refused.lock().unwrap() += 1;
            return ResponseTemplate::new(400);
        }
        let id = request.headers.get("webhook-id").unwrap().to_str().unwrap().to_owned();
        let body = serde_json::from_slice(&request.body).unwrap();
        self.seen.lock().unwrap().push(Seen { id, body, raw: request.body.clone(), headers: request.headers.clone() });
        self.answers.lock().unwrap().pop_front().unwrap_or_else(|| ResponseTemplate::new(204))
    }
}

const OPEN: UrlPolicy = UrlPolicy { allow_http: true, allow_private_addresses: true, allow_exchanges: true };

fn config(schedule: &[f64]) -> EventSenderConfig {
    EventSenderConfig {
        worker_id: "events-1".into(),
        batch_size: 8,
        max_in_flight: 8,
        per_endpoint: 4,
        lease: Duration::from_secs(30),
        poll_interval: Duration::from_millis(20),
        rules: Rules {
            schedule: schedule.iter().copied().map(Duration::from_secs_f64).collect(),
            retry_after_cap: Duration::from_secs(3600),
            disable_after: Duration::from_secs(5 * 86_400),
        },
    }
}

/// Runs an event sender, publishing to the tests' RabbitMQ node, until `done` holds, or fails the
/// test after a minute.
async fn deliver_until<F, Fut>(pool: &PgPool, policy: UrlPolicy, config: EventSenderConfig, done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let broker = std::env::var(rabbitmq::TEST_URL_VARIABLE).ok().map(SecretString::from);
    deliver_with(pool, policy, Publisher::new(broker, Duration::from_secs(5)), config, done).await;
}

/// Runs an event sender publishing through `publisher` until `done` holds, or fails the test after
/// a minute.
async fn deliver_with<F, Fut>(
    pool: &PgPool,
    policy: UrlPolicy,
    publisher: Publisher,
    config: EventSenderConfig,
    mut done: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let shutdown = CancellationToken::new();
    let sender = Sender::new(Duration::from_secs(5), policy).unwrap();
    let sender = EventSender::new(Arc::new(Connections::like(pool)), sender, publisher, config);
    let running = tokio::spawn(sender.run(shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "the deliveries did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    running.await.unwrap();
}

async fn endpoint(
    pool: &PgPool,
    tenant_id: oncepay_domain::ids::TenantId,
    url: &str,
    secret: &str,
    types: &[&str],
) -> Uuid {
    let types: Vec<String> = types.iter().map(|t| (*t).to_owned()).collect();
    let new = NewEndpoint { url, description: "", event_types: &types, secret };
    let mut conn = pool.acquire().await.unwrap();
    merchant_endpoints::create(&mut conn, tenant_id, &new).await.unwrap().endpoint_id
}

fn change(accepted: Accepted, from: PaymentStatus, transition: Transition, actor: &'static str) -> Change<'static> {
    Change {
        tenant_id: accepted.tenant_id,
        payment_id: accepted.payment_id,
        from,
        transition,
        actor,
        reason: "test",
        detail: None,
    }
}

fn charged() -> Settlement {
    Settlement::Succeeded {
        charge_id: format!("ch_{}", Uuid::now_v7().simple()),
        amount: Amount::new(500).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        charged_at: OffsetDateTime::now_utc(),
    }
}

/// Has a worker claim every pending payment (no provider is called).
async fn claim(pool: &PgPool) {
    support::drainer(pool, &support::refusing_url(), support::config("w")).claim(100).await.unwrap();
}

/// Claims the payment and settles it as charged.
async fn succeed(pool: &PgPool, accepted: Accepted) {
    claim(pool).await;
    let mut conn = pool.acquire().await.unwrap();
    let settled = transitions::settle(
        &mut conn,
        &change(accepted, PaymentStatus::Processing, Transition::Charged, "worker:w"),
        &charged(),
    )
    .await
    .unwrap();
    assert!(matches!(settled, transitions::Recorded::Moved(_)));
}

/// Claims the payment and moves it to `dead_lettered` as the reconciler does (`unknown`, then
/// exhausted), which writes its `payment.dead_lettered` event.
async fn dead_letter(pool: &PgPool, accepted: Accepted) {
    claim(pool).await;
    let mut conn = pool.acquire().await.unwrap();
    for (from, transition) in
        [(PaymentStatus::Processing, Transition::Uncertain), (PaymentStatus::Unknown, Transition::Exhausted)]
    {
        transitions::apply(&mut conn, &change(accepted, from, transition, "reconciler:r")).await.unwrap();
    }
}

async fn states(pool: &PgPool) -> Vec<(String, String, i32)> {
    sqlx::query_as(
        "SELECT e.type, d.state, d.attempts FROM merchant_deliveries d
         JOIN merchant_events e USING (tenant_id, event_id) ORDER BY e.event_order, d.endpoint_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn all_settled(pool: &PgPool) -> bool {
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM merchant_deliveries WHERE state = 'pending'")
        .fetch_one(pool)
        .await
        .unwrap();
    pending == 0
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_that_succeeds_is_delivered_signed_with_its_sequence_and_previous_status(pool: PgPool) {
    let (server, receiver) = Receiver::start(vec![]).await;
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, &server.uri(), &receiver.secret, &[]).await;
    // An endpoint for refunds only hears nothing of a payment.
    let (other_server, other) = Receiver::start(vec![]).await;
    endpoint(&pool, tenant, &other_server.uri(), &other.secret, &["refund.succeeded"]).await;
    let accepted = support::accept(&pool, tenant, 500).await;
    succeed(&pool, accepted).await;

    deliver_until(&pool, OPEN, config(&[0.05]), || all_settled(&pool)).await;

    let seen = receiver.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(*receiver.refused.lock().unwrap(), 0);
    let body = &seen[0].body;
    assert_eq!(body["type"], "payment.succeeded");
    assert_eq!(body["data"]["id"], accepted.payment_id.to_string());
    assert_eq!(body["data"]["status"], "succeeded");
    assert!(body["data"]["provider_charge_id"].as_str().is_some_and(|id| id.starts_with("ch_")), "{body}");
    assert_eq!(body["data"]["previous_status"], "processing");
    // Accepted, claimed, charged: the third change of its history.
    assert_eq!(body["data"]["sequence"], 3);
    assert!(body["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{body}");
    let event_id: Uuid = sqlx::query_scalar("SELECT event_id FROM merchant_events").fetch_one(&pool).await.unwrap();
    assert_eq!(seen[0].id, event_id.to_string(), "the webhook-id is the event's id");
    assert_eq!(states(&pool).await, [("payment.succeeded".to_owned(), "delivered".to_owned(), 1)]);
    assert!(other.seen().is_empty());
    let (status, worker): (Option<i32>, String) =
        sqlx::query_as("SELECT status, worker FROM merchant_delivery_all_attempts").fetch_one(&pool).await.unwrap();
    assert_eq!((status, worker.as_str()), (Some(204), "events-1"));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_replayed_delivery_keeps_the_attempt_that_delivered_it_before(pool: PgPool) {
    let (server, receiver) = Receiver::start(vec![]).await;
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, &server.uri(), &receiver.secret, &[]).await;
    let accepted = support::accept(&pool, tenant, 500).await;
    succeed(&pool, accepted).await;
    deliver_until(&pool, OPEN, config(&[0.05]), || all_settled(&pool)).await;
    // Each attempt's status and worker: those with a row of their own, and all of them.
    const OWN_ROWS: &str = "SELECT status, worker FROM merchant_delivery_attempts ORDER BY attempted_at";
    const ALL: &str = "SELECT status, worker FROM merchant_delivery_all_attempts ORDER BY attempted_at";
    let attempts = |sql: &'static str| {
        let pool = pool.clone();
        async move { sqlx::query_as::<_, (Option<i32>, String)>(sql).fetch_all(&pool).await.unwrap() }
    };
    // The attempt that delivered is kept in the delivery's row, not in a row of its own.
    assert_eq!(attempts(OWN_ROWS).await, []);
    assert_eq!(attempts(ALL).await, [(Some(204), "events-1".to_owned())]);

    let event_id: Uuid = sqlx::query_scalar("SELECT event_id FROM merchant_events").fetch_one(&pool).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let replayed = merchant_deliveries::replay_event(&mut conn, tenant, event_id, None).await.unwrap();
    drop(conn);
    assert_eq!(replayed.map(|r| r.deliveries), Some(1));
    deliver_until(&pool, OPEN, config(&[0.05]), || all_settled(&pool)).await;

    let seen = receiver.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].id, seen[1].id, "a replay keeps the webhook-id");
    let both = vec![(Some(204), "events-1".to_owned()); 2];
    assert_eq!(attempts(ALL).await, both, "the first delivery's attempt is kept");
    assert_eq!(attempts(OWN_ROWS).await, both[..1]);
    assert_eq!(states(&pool).await, [("payment.succeeded".to_owned(), "delivered".to_owned(), 1)]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_change_that_rolls_back_writes_no_event(pool: PgPool) {
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, "https://merchant.example/hooks", &WebhookSecret::generate(), &[]).await;
    let accepted = support::accept(&pool, tenant, 500).await;
    claim(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    transitions::settle(
        &mut tx,
        &change(accepted, PaymentStatus::Processing, Transition::Charged, "worker:w"),
        &charged(),
    )
    .await
    .unwrap();
    let inside: i64 = sqlx::query_scalar("SELECT count(*) FROM merchant_deliveries").fetch_one(&mut *tx).await.unwrap();
    assert_eq!(inside, 1, "the change queued its event in its own transaction");
    tx.rollback().await.unwrap();

    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM merchant_events").fetch_one(&pool).await.unwrap();
    let deliveries: i64 =
        sqlx::query_scalar("SELECT count(*) FROM merchant_deliveries").fetch_one(&pool).await.unwrap();
    assert_eq!((events, deliveries), (0, 0));
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Processing);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payments_events_reach_an_endpoint_in_order_even_when_the_first_is_retried(pool: PgPool) {
    // The first attempt of the first event fails; the second event, due at once, must wait for it.
    let (server, receiver) = Receiver::start(vec![ResponseTemplate::new(500)]).await;
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, &server.uri(), &receiver.secret, &[]).await;
    let accepted = support::accept(&pool, tenant, 500).await;
    dead_letter(&pool, accepted).await;
    let mut conn = pool.acquire().await.unwrap();
    transitions::settle(
        &mut conn,
        &change(accepted, PaymentStatus::DeadLettered, Transition::OperatorSucceeded, "operator:ana"),
        &charged(),
    )
    .await
    .unwrap();
    // Another payment's event is not held up by the first payment's retry.
    let other = support::accept(&pool, tenant, 700).await;
    succeed(&pool, other).await;

    deliver_until(&pool, OPEN, config(&[0.3]), || all_settled(&pool)).await;

    let seen: Vec<(String, String, i64)> = receiver
        .seen()
        .iter()
        .map(|s| {
            let data = &s.body["data"];
            (
                s.body["type"].as_str().unwrap().to_owned(),
                data["id"].as_str().unwrap().to_owned(),
                data["sequence"].as_i64().unwrap(),
            )
        })
        .collect();
    let first = accepted.payment_id.to_string();
    let of_first: Vec<_> = seen.iter().filter(|(_, id, _)| *id == first).map(|(t, _, n)| (t.as_str(), *n)).collect();
    assert_eq!(of_first, [("payment.dead_lettered", 4), ("payment.dead_lettered", 4), ("payment.resolved", 5)]);
    let other_place = seen.iter().position(|(_, id, _)| *id == other.payment_id.to_string()).unwrap();
    assert!(other_place < 2, "the other payment waited for the first one's retry: {seen:?}");
    assert_eq!(
        states(&pool).await,
        [
            ("payment.dead_lettered".to_owned(), "delivered".to_owned(), 2),
            ("payment.resolved".to_owned(), "delivered".to_owned(), 1),
            ("payment.succeeded".to_owned(), "delivered".to_owned(), 1),
        ]
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_delivery_whose_schedule_is_spent_is_dead_lettered_with_every_attempt(pool: PgPool) {
    let answers = vec![
        ResponseTemplate::new(500).set_body_string("boom"),
        ResponseTemplate::new(302).insert_header("location", "https://elsewhere.example/"),
        ResponseTemplate::new(429).insert_header("retry-after", "0"),
    ];
    let (server, receiver) = Receiver::start(answers).await;
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, &server.uri(), &receiver.secret, &[]).await;
    succeed(&pool, support::accept(&pool, tenant, 500).await).await;

    deliver_until(&pool, OPEN, config(&[0.05, 0.05]), || all_settled(&pool)).await;

    assert_eq!(states(&pool).await, [("payment.succeeded".to_owned(), "dead_lettered".to_owned(), 3)]);
    let attempts: Vec<(Option<i32>, String)> =
        sqlx::query_as("SELECT status, response FROM merchant_delivery_all_attempts ORDER BY attempted_at")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(attempts, [(Some(500), "boom".to_owned()), (Some(302), String::new()), (Some(429), String::new())]);
    assert_eq!(receiver.seen().len(), 3, "the redirect was not followed");
    let (enabled, failing): (bool, bool) =
        sqlx::query_as("SELECT enabled, failing_since IS NOT NULL FROM merchant_endpoints")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((enabled, failing), (true, true), "a failing endpoint stays enabled for days");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_endpoint_that_answers_410_is_disabled_and_the_tenants_other_endpoints_hear_of_it(pool: PgPool) {
    let (gone_server, gone) = Receiver::start(vec![ResponseTemplate::new(410)]).await;
    let (server, receiver) = Receiver::start(vec![]).await;
    let tenant = support::tenant(&pool).await;
    let gone_id = endpoint(&pool, tenant, &gone_server.uri(), &gone.secret, &["payment.succeeded"]).await;
    endpoint(&pool, tenant, &server.uri(), &receiver.secret, &["endpoint.disabled"]).await;
    succeed(&pool, support::accept(&pool, tenant, 500).await).await;

    deliver_until(&pool, OPEN, config(&[0.05]), || async {
        receiver.seen().iter().any(|s| s.body["type"] == "endpoint.disabled")
    })
    .await;

    let (enabled, reason): (bool, Option<String>) =
        sqlx::query_as("SELECT enabled, disabled_reason FROM merchant_endpoints WHERE endpoint_id = $1")
            .bind(gone_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((enabled, reason.as_deref()), (false, Some("gone")));
    let told = receiver.seen();
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].body["data"]["id"], gone_id.to_string());
    assert_eq!(told[0].body["data"]["disabled_reason"], "gone");
    assert_eq!(gone.seen().len(), 1, "nothing more goes to a disabled endpoint");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_endpoint_at_a_private_address_is_never_connected_to(pool: PgPool) {
    let (server, receiver) = Receiver::start(vec![]).await;
    let tenant = support::tenant(&pool).await;
    // `localhost` resolves to loopback: the name is allowed when saved, its address is not.
    let by_name = server.uri().replace("127.0.0.1", "localhost");
    endpoint(&pool, tenant, &by_name, &receiver.secret, &[]).await;
    endpoint(&pool, tenant, &server.uri(), &receiver.secret, &[]).await;
    succeed(&pool, support::accept(&pool, tenant, 500).await).await;
    let strict = UrlPolicy { allow_http: true, allow_private_addresses: false, allow_exchanges: false };

    deliver_until(&pool, strict, config(&[]), || all_settled(&pool)).await;

    assert!(receiver.seen().is_empty());
    let errors: Vec<(Option<i32>, Option<String>)> =
        sqlx::query_as("SELECT status, error FROM merchant_delivery_all_attempts ORDER BY attempted_at")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(errors.len(), 2);
    for (status, error) in errors {
        assert_eq!(status, None);
        let error = error.unwrap();
        assert!(error.contains("does not deliver to"), "{error}");
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_endpoint_at_its_cap_gets_its_next_delivery_when_one_ends_not_at_the_next_poll(pool: PgPool) {
    let (server, receiver) = Receiver::start(vec![]).await;
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, &server.uri(), &receiver.secret, &[]).await;
    for amount in [500, 600, 700] {
        succeed(&pool, support::accept(&pool, tenant, amount).await).await;
    }
    // One delivery at a time to the endpoint, and no poll after the first within the test's minute:
    // only the end of each delivery can start the next.
    let config = EventSenderConfig { per_endpoint: 1, poll_interval: Duration::from_secs(3600), ..config(&[]) };

    deliver_until(&pool, OPEN, config, || all_settled(&pool)).await;

    assert_eq!(receiver.seen().len(), 3);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_answer_whose_body_holds_a_nul_byte_is_recorded(pool: PgPool) {
    // PostgreSQL's text cannot hold NUL: kept as it came, the attempt could never be recorded, and
    // the delivery would be sent again after every lease, never delivered nor dead-lettered.
    let answer = ResponseTemplate::new(200).set_body_bytes(b"ok\0done".to_vec());
    let (server, receiver) = Receiver::start(vec![answer]).await;
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, &server.uri(), &receiver.secret, &[]).await;
    succeed(&pool, support::accept(&pool, tenant, 500).await).await;

    deliver_until(&pool, OPEN, config(&[]), || all_settled(&pool)).await;

    assert_eq!(receiver.seen().len(), 1, "the first answer was recorded: nothing was sent again");
    assert_eq!(states(&pool).await, [("payment.succeeded".to_owned(), "delivered".to_owned(), 1)]);
    let response: String =
        sqlx::query_scalar("SELECT response FROM merchant_delivery_all_attempts").fetch_one(&pool).await.unwrap();
    assert_eq!(response, "ok\u{fffd}done");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn during_a_rotation_both_secrets_sign(pool: PgPool) {
    let (server, receiver) = Receiver::start(vec![]).await;
    let tenant = support::tenant(&pool).await;
    let old = WebhookSecret::generate();
    let id = endpoint(&pool, tenant, &server.uri(), &old, &[]).await;
    let mut conn = pool.acquire().await.unwrap();
    // The receiver knows only the new secret.
    merchant_endpoints::rotate(&mut conn, tenant, id, &receiver.secret, Duration::from_secs(3600))
        .await
        .unwrap()
        .unwrap();
    succeed(&pool, support::accept(&pool, tenant, 500).await).await;

    deliver_until(&pool, OPEN, config(&[]), || all_settled(&pool)).await;

    let seen = receiver.seen();
    assert_eq!(seen.len(), 1, "the new secret verifies");
    assert!(Webhook::new(&old).unwrap().verify(&seen[0].raw, &seen[0].headers).is_ok(), "the old secret verifies too");
    let signatures = seen[0].headers.get("webhook-signature").unwrap().to_str().unwrap();
    assert_eq!(signatures.split(' ').count(), 2, "{signatures}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_recording_after_the_lease_was_taken_over_writes_nothing(pool: PgPool) {
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, "https://merchant.example/hooks", &WebhookSecret::generate(), &[]).await;
    succeed(&pool, support::accept(&pool, tenant, 500).await).await;
    let mut conn = pool.acquire().await.unwrap();
    let first =
        merchant_deliveries::claim(&mut conn, tenant, "w1", 8, 4, Duration::from_secs(30)).await.unwrap().remove(0);
    assert!(
        merchant_deliveries::claim(&mut conn, tenant, "w2", 8, 4, Duration::from_secs(30)).await.unwrap().is_empty()
    );
    sqlx::query("UPDATE merchant_deliveries SET locked_until = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let second =
        merchant_deliveries::claim(&mut conn, tenant, "w2", 8, 4, Duration::from_secs(30)).await.unwrap().remove(0);
    assert_eq!(second.fencing_token, first.fencing_token + 1);

    let late = merchant_deliveries::record(&mut conn, "w1", &[delivered(first)]).await.unwrap();
    assert_eq!(late, [Recording::LeaseLost]);
    let attempts: i64 =
        sqlx::query_scalar("SELECT count(*) FROM merchant_delivery_all_attempts").fetch_one(&pool).await.unwrap();
    assert_eq!(attempts, 0);
    let current = merchant_deliveries::record(&mut conn, "w2", &[delivered(second)]).await.unwrap();
    assert_eq!(current, [Recording::Recorded { disabled: false }]);
    assert_eq!(states(&pool).await, [("payment.succeeded".to_owned(), "delivered".to_owned(), 1)]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_batch_records_each_attempt_under_its_own_claim(pool: PgPool) {
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, "https://merchant.example/hooks", &WebhookSecret::generate(), &[]).await;
    succeed(&pool, support::accept(&pool, tenant, 500).await).await;
    succeed(&pool, support::accept(&pool, tenant, 700).await).await;
    let mut conn = pool.acquire().await.unwrap();
    let mut held = merchant_deliveries::claim(&mut conn, tenant, "w1", 8, 4, Duration::from_secs(30)).await.unwrap();
    assert_eq!(held.len(), 2);
    let (taken_over, kept) = (held.remove(0), held.remove(0));
    // Another worker takes over the first delivery's lease.
    sqlx::query("UPDATE merchant_deliveries SET locked_until = now() - interval '1 second' WHERE event_id = $1")
        .bind(taken_over.event_id)
        .execute(&pool)
        .await
        .unwrap();
    let mut again = merchant_deliveries::claim(&mut conn, tenant, "w2", 8, 4, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.remove(0).event_id, taken_over.event_id);

    let recorded =
        merchant_deliveries::record(&mut conn, "w1", &[delivered(taken_over), delivered(kept)]).await.unwrap();

    assert_eq!(recorded, [Recording::LeaseLost, Recording::Recorded { disabled: false }]);
    let attempts: Vec<(String, i32)> =
        sqlx::query_as("SELECT worker, status FROM merchant_delivery_all_attempts").fetch_all(&pool).await.unwrap();
    assert_eq!(attempts, [("w1".to_owned(), 204)], "only the attempt still under its claim is kept");
    let mut states = states(&pool).await;
    states.sort();
    assert_eq!(
        states,
        [
            ("payment.succeeded".to_owned(), "delivered".to_owned(), 1),
            ("payment.succeeded".to_owned(), "pending".to_owned(), 0)
        ]
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_endpoints_cap_holds_across_workers(pool: PgPool) {
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, "https://merchant.example/hooks", &WebhookSecret::generate(), &[]).await;
    for amount in [500, 600, 700, 800] {
        succeed(&pool, support::accept(&pool, tenant, amount).await).await;
    }
    let mut conn = pool.acquire().await.unwrap();
    let lease = Duration::from_secs(30);

    let mut first = merchant_deliveries::claim(&mut conn, tenant, "w1", 8, 2, lease).await.unwrap();
    assert_eq!(first.len(), 2, "a cap of 2 takes 2 of the 4 due");
    assert!(first.iter().all(|d| d.more_due), "each says the endpoint had more due than room");
    let none = merchant_deliveries::claim(&mut conn, tenant, "w2", 8, 2, lease).await.unwrap();
    assert!(none.is_empty(), "another worker finds the endpoint at its cap: {none:?}");

    let recorded = merchant_deliveries::record(&mut conn, "w1", &[delivered(first.remove(0))]).await.unwrap();
    assert_eq!(recorded, [Recording::Recorded { disabled: false }]);
    let next = merchant_deliveries::claim(&mut conn, tenant, "w2", 8, 2, lease).await.unwrap();
    assert_eq!(next.len(), 1, "one delivery ended, so one more may start: {next:?}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_claim_takes_only_its_tenants_deliveries(pool: PgPool) {
    let (acme, globex) = (support::tenant(&pool).await, support::tenant(&pool).await);
    for tenant in [acme, globex] {
        endpoint(&pool, tenant, "https://merchant.example/hooks", &WebhookSecret::generate(), &[]).await;
        succeed(&pool, support::accept(&pool, tenant, 500).await).await;
    }
    let quiet = support::tenant(&pool).await;
    endpoint(&pool, quiet, "https://quiet.example/hooks", &WebhookSecret::generate(), &[]).await;
    let mut conn = pool.acquire().await.unwrap();

    let mut due = merchant_deliveries::due_tenants(&mut conn).await.unwrap();
    let claimed = merchant_deliveries::claim(&mut conn, acme, "w1", 8, 4, Duration::from_secs(30)).await.unwrap();

    due.sort_unstable();
    let mut expected = vec![acme, globex];
    expected.sort_unstable();
    assert_eq!(due, expected, "a tenant whose endpoint has nothing due is not named");
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed[0].tenant_id, acme);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn one_tenants_backlog_leaves_room_in_each_claim_for_another_tenant(pool: PgPool) {
    let (server, receiver) = Receiver::start(vec![]).await;
    let busy = support::tenant(&pool).await;
    endpoint(&pool, busy, &server.uri(), &receiver.secret, &[]).await;
    for amount in [500, 600, 700, 800, 900, 1000] {
        succeed(&pool, support::accept(&pool, busy, amount).await).await;
    }
    // Written after the busy tenant's six: the oldest due first would send it last.
    let other = support::tenant(&pool).await;
    endpoint(&pool, other, &server.uri(), &receiver.secret, &[]).await;
    succeed(&pool, support::accept(&pool, other, 1100).await).await;
    // Claims of two: half of the sender's slots are for the drainer's hand-offs.
    let two_at_a_time = EventSenderConfig { batch_size: 2, max_in_flight: 4, ..config(&[0.05]) };

    deliver_until(&pool, OPEN, two_at_a_time, || all_settled(&pool)).await;

    let first_two: Vec<Uuid> =
        sqlx::query_scalar("SELECT tenant_id FROM merchant_delivery_all_attempts ORDER BY attempted_at LIMIT 2")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(first_two.contains(&other.as_uuid()), "the first claim took one of each tenant's: {first_two:?}");
    assert_eq!(receiver.seen().len(), 7);
}

/// Claims the payment and settles it as charged, as the worker records a settlement, queuing its
/// event's deliveries under `lease`; the deliveries leased.
async fn succeed_leasing(pool: &PgPool, accepted: Accepted, lease: &WriterLease<'_>) -> Vec<ClaimedDelivery> {
    claim(pool).await;
    let mut tx = pool.begin().await.unwrap();
    let change = change(accepted, PaymentStatus::Processing, Transition::Charged, "worker:w");
    let settled =
        transitions::settle_all_deferring_wakeup(&mut tx, &[(change, &charged())], Some(lease)).await.unwrap();
    tx.commit().await.unwrap();
    assert!(matches!(settled.recorded[..], [transitions::Recorded::Moved(_)]));
    settled.leased
}

/// `locked_by` of every delivery, oldest event first.
async fn lease_holders(pool: &PgPool) -> Vec<Option<String>> {
    sqlx::query_scalar(
        "SELECT d.locked_by FROM merchant_deliveries d
         JOIN merchant_events e USING (tenant_id, event_id) ORDER BY e.event_order, d.endpoint_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

const LEASE: WriterLease<'static> =
    WriterLease { worker: "events-1", lease: Duration::from_secs(30), per_endpoint: 4, limit: 8 };

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_settlement_queues_its_events_delivery_leased_to_the_worker_and_no_claim_takes_it(pool: PgPool) {
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, "https://merchant.example/hooks", &WebhookSecret::generate(), &[]).await;
    let accepted = support::accept(&pool, tenant, 500).await;

    let mut leased = succeed_leasing(&pool, accepted, &LEASE).await;

    assert_eq!(leased.len(), 1, "{leased:?}");
    let delivery = leased.remove(0);
    assert_eq!((delivery.fencing_token, delivery.attempts), (1, 0));
    assert_eq!(delivery.event_type, "payment.succeeded");
    assert_eq!(delivery.data["id"], accepted.payment_id.to_string());
    assert_eq!(delivery.url, "https://merchant.example/hooks");
    assert_eq!(lease_holders(&pool).await, [Some("events-1".to_owned())]);
    let mut conn = pool.acquire().await.unwrap();
    let claimed = merchant_deliveries::claim(&mut conn, tenant, "w2", 8, 4, Duration::from_secs(30)).await.unwrap();
    assert!(claimed.is_empty(), "another worker claimed a delivery leased to the writer: {claimed:?}");
    let recorded = merchant_deliveries::record(&mut conn, "events-1", &[delivered(delivery)]).await.unwrap();
    assert_eq!(recorded, [Recording::Recorded { disabled: false }]);
    assert_eq!(states(&pool).await, [("payment.succeeded".to_owned(), "delivered".to_owned(), 1)]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_event_behind_a_pending_one_of_its_payment_is_queued_for_a_claim_not_leased(pool: PgPool) {
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, "https://merchant.example/hooks", &WebhookSecret::generate(), &[]).await;
    let accepted = support::accept(&pool, tenant, 500).await;
    // `payment.dead_lettered`, still pending for the endpoint.
    dead_letter(&pool, accepted).await;
    let mut conn = pool.acquire().await.unwrap();
    let resolved = change(accepted, PaymentStatus::DeadLettered, Transition::OperatorSucceeded, "operator:ana");

    let settled =
        transitions::settle_all_deferring_wakeup(&mut conn, &[(resolved, &charged())], Some(&LEASE)).await.unwrap();

    assert!(settled.leased.is_empty(), "sent before the payment's earlier event: {:?}", settled.leased);
    assert_eq!(lease_holders(&pool).await, [None, None]);
    // Another payment's event, written the same way, is leased: only the order kept this one back.
    let other = support::accept(&pool, tenant, 700).await;
    assert_eq!(succeed_leasing(&pool, other, &LEASE).await.len(), 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_settlement_leases_no_more_than_its_limit_nor_past_an_endpoints_cap(pool: PgPool) {
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, "https://first.example/hooks", &WebhookSecret::generate(), &[]).await;
    endpoint(&pool, tenant, "https://second.example/hooks", &WebhookSecret::generate(), &[]).await;

    let one = WriterLease { limit: 1, ..LEASE };
    let leased = succeed_leasing(&pool, support::accept(&pool, tenant, 500).await, &one).await;
    assert_eq!(leased.len(), 1, "a limit of one, two endpoints: {leased:?}");

    // The endpoint that got that lease is at a cap of one; the other is not.
    let capped = WriterLease { per_endpoint: 1, ..LEASE };
    let leased = succeed_leasing(&pool, support::accept(&pool, tenant, 600).await, &capped).await;
    assert_eq!(leased.len(), 1, "{leased:?}");
    let leased_per_endpoint: Vec<i64> =
        sqlx::query_scalar("SELECT count(*) FROM merchant_deliveries WHERE locked_by IS NOT NULL GROUP BY endpoint_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(leased_per_endpoint, [1, 1], "one leased to each endpoint");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_the_worker_settles_is_handed_to_its_sender_without_waiting_for_a_claim(pool: PgPool) {
    let provider = MockServer::start().await;
    support::Charges::new().mount(&provider).await;
    let (server, receiver) = Receiver::start(vec![]).await;
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, &server.uri(), &receiver.secret, &[]).await;
    let accepted = support::accept(&pool, tenant, 500).await;
    // No poll within the test's minute, and the delivery is leased to the worker when it is
    // queued: no claim can take it, only the hand-off.
    let config = EventSenderConfig { poll_interval: Duration::from_secs(3600), ..config(&[]) };
    let sender = EventSender::new(
        Arc::new(Connections::like(&pool)),
        Sender::new(Duration::from_secs(5), OPEN).unwrap(),
        Publisher::new(None, Duration::from_secs(5)),
        config,
    );
    let http = HttpProvider::new(&support::provider_settings(&provider.uri())).unwrap();
    let drainer = Drainer::handing_events_to(pool.clone(), http, support::config("events-1"), &sender);

    let counts = drainer.run_once().await.unwrap();

    assert_eq!(counts.succeeded, 1);
    assert_eq!(lease_holders(&pool).await, [Some("events-1".to_owned())]);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(sender.run(shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !all_settled(&pool).await {
        assert!(tokio::time::Instant::now() < deadline, "the handed delivery was not sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    running.await.unwrap();
    let seen = receiver.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body["data"]["id"], accepted.payment_id.to_string());
    assert_eq!(states(&pool).await, [("payment.succeeded".to_owned(), "delivered".to_owned(), 1)]);
}

/// `claimed`, answered 204 just now.
fn delivered(claimed: ClaimedDelivery) -> Record {
    let attempt =
        Attempt { attempted_at: OffsetDateTime::now_utc(), status: Some(204), response: String::new(), error: None };
    Record { claimed, attempt, next: Next::Delivered, health: Health::Took }
}

/// A merchant's queue on the tests' RabbitMQ node, bound to an exchange of its own.
struct MerchantQueue {
    exchange: String,
    queue: String,
    channel: lapin::Channel,
    _connection: Connection,
}

impl MerchantQueue {
    /// The next message in the queue, if there is one.
    async fn get(&self) -> Option<lapin::message::Delivery> {
        let options = BasicGetOptions { no_ack: true };
        self.channel.basic_get(self.queue.as_str().into(), options).await.unwrap().map(|message| message.delivery)
    }
}

/// A queue bound to a new exchange `merchant.…` with `binding`, as a merchant makes it.
async fn bound_queue(binding: &str) -> MerchantQueue {
    let connection = Connection::connect(&rabbitmq::test_url(), ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let exchange = format!("merchant.{}", Uuid::now_v7().simple());
    let durable = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
    channel
        .exchange_declare(exchange.as_str().into(), ExchangeKind::Topic, durable, FieldTable::default())
        .await
        .unwrap();
    let exclusive = QueueDeclareOptions { exclusive: true, ..QueueDeclareOptions::default() };
    let queue = channel.queue_declare("".into(), exclusive, FieldTable::default()).await.unwrap().name().to_string();
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            binding.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    MerchantQueue { exchange, queue, channel, _connection: connection }
}

async fn tenant_name(pool: &PgPool, tenant: oncepay_domain::ids::TenantId) -> String {
    sqlx::query_scalar("SELECT name FROM tenants WHERE tenant_id = $1")
        .bind(tenant.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The error of each attempt, oldest first.
async fn attempt_errors(pool: &PgPool) -> Vec<(Option<i32>, String, Option<String>)> {
    sqlx::query_as("SELECT status, response, error FROM merchant_delivery_all_attempts ORDER BY attempted_at")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_exchange_gets_each_event_as_a_signed_persistent_message_routed_by_tenant_and_type(pool: PgPool) {
    let tenant = support::tenant(&pool).await;
    let name = tenant_name(&pool, tenant).await;
    let merchant = bound_queue(&format!("{name}.payment.*")).await;
    let secret = WebhookSecret::generate();
    endpoint(&pool, tenant, &format!("rabbitmq:{}", merchant.exchange), &secret, &[]).await;
    let accepted = support::accept(&pool, tenant, 500).await;
    succeed(&pool, accepted).await;

    deliver_until(&pool, OPEN, config(&[0.05]), || all_settled(&pool)).await;

    let delivery = merchant.get().await.expect("the queue got the event");
    assert_eq!(delivery.routing_key.as_str(), format!("{name}.payment.succeeded"));
    let properties = &delivery.properties;
    assert_eq!(properties.delivery_mode(), &Some(2), "persistent");
    assert_eq!(properties.content_type().as_ref().map(|t| t.as_str()), Some("application/json"));
    let event_id: Uuid = sqlx::query_scalar("SELECT event_id FROM merchant_events").fetch_one(&pool).await.unwrap();
    assert_eq!(properties.message_id().as_ref().map(|id| id.as_str().to_owned()), Some(event_id.to_string()));
    // The headers of an HTTP delivery, verified by the reference implementation as a receiver would.
    let mut headers = http::HeaderMap::new();
    for (name, value) in properties.headers().as_ref().unwrap().inner() {
        let AMQPValue::LongString(value) = value else { panic!("{name} is not a string") };
        headers.insert(
            http::HeaderName::from_bytes(name.as_str().as_bytes()).unwrap(),
            http::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
        );
    }
    Webhook::new(&secret).unwrap().verify(&delivery.data, &headers).unwrap();
    assert_eq!(headers["webhook-id"], event_id.to_string());
    let body: Value = serde_json::from_slice(&delivery.data).unwrap();
    assert_eq!(body["type"], "payment.succeeded");
    assert_eq!(body["data"]["sequence"], 3);
    assert_eq!(states(&pool).await, [("payment.succeeded".to_owned(), "delivered".to_owned(), 1)]);
    assert_eq!(attempt_errors(&pool).await, [(None, "confirmed by RabbitMQ".to_owned(), None)]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_message_no_queue_takes_is_a_failed_attempt_retried_then_dead_lettered(pool: PgPool) {
    let tenant = support::tenant(&pool).await;
    let name = tenant_name(&pool, tenant).await;
    // Bound to refunds only: a payment's event has nowhere to go.
    let merchant = bound_queue(&format!("{name}.refund.*")).await;
    endpoint(&pool, tenant, &format!("rabbitmq:{}", merchant.exchange), &WebhookSecret::generate(), &[]).await;
    let accepted = support::accept(&pool, tenant, 500).await;
    succeed(&pool, accepted).await;

    deliver_until(&pool, OPEN, config(&[0.05]), || all_settled(&pool)).await;

    assert_eq!(states(&pool).await, [("payment.succeeded".to_owned(), "dead_lettered".to_owned(), 2)]);
    let unroutable = format!("no queue bound to {} takes {name}.payment.succeeded", merchant.exchange);
    assert_eq!(attempt_errors(&pool).await, vec![(None, String::new(), Some(unroutable)); 2]);
    assert!(merchant.get().await.is_none());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_worker_without_a_broker_says_so_in_each_attempt_to_an_exchange(pool: PgPool) {
    let tenant = support::tenant(&pool).await;
    endpoint(&pool, tenant, "rabbitmq:merchant.orders", &WebhookSecret::generate(), &[]).await;
    let accepted = support::accept(&pool, tenant, 500).await;
    succeed(&pool, accepted).await;

    let publisher = Publisher::new(None, Duration::from_secs(5));
    deliver_with(&pool, OPEN, publisher, config(&[]), || all_settled(&pool)).await;

    assert_eq!(states(&pool).await, [("payment.succeeded".to_owned(), "dead_lettered".to_owned(), 1)]);
    let [(None, _, Some(error))] = &attempt_errors(&pool).await[..] else { panic!("one attempt, with an error") };
    assert!(error.contains("no events.broker_url"), "{error}");
}
