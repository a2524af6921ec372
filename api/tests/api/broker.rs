//! Payments from RabbitMQ: every outcome of a message, against a real node (`ONCEPAY_TEST_AMQP_URL`,
//! which `cargo xtask test` starts) and a real PostgreSQL. Each test has queues of its own, so the
//! tests share the node without seeing each other's messages.

use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicRejectOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use oncepay_api::broker::rabbitmq::{KEY_HEADER, PROBLEM_HEADER, REASON_HEADER};
use oncepay_api::{Application, Settings};
use oncepay_devkit::pg::{Cluster, Durability};
use oncepay_devkit::rabbitmq;
use oncepay_devkit::wait::wait_until;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::ids::PaymentId;
use oncepay_domain::payment_request::PaymentRequest;
use oncepay_service::telemetry;
use oncepay_store::intake::{self, NewPayment};
use oncepay_store::{broker_queues, broker_users, db};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use time::OffsetDateTime;

use crate::helpers::{self, Rows, TestApp, body};

const ONE_PAYMENT: Rows = Rows { payments: 1, keys: 1, outbox: 1, events: 1 };
const NOTHING: Rows = Rows { payments: 0, keys: 0, outbox: 0, events: 0 };

/// A producer on the tests' node, with queues named for one test.
struct Producer {
    channel: Channel,
    connection: Connection,
    /// The names the api is given (`[broker]`).
    queue: String,
    dead_letter_queue: String,
    /// A queue of the producer's own, for replies.
    replies: String,
}

impl Producer {
    /// A producer for queues named after `test`; the api declares them.
    async fn connect(test: &str) -> Self {
        let connection = Connection::connect(&rabbitmq::test_url(), ConnectionProperties::default()).await.unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let replies = channel
            .queue_declare(
                "".into(),
                QueueDeclareOptions { exclusive: true, ..QueueDeclareOptions::default() },
                FieldTable::default(),
            )
            .await
            .unwrap()
            .name()
            .to_string();
        Self {
            channel,
            connection,
            queue: format!("{test}.{suffix}"),
            dead_letter_queue: format!("{test}.{suffix}.dead-letters"),
            replies,
        }
    }

    /// `settings` with this producer's queues and the tests' node.
    fn configure(&self, settings: &mut Settings) {
        let broker = &mut settings.broker;
        broker.url = Some(rabbitmq::test_url().into());
        broker.queue.clone_from(&self.queue);
        broker.dead_letter_queue.clone_from(&self.dead_letter_queue);
        broker.delay_queue = format!("{}.delayed", self.queue);
        broker.dead_letter_exchange = format!("{}.dlx", self.queue);
        broker.delay_ms = 200;
        broker.sample_interval_ms = 100;
    }

    /// Publishes `body` as `user` (the administrator impersonates anyone), with `key`, asking for a
    /// reply correlated by `correlation_id`; waits for RabbitMQ's confirmation.
    async fn publish(&self, user: Option<&str>, key: Option<&str>, body: &[u8], correlation_id: &str) {
        self.publish_with(user, key, &[], body, correlation_id).await;
    }

    /// [`Producer::publish`], with `more` headers.
    async fn publish_with(
        &self,
        user: Option<&str>,
        key: Option<&str>,
        more: &[(&str, &str)],
        body: &[u8],
        correlation_id: &str,
    ) {
        let mut headers = FieldTable::default();
        for (name, value) in key.map(|key| (KEY_HEADER, key)).into_iter().chain(more.iter().copied()) {
            headers.insert(name.into(), AMQPValue::LongString(LongString::from(value)));
        }
        let mut properties = BasicProperties::default()
            .with_headers(headers)
            .with_reply_to(self.replies.as_str().into())
            .with_correlation_id(correlation_id.into())
            .with_delivery_mode(2);
        if let Some(user) = user {
            properties = properties.with_user_id(user.into());
        }
        self.publish_to(&self.queue, body, properties).await;
    }

