//! The dead letters on a real RabbitMQ node: read without being taken, and one published again to
//! the payments queue as its producer published it, then taken off the dead-letter queue; by the
//! library and by `oncepay dead-letters`.

use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use oncepay_client::{DeadLetter, DeadLetterError, DeadLetters};
use oncepay_devkit::rabbitmq;

/// A dead-letter queue and a payments queue of the test's own, with two messages the api refused.
struct Queues {
    _connection: Connection,
    channel: Channel,
    dead_letters: String,
    payments: String,
}

/// The user of the tests' URL, whom RabbitMQ lets publish as any `user_id`.
fn user() -> String {
    let url = rabbitmq::test_url();
    url.trim_start_matches("amqp://").split([':', '@']).next().unwrap().to_owned()
}

fn body(n: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"amount": 1000 + n, "currency": "EUR", "customer_id": "cus_42"})).unwrap()
}

impl Queues {
    async fn with_two_refused() -> Self {
        let connection = Connection::connect(&rabbitmq::test_url(), ConnectionProperties::default()).await.unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        let suffix = uuid::Uuid::new_v4().simple();
        let (dead_letters, payments) = (format!("dead.{suffix}"), format!("payments.{suffix}"));
        for queue in [&dead_letters, &payments] {
            let options = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
            channel.queue_declare(queue.as_str().into(), options, FieldTable::default()).await.unwrap();
        }
        for n in 1..=2 {
            let headers: std::collections::BTreeMap<ShortString, AMQPValue> = [
                ("idempotency-key", AMQPValue::LongString(LongString::from(format!("k-{n}").as_str()))),
                ("oncepay-reason", AMQPValue::LongString(LongString::from("unknown_user"))),
                ("oncepay-problem", AMQPValue::LongString(LongString::from(r#"{"title":"Unauthorized"}"#))),
                ("oncepay-failed-at", AMQPValue::Timestamp(1_700_000_000 + n as u64)),
            ]
            .into_iter()
            .map(|(name, value)| (ShortString::from(name), value))
            .collect();
            let properties = BasicProperties::default()
                .with_headers(FieldTable::from(headers))
                .with_user_id(user().as_str().into())
                .with_delivery_mode(2);
            let options = BasicPublishOptions::default();
            channel
                .basic_publish("".into(), dead_letters.as_str().into(), options, &body(n), properties)
                .await
                .unwrap()
                .await
                .unwrap();
        }
        Self { _connection: connection, channel, dead_letters, payments }
    }

    async fn depth(&self, queue: &str) -> u32 {
        let options = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        self.channel.queue_declare(queue.into(), options, FieldTable::default()).await.unwrap().message_count()
    }

    async fn open(&self) -> DeadLetters {
        DeadLetters::connect(&rabbitmq::test_url(), &self.dead_letters).await.unwrap()
    }
}

fn refused(n: i64) -> DeadLetter {
    DeadLetter {
        user: Some(user()),
        key: Some(format!("k-{n}")),
        reason: Some("unknown_user".into()),
        problem: Some(r#"{"title":"Unauthorized"}"#.into()),
        failed_at: Some(1_700_000_000 + n as u64),
        body: body(n),
    }
}

#[tokio::test]
async fn dead_letters_are_listed_oldest_first_and_stay_where_they_are() {
    let queues = Queues::with_two_refused().await;

    let first = queues.open().await.list(1).await.unwrap();
    let all = queues.open().await.list(10).await.unwrap();

    assert_eq!(first, [refused(1)]);
    assert_eq!(all, [refused(1), refused(2)]);
    assert_eq!(queues.depth(&queues.dead_letters).await, 2);
}

#[tokio::test]
async fn a_dead_letter_published_again_goes_to_the_payments_queue_as_its_producer_sent_it_and_leaves() {
    let queues = Queues::with_two_refused().await;

    let republished = queues.open().await.republish("k-2", None, &queues.payments).await.unwrap();

    assert_eq!(republished, refused(2));
    let message = queues.channel.basic_get(queues.payments.as_str().into(), BasicGetOptions { no_ack: true });
    let message = message.await.unwrap().expect("the message in the payments queue");
    let headers = message.properties.headers().clone().unwrap_or_default();
    let names: Vec<&str> = headers.inner().keys().map(ShortString::as_str).collect();
    assert_eq!(names, ["idempotency-key"], "the dead letter's own headers are left behind");
    assert_eq!(message.properties.user_id().as_ref().map(ShortString::as_str), Some(user().as_str()));
    assert_eq!(*message.properties.delivery_mode(), Some(2));
    assert_eq!(message.data, body(2));
    assert_eq!(queues.open().await.list(10).await.unwrap(), [refused(1)], "the other one stays, and only it");
}

#[tokio::test]
async fn a_key_no_dead_letter_has_or_another_producers_changes_nothing() {
    let queues = Queues::with_two_refused().await;

    let missing = queues.open().await.republish("k-9", None, &queues.payments).await;
    let theirs = queues.open().await.republish("k-1", Some("someone-else"), &queues.payments).await;

    assert!(matches!(missing, Err(DeadLetterError::NotFound { .. })), "{missing:?}");
    assert!(matches!(theirs, Err(DeadLetterError::NotFound { .. })), "{theirs:?}");
    assert_eq!(queues.depth(&queues.payments).await, 0);
    assert_eq!(queues.open().await.list(10).await.unwrap(), [refused(1), refused(2)], "in their order");
}

#[tokio::test]
async fn oncepay_dead_letters_lists_them_and_publishes_one_again() {
    let queues = Queues::with_two_refused().await;
    let oncepay = |args: &[&str]| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"))
            .args(["--json", "dead-letters"])
            .args(args)
            .args(["--queue", &queues.dead_letters])
            .env("ONCEPAY_AMQP_URL", rabbitmq::test_url())
            .output()
    };

    let listed = oncepay(&["list"]).await.unwrap();
    let republished = oncepay(&["republish", "--key", "k-1", "--payments-queue", &queues.payments]).await.unwrap();
    let missing = oncepay(&["republish", "--key", "k-1", "--payments-queue", &queues.payments]).await.unwrap();

    assert!(listed.status.success(), "{listed:?}");
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let keys: Vec<&str> =
        listed["data"].as_array().unwrap().iter().map(|l| l["idempotency_key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["k-1", "k-2"]);
    assert_eq!(listed["data"][0]["reason"], "unknown_user");
    assert_eq!(listed["data"][0]["problem"]["title"], "Unauthorized");
    assert!(republished.status.success(), "{republished:?}");
    assert_eq!(queues.depth(&queues.payments).await, 1);
    assert_eq!(missing.status.code(), Some(5), "{missing:?}");
}
