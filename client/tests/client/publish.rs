//! `Publisher`: a payment request published to RabbitMQ as the api reads one, confirmed, published
//! again with the same key while RabbitMQ refuses it, and the api's reply read back. Against the
//! tests' real node (`ONCEPAY_TEST_AMQP_URL`); the test stands in for the api's consumer.

use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use oncepay_client::{Jitter, PaymentIntent, PaymentStatus, Publisher, RetryPolicy};
use oncepay_devkit::rabbitmq;

use crate::support::payment_json;

/// A queue of the test's own on the tests' node, with `arguments`.
async fn queue(arguments: Vec<(&str, AMQPValue)>) -> (Connection, Channel, String) {
    let connection = Connection::connect(&rabbitmq::test_url(), ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let name = format!("publish.{}", uuid::Uuid::new_v4().simple());
    let arguments: std::collections::BTreeMap<_, _> =
        arguments.into_iter().map(|(key, value)| (ShortString::from(key), value)).collect();
    channel
        .queue_declare(name.as_str().into(), QueueDeclareOptions::default(), FieldTable::from(arguments))
        .await
        .unwrap();
    (connection, channel, name)
}

fn intent() -> PaymentIntent {
    PaymentIntent::builder(1999, "EUR", "cus_42").metadata("order", "A-17").build()
}

/// The user of the tests' URL, whom RabbitMQ lets publish as `user_id`.
fn user() -> String {
    let url = rabbitmq::test_url();
    url.trim_start_matches("amqp://").split([':', '@']).next().unwrap().to_owned()
}

#[tokio::test]
async fn an_intent_is_published_as_the_api_reads_a_message_and_confirmed() {
    let (_connection, channel, queue) = queue(Vec::new()).await;
    let intent = intent();

    let published =
        Publisher::new(&rabbitmq::test_url(), &queue).unwrap().publish(&intent, Duration::ZERO).await.unwrap();

    assert_eq!((published.attempts, published.reply.is_none()), (1, true));
    let message = channel.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap().unwrap();
    let properties = &message.properties;
    let key = properties.headers().as_ref().unwrap().inner().get("idempotency-key").cloned();
    assert_eq!(key, Some(AMQPValue::LongString(LongString::from(intent.key().as_str()))));
    assert_eq!(properties.user_id().as_ref().map(ShortString::as_str), Some(user().as_str()));
    assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
    let body: serde_json::Value = serde_json::from_slice(&message.data).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"amount": 1999, "currency": "EUR", "customer_id": "cus_42", "metadata": {"order": "A-17"}})
    );
}

#[tokio::test]
async fn a_refused_publish_is_published_again_with_the_same_key_until_it_is_confirmed() {
    // A full queue that refuses what does not fit: the first publish is not confirmed.
    let arguments = vec![
        ("x-max-length", AMQPValue::LongLongInt(1)),
        ("x-overflow", AMQPValue::LongString(LongString::from("reject-publish"))),
    ];
    let (_connection, channel, queue) = queue(arguments).await;
    let filler = BasicProperties::default();
    channel
        .basic_publish("".into(), queue.as_str().into(), BasicPublishOptions::default(), b"filler", filler)
        .await
        .unwrap();
    let intent = intent();
    let patient = RetryPolicy {
        max_attempts: 1000,
        base_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
        jitter: Jitter::Full,
        max_retry_after: Duration::from_secs(1),
    };
    let mut publisher = Publisher::new(&rabbitmq::test_url(), &queue).unwrap().retry_policy(patient);
    // Room is made while the publisher retries: a second after it starts, long after its first
    // attempt even on a busy machine (its attempts come every 10 to 20 ms).
    let drain = tokio::spawn({
        let (channel, queue) = (channel.clone(), queue.clone());
        async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            channel.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap()
        }
    });

    let published = publisher.publish(&intent, Duration::ZERO).await.unwrap();

    assert_eq!(drain.await.unwrap().unwrap().data, b"filler");
    assert!(published.attempts >= 2, "{published:?}");
    let message = channel.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap().unwrap();
    let key = message.properties.headers().as_ref().unwrap().inner().get("idempotency-key").cloned();
    assert_eq!(key, Some(AMQPValue::LongString(LongString::from(intent.key().as_str()))));
    assert!(channel.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap().is_none());
}

/// Stands in for the api on `queue`: takes one message and replies with a pending payment, correlated,
/// to its `reply_to`; returns the message's idempotency key.
fn answer_as_the_api(channel: &Channel, queue: &str) -> tokio::task::JoinHandle<AMQPValue> {
    let (channel, queue) = (channel.clone(), queue.to_owned());
    tokio::spawn(async move {
        let mut consumer = channel
            .basic_consume(queue.as_str().into(), "api".into(), BasicConsumeOptions::default(), FieldTable::default())
            .await
            .unwrap();
        let delivery = consumer.next().await.unwrap().unwrap();
        let properties = &delivery.properties;
        let reply = BasicProperties::default().with_correlation_id(properties.correlation_id().clone().unwrap());
        let body = serde_json::to_vec(&payment_json("pending")).unwrap();
        let reply_to = properties.reply_to().clone().unwrap();
        let options = BasicPublishOptions::default();
        channel.basic_publish("".into(), reply_to, options, &body, reply).await.unwrap().await.unwrap();
        delivery.ack(BasicAckOptions::default()).await.unwrap();
        properties.headers().as_ref().unwrap().inner().get("idempotency-key").cloned().unwrap()
    })
}

#[tokio::test]
async fn oncepay_publish_prints_its_key_and_the_apis_answer() {
    let (_connection, channel, queue) = queue(Vec::new()).await;
    let api = answer_as_the_api(&channel, &queue);

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"))
        .args(["publish", "--amount", "1999", "--currency", "EUR", "--customer", "cus_42", "--queue", &queue])
        .args(["--key", "order-42"])
        .env("ONCEPAY_AMQP_URL", rabbitmq::test_url())
        .env_remove("ONCEPAY_API_KEY")
        .output()
        .await
        .unwrap();

    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("idempotency key: order-42"), "{stdout}");
    assert!(stdout.contains(&format!("payment {}: pending (accepted)", crate::support::PAYMENT_ID)), "{stdout}");
    assert_eq!(api.await.unwrap(), AMQPValue::LongString(LongString::from("order-42")));
    assert!(!stdout.contains(&rabbitmq::test_url()) && !stdout.contains("amqp://"), "the URL is never printed");
}

#[tokio::test]
async fn the_apis_reply_to_the_intent_is_read_back() {
    let (_connection, channel, queue) = queue(Vec::new()).await;
    let api = answer_as_the_api(&channel, &queue);

    let published = Publisher::new(&rabbitmq::test_url(), &queue)
        .unwrap()
        .publish(&intent(), Duration::from_secs(30))
        .await
        .unwrap();

    api.await.unwrap();
    let (payment, replayed) = published.reply.unwrap();
    assert_eq!((payment.status, replayed), (PaymentStatus::Pending, false));
}

#[test]
fn a_publish_may_run_on_any_thread_of_a_runtime() {
    // A producer spawns its publishes onto a multi-threaded runtime: the future must be `Send`.
    fn spawnable<F: std::future::Future + Send>(_: F) {}
    let mut publisher = Publisher::new("amqp://producer:secret@127.0.0.1:1/%2f", "payments").unwrap();
    let intent = intent();

    spawnable(publisher.publish(&intent, Duration::ZERO));
}