    async fn publish_to(&self, queue: &str, body: &[u8], properties: BasicProperties) {
        rabbitmq::publish_confirmed(&self.channel, "", queue, body, properties).await.unwrap();
    }

    /// The next reply: its correlation id, whether it replays, and the payment it carries.
    async fn reply(&self) -> (String, bool, Value) {
        let message = self.next(&self.replies).await;
        let correlation_id = message.properties.correlation_id().as_ref().unwrap().to_string();
        let replayed = matches!(headers(&message.properties).get("oncepay-replayed"), Some(AMQPValue::Boolean(true)));
        (correlation_id, replayed, serde_json::from_slice(&message.data).unwrap())
    }

    /// The next dead-lettered message: its reason, its problem document and its body.
    async fn dead_letter(&self) -> (String, Value, Vec<u8>) {
        let message = self.next(&self.dead_letter_queue).await;
        let headers = headers(&message.properties);
        let text = |name: &str| match headers.get(name) {
            Some(AMQPValue::LongString(value)) => String::from_utf8(value.as_bytes().to_vec()).unwrap(),
            other => panic!("{name}: {other:?}"),
        };
        (text(REASON_HEADER), serde_json::from_str(&text(PROBLEM_HEADER)).unwrap(), message.data.clone())
    }

    /// Waits for the api to have declared the queues (its consumer does once it is connected).
    async fn declared(&self) {
        wait_until("the api to declare its queues", Duration::from_secs(30), || async {
            // A passive declaration of a queue that does not exist closes its channel: one each try.
            let channel = self.connection.create_channel().await.ok()?;
            let options = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
            channel.queue_declare(self.queue.as_str().into(), options, FieldTable::default()).await.ok().map(drop)
        })
        .await
        .unwrap();
    }

    /// How many messages `queue` holds, ready or not.
    async fn depth(&self, queue: &str) -> u32 {
        let options = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        self.channel.queue_declare(queue.into(), options, FieldTable::default()).await.unwrap().message_count()
    }

    /// Takes the next message of `queue`, waiting for one.
    async fn next(&self, queue: &str) -> lapin::message::BasicGetMessage {
        wait_until(&format!("a message in {queue}"), Duration::from_secs(30), || async {
            self.channel.basic_get(queue.into(), BasicGetOptions { no_ack: true }).await.unwrap()
        })
        .await
        .unwrap()
    }
}

fn headers(properties: &BasicProperties) -> std::collections::BTreeMap<ShortString, AMQPValue> {
    properties.headers().clone().unwrap_or_default().inner().clone()
}

/// The api, consuming the producer's queue, and the broker user `user` mapped to its tenant.
async fn app_with_broker(options: PgConnectOptions, producer: &Producer, user: &str) -> TestApp {
    app_with_broker_and(options, producer, user, |_| {}).await
}

/// [`app_with_broker`], with settings of the test's own.
async fn app_with_broker_and(
    options: PgConnectOptions,
    producer: &Producer,
    user: &str,
    more: impl FnOnce(&mut Settings),
) -> TestApp {
    let app = TestApp::spawn_with(options, |settings| {
        producer.configure(settings);
        more(settings);
    })
    .await;
    let mut conn = app.db.acquire().await.unwrap();
    broker_users::map(&mut conn, user, app.tenant.id).await.unwrap();
    producer.declared().await;
    app
}

/// A message to publish (its user, key and body) and the reason it is dead-lettered with.
type Case<'a> = (Option<&'a str>, Option<&'a str>, Vec<u8>, &'a str);

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_message_becomes_one_payment_and_its_redelivery_replays_it(_: PgPoolOptions, options: PgConnectOptions) {
    let producer = Producer::connect("new-key").await;
    let app = app_with_broker(options, &producer, "shop-1").await;

    producer.publish(Some("shop-1"), Some("order-1"), &bytes(&body()), "first").await;
    let (correlation_id, replayed, payment) = producer.reply().await;

    assert_eq!(correlation_id, "first");
    assert!(!replayed);
    assert_eq!(payment["status"], "pending");
    assert_eq!(payment["amount"], 1999);
    assert_eq!(app.rows().await, ONE_PAYMENT);
    // The producer publishes the same request again (no confirm came, say): the same payment.
    producer.publish(Some("shop-1"), Some("order-1"), &bytes(&body()), "again").await;
    let (correlation_id, replayed, again) = producer.reply().await;
    assert_eq!(correlation_id, "again");
    assert!(replayed);
    assert_eq!(again["id"], payment["id"]);
    assert_eq!(app.rows().await, ONE_PAYMENT);
    // A message and an HTTP request with one key and one body are one payment, seen by the status
    // route like any other.
    let retry = app.post_payment("order-1", &body()).send().await.unwrap();
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    assert_eq!(retry.json::<Value>().await.unwrap()["id"], payment["id"]);
    let status = app.get_payment(payment["id"].as_str().unwrap()).send().await.unwrap();
    assert_eq!(status.status(), StatusCode::OK);
    // A long poll on it is woken by its change, as on any payment.
    let poll = tokio::spawn(app.get_payment(payment["id"].as_str().unwrap()).header("Prefer", "wait=20").send());
    app.until_long_polls_waiting(1).await;
    let payment_id = payment["id"].as_str().unwrap().parse().unwrap();
    helpers::claim(&app.db, app.tenant.id, payment_id).await;
    let polled: Value = poll.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(polled["status"], "processing");
    assert_eq!(producer.depth(&producer.queue).await, 0, "every message acknowledged");
    assert_eq!(producer.depth(&producer.dead_letter_queue).await, 0);
    assert!(app.metrics().await.contains("oncepay_api_broker_messages_total{outcome=\"replayed\"} 1"));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_message_with_a_traceparent_continues_its_producers_trace(_: PgPoolOptions, options: PgConnectOptions) {
    // The message's span is at `info`: the default filter keeps it (and so its trace context).
    let _telemetry = telemetry::init("oncepay-api-tests", &helpers::settings().telemetry).unwrap();
    let producer = Producer::connect("traced").await;
    let app = app_with_broker(options, &producer, "shop-1").await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let producer_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace_id}-{producer_span}-01");

    let trace = [("traceparent", traceparent.as_str()), ("tracestate", "shop=1")];
    producer.publish_with(Some("shop-1"), Some("order-1"), &trace, &bytes(&body()), "traced").await;

    let (_, _, payment) = producer.reply().await;
    let payment_id: PaymentId = payment["id"].as_str().unwrap().parse().unwrap();
    app.assert_outbox_continues(payment_id, trace_id, producer_span).await;
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_same_key_with_another_body_is_dead_lettered_as_reused_and_changes_nothing(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let producer = Producer::connect("reused").await;
    let app = app_with_broker(options, &producer, "shop-1").await;
    producer.publish(Some("shop-1"), Some("order-1"), &bytes(&body()), "first").await;
    let (_, _, payment) = producer.reply().await;

    let other = json!({"amount": 5000, "currency": "EUR", "customer_id": "cus_42"});
    producer.publish(Some("shop-1"), Some("order-1"), &bytes(&other), "other").await;
    let (reason, problem, dead) = producer.dead_letter().await;

    assert_eq!(reason, "idempotency_key_reused");
    assert_eq!(problem["type"], "https://oncepay.dev/problems/idempotency-key-reused");
    assert_eq!(dead, bytes(&other), "the message as it was published");
    assert_eq!(app.rows().await, ONE_PAYMENT);
    let stored: i64 = sqlx::query_scalar("SELECT amount FROM payments").fetch_one(&app.db).await.unwrap();
    assert_eq!((stored, payment["amount"].as_i64()), (1999, Some(1999)));
    assert_eq!(producer.depth(&producer.queue).await, 0);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn messages_that_can_never_be_payments_are_dead_lettered_with_their_reason(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let producer = Producer::connect("invalid").await;
    let app = app_with_broker(options, &producer, "shop-1").await;
    let too_large =
        bytes(&json!({"amount": 1, "currency": "EUR", "customer_id": "c", "description": "x".repeat(70_000)}));
    // (user, key, body, reason)
    let cases: [Case; 8] = [
        (Some("shop-1"), Some("k-1"), b"{not json".to_vec(), "malformed_json"),
        (
            Some("shop-1"),
            Some("k-2"),
            br#"{"amount":1999,"amount":5,"currency":"EUR","customer_id":"c"}"#.to_vec(),
            "invalid_fields",
        ),
        (
            Some("shop-1"),
            Some("k-3"),
            bytes(&json!({"amount": -1, "currency": "EUR", "customer_id": "c"})),
            "invalid_fields",
        ),
        (Some("shop-1"), None, bytes(&body()), "missing_idempotency_key"),
        (Some("shop-1"), Some("a key with spaces"), bytes(&body()), "invalid_idempotency_key"),
        (Some("shop-1"), Some("k-4"), too_large, "body_too_large"),
        (Some("nobody-maps-me"), Some("k-5"), bytes(&body()), "unknown_user"),
        (None, Some("k-6"), bytes(&body()), "unknown_user"),
    ];

    for (user, key, message, expected) in cases {
        producer.publish(user, key, &message, expected).await;
        let (reason, problem, dead) = producer.dead_letter().await;
        assert_eq!((reason.as_str(), dead), (expected, message), "{problem}");
    }

    assert_eq!(app.rows().await, NOTHING);
    assert_eq!(producer.depth(&producer.queue).await, 0);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_another_request_is_writing_is_delivered_again_later_not_dead_lettered(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let producer = Producer::connect("in-flight").await;
    let app = app_with_broker(options, &producer, "shop-1").await;
    let request_body = body();
    // Another request's transaction has written the key and not yet committed.
    let mut holder = app.db.begin().await.unwrap();
    let new = NewPayment {
        tenant_id: app.tenant.id,
        key: IdempotencyKey::parse(b"order-1").unwrap(),
        fingerprint: Fingerprint::of("POST", "/v1/payments", &request_body),
        request: PaymentRequest::from_json(&request_body).unwrap(),
        provider_account: None,
        retention: Duration::from_secs(86_400),
        lock_wait: None,
        trace: None,
    };
    let created = intake::accept(&mut holder, &new).await.unwrap().created().unwrap();

    producer.publish(Some("shop-1"), Some("order-1"), &bytes(&request_body), "while-held").await;
    wait_until("the message to be delayed twice", Duration::from_secs(30), || async {
        let metrics = app.metrics().await;
        metrics
            .lines()
            .any(|line| {
                line.strip_prefix("oncepay_api_broker_messages_total{outcome=\"delayed\"} ")
                    .and_then(|count| count.parse::<u32>().ok())
                    .is_some_and(|count| count >= 2)
            })
            .then_some(())
    })
    .await
    .unwrap();
    holder.commit().await.unwrap();
    let (correlation_id, replayed, payment) = producer.reply().await;

    assert_eq!(correlation_id, "while-held");
    assert!(replayed, "the other request made the payment");
    assert_eq!(payment["id"], created.payment.payment_id.to_string());
    assert_eq!(app.rows().await, ONE_PAYMENT);
    assert_eq!(producer.depth(&producer.dead_letter_queue).await, 0, "never dead-lettered for waiting");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_message_delivered_past_the_queues_limit_is_dead_lettered_not_lost(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let producer = Producer::connect("limit").await;
    // The api declares the queues, with a limit of two deliveries, and stops.
    let app = TestApp::spawn_with(options, |settings| {
        producer.configure(settings);
        settings.broker.delivery_limit = 2;
    })
    .await;
    producer.declared().await;
    app.stop().await;
    producer.publish(Some("shop-1"), Some("order-1"), &bytes(&body()), "doomed").await;
    // Consumers that die holding it: each returns it to the queue.
    let mut consumer = producer
        .channel
        .basic_consume(
            producer.queue.as_str().into(),
            "crashing".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for _ in 0..3 {
        let Ok(Some(Ok(delivery))) = tokio::time::timeout(Duration::from_secs(5), consumer.next()).await else { break };
        delivery.reject(BasicRejectOptions { requeue: true }).await.unwrap();
    }

    let message = producer.next(&producer.dead_letter_queue).await;

    let death = headers(&message.properties);
    assert!(
        matches!(death.get("x-first-death-reason"), Some(AMQPValue::LongString(reason)) if reason.as_bytes() == b"delivery_limit"),
        "{death:?}"
    );
    assert_eq!(message.data, bytes(&body()));
}

#[tokio::test]
async fn with_the_database_down_a_message_waits_unacknowledged_and_becomes_a_payment_when_it_returns() {
    let mut cluster = Cluster::start(Durability::Durable).await.unwrap();
    cluster.create_database("oncepay").await.unwrap();
    let db = PgPoolOptions::new().max_connections(2).connect(&cluster.url("oncepay")).await.unwrap();
    db::migrate(&db).await.unwrap();
    let producer = Producer::connect("store-down").await;
    let mut settings = helpers::settings();
    settings.database.url = cluster.url_as("oncepay_api", "oncepay").into();
    settings.database.acquire_timeout_ms = 500;
    producer.configure(&mut settings);
    let app = TestApp::start(Application::build(settings).unwrap(), db).await;
    broker_users::map(&mut app.db.acquire().await.unwrap(), "shop-1", app.tenant.id).await.unwrap();
    producer.declared().await;
    producer.publish(Some("shop-1"), Some("order-1"), &bytes(&body()), "before").await;
    producer.reply().await;

    cluster.stop().await.unwrap();
    producer.publish(Some("shop-1"), Some("order-2"), &bytes(&body()), "while-down").await;
    wait_until("the consumer to find the store unavailable", Duration::from_secs(30), || async {
        app.metrics()
            .await
            .lines()
            .any(|line| {
                line.starts_with("oncepay_api_broker_messages_total{outcome=\"store_unavailable\"} ")
                    && !line.ends_with(" 0")
            })
            .then_some(())
    })
    .await
    .unwrap();
    assert_eq!(producer.depth(&producer.dead_letter_queue).await, 0, "not dead-lettered");
    cluster.resume().await.unwrap();
    let (correlation_id, replayed, payment) = producer.reply().await;

    assert_eq!((correlation_id.as_str(), replayed, &payment["status"]), ("while-down", false, &json!("pending")));
    assert_eq!(app.rows().await, Rows { payments: 2, keys: 2, outbox: 2, events: 2 });
    assert_eq!(producer.depth(&producer.queue).await, 0);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_queues_and_the_oldest_dead_letter_are_sampled_for_gauges_and_the_console(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let producer = Producer::connect("sampled").await;
    let app = app_with_broker(options, &producer, "shop-1").await;
    let before = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();

    for n in 0..2 {
        producer.publish(Some("nobody-maps-me"), Some(&format!("k-{n}")), &bytes(&body()), "unmapped").await;
    }

    let gauge = |queue: &str, count: u32| format!("oncepay_api_broker_queue_messages{{queue=\"{queue}\"}} {count}");
    wait_until("the gauges to show two dead letters", Duration::from_secs(30), || async {
        let metrics = app.metrics().await;
        (metrics.contains(&gauge("dead_letters", 2)) && metrics.contains(&gauge("payments", 0))).then_some(())
    })
    .await
    .unwrap();
    assert!(app.metrics().await.contains("oncepay_api_broker_dead_letter_age_seconds "));
    let samples = wait_until("the console's samples of two dead letters", Duration::from_secs(30), || async {
        let samples = broker_queues::latest(&mut app.db.acquire().await.unwrap()).await.unwrap();
        samples.iter().any(|s| s.queue == "dead_letters" && s.messages == 2).then_some(samples)
    })
    .await
    .unwrap();
    let queues: Vec<(&str, i64)> = samples.iter().map(|s| (s.queue.as_str(), s.messages)).collect();
    assert_eq!(queues, [("payments", 0), ("dead_letters", 2)]);
    let oldest = samples[1].oldest_failed_at.expect("the oldest dead letter's time");
    assert!(before <= oldest && oldest <= OffsetDateTime::now_utc(), "{oldest} is not since {before}");
    // Looking at the head gave it back: both dead letters are still there, whole (in the order the
    // api refused them, which taking messages concurrently does not fix).
    let mut keys = Vec::new();
    for _ in 0..2 {
        let message = producer.next(&producer.dead_letter_queue).await;
        keys.push(headers(&message.properties).get(KEY_HEADER).cloned());
        assert_eq!(message.data, bytes(&body()));
    }
    keys.sort_by_key(|key| format!("{key:?}"));
    let key = |n: u32| Some(AMQPValue::LongString(format!("k-{n}").as_str().into()));
    assert_eq!(keys, [key(0), key(1)]);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_message_the_broker_would_not_take_back_is_settled_on_the_next_connection(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let producer = Producer::connect("reconnects").await;
    let app = app_with_broker(options, &producer, "shop-1").await;
    // Someone deletes the dead-letter exchange: the api's copy of a refused message cannot be
    // published, and RabbitMQ closes the channel it published on.
    let exchange = format!("{}.dlx", producer.queue);
    producer.channel.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default()).await.unwrap();

    producer.publish(Some("nobody-maps-me"), Some("k-1"), &bytes(&body()), "refused").await;

    // The api connects again, declares its topology again, and the message, delivered again, is
    // dead-lettered after all.
    let (reason, _, _) = producer.dead_letter().await;
    assert_eq!(reason, "unknown_user");
    assert_eq!(app.rows().await, NOTHING);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_broker_user_is_read_once_a_ttl_as_an_api_key_is(_: PgPoolOptions, options: PgConnectOptions) {
    let producer = Producer::connect("cached-user").await;
    let app = app_with_broker_and(options, &producer, "shop-1", |settings| settings.auth.cache_ttl_secs = 3600).await;
    producer.publish(Some("shop-1"), Some("order-1"), &bytes(&body()), "read").await;
    assert!(!producer.reply().await.1);

    // Removed from PostgreSQL behind the api's back: its next message is taken on the read of the
    // first, less than the TTL ago, with no read of its own.
    assert!(broker_users::unmap(&mut app.db.acquire().await.unwrap(), "shop-1", app.tenant.id).await.unwrap());
    producer.publish(Some("shop-1"), Some("order-2"), &bytes(&body()), "cached").await;

    let (correlation_id, replayed, _) = producer.reply().await;
    assert_eq!((correlation_id.as_str(), replayed), ("cached", false));
    assert_eq!(app.rows().await, Rows { payments: 2, keys: 2, outbox: 2, events: 2 });
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_removed_broker_user_is_refused_once_the_ttl_has_passed(_: PgPoolOptions, options: PgConnectOptions) {
    const TTL: Duration = Duration::from_secs(1);
    let producer = Producer::connect("removed-user").await;
    let app =
        app_with_broker_and(options, &producer, "shop-1", |settings| settings.auth.cache_ttl_secs = TTL.as_secs())
            .await;
    producer.publish(Some("shop-1"), Some("order-1"), &bytes(&body()), "read").await;
    assert!(!producer.reply().await.1);

    assert!(broker_users::unmap(&mut app.db.acquire().await.unwrap(), "shop-1", app.tenant.id).await.unwrap());
    tokio::time::sleep(TTL).await;
    producer.publish(Some("shop-1"), Some("order-2"), &bytes(&body()), "removed").await;

    let (reason, _, _) = producer.dead_letter().await;
    assert_eq!(reason, "unknown_user");
    assert_eq!(app.rows().await, ONE_PAYMENT);
    app.stop().await;
}
