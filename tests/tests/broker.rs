//! Payments from RabbitMQ with every process real: the api binary consumes a queue on the tests'
//! node (`ONCEPAY_TEST_AMQP_URL`) and is killed (SIGKILL) while it takes a stream of messages, some
//! committed and not yet acknowledged, then started again. Every message must become exactly one
//! payment and be acknowledged once; none may be dead-lettered.
//!
//! Needs every binary built (`cargo build --workspace --bins`; the test command does it first).

// Helpers outside `#[test]` functions fail loudly too: clippy's test exemption does not reach them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lapin::options::{ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use oncepay_devkit::pg::Durability;
use oncepay_devkit::process::setting_variable;
use oncepay_devkit::rabbitmq;
use oncepay_devkit::wait::wait_until;
use oncepay_tests::system::{Binaries, Processes, Provider, Role, System, SystemConfig, Timing, Topology};
use serde_json::json;

const MESSAGES: usize = 1500;
const PRODUCER: &str = "acme-orders";

#[tokio::test]
async fn an_api_killed_while_it_takes_messages_makes_one_payment_of_each_and_loses_none() {
    let queue = format!("killed.{}", uuid::Uuid::new_v4().simple());
    let setting = |key: &str, value: String| (Processes::Only(Role::Api), setting_variable(key), value);
    let mut system = System::start(SystemConfig {
        binaries: Binaries::built().unwrap(),
        topology: Topology { apis: 1, workers: 1, reconcilers: 1 },
        tenants: vec!["acme".into()],
        durability: Durability::Fast,
        timing: Timing::default(),
        provider: Provider::Simulator { seed: 48 },
        log_dir: None,
        env: vec![
            setting("broker.url", rabbitmq::test_url()),
            setting("broker.queue", queue.clone()),
            setting("broker.dead_letter_queue", format!("{queue}.dead-letters")),
            setting("broker.dead_letter_exchange", format!("{queue}.dlx")),
            setting("broker.delay_queue", format!("{queue}.delayed")),
            setting("broker.delay_ms", "200".into()),
        ],
        broker: false,
    })
    .await
    .unwrap();
    let acme = system.tenants()[0].tenant_id;
    sqlx::query("INSERT INTO broker_users (broker_user, tenant_id) VALUES ($1, $2)")
        .bind(PRODUCER)
        .bind(acme)
        .execute(system.pool())
        .await
        .unwrap();
    let connection = Connection::connect(&rabbitmq::test_url(), ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    wait_until("the api to declare its queue", Duration::from_secs(30), || depth(&connection, &queue)).await.unwrap();

    // A stream of messages, one after another, each confirmed by RabbitMQ before the next.
    let publishing = tokio::spawn({
        let (channel, queue) = (channel.clone(), queue.clone());
        async move {
            for n in 0..MESSAGES {
                publish(&channel, &queue, n).await;
            }
        }
    });
    // Killed once some are committed, while the stream goes on: others are taken and not yet
    // acknowledged.
    wait_until("some payments", Duration::from_secs(60), || async { (payments(&system).await >= 200).then_some(()) })
        .await
        .unwrap();
    system.kill(Role::Api, 0).await.unwrap();
    let committed_at_the_kill = payments(&system).await;
    system.restart(Role::Api, 0, &[]).await.unwrap();
    publishing.await.unwrap();
    wait_until("a payment for every message", Duration::from_secs(120), || async {
        (payments(&system).await >= MESSAGES as i64).then_some(())
    })
    .await
    .unwrap();
    // How many messages the restarted api found already committed (the kill fell between their
    // commit and their acknowledgement): reported, since where a kill falls is chance.
    let metrics = reqwest::get(format!("{}/metrics", system.url(Role::Api, 0).unwrap())).await.unwrap().text().await;
    let replayed = metrics
        .unwrap_or_default()
        .lines()
        .find(|line| line.starts_with("oncepay_api_broker_messages_total{outcome=\"replayed\"}"))
        .map(str::to_owned);
    eprintln!("committed when killed: {committed_at_the_kill}; after the restart: {replayed:?}");
    // A graceful stop returns whatever the api still held to the queue: nothing may be left there.
    let unclean = system.shutdown().await.unwrap();

    let keys: i64 = sqlx::query_scalar("SELECT count(DISTINCT idempotency_key) FROM idempotency_keys")
        .fetch_one(system.pool())
        .await
        .unwrap();
    assert!(unclean.is_empty(), "{unclean:?}");
    assert!(committed_at_the_kill < MESSAGES as i64, "the kill came before the last message was taken");
    assert_eq!((payments(&system).await, keys), (MESSAGES as i64, MESSAGES as i64), "one payment per message");
    assert_eq!(depth(&connection, &queue).await, Some(0), "every message acknowledged");
    assert_eq!(depth(&connection, &format!("{queue}.dead-letters")).await, Some(0), "none dead-lettered");
    assert_eq!(depth(&connection, &format!("{queue}.delayed")).await, Some(0));
}

/// Publishes payment request `n` as the producer, persistently, and waits for RabbitMQ's confirm.
async fn publish(channel: &Channel, queue: &str, n: usize) {
    let body = serde_json::to_vec(&json!({"amount": 1000 + n, "currency": "EUR", "customer_id": "cus_1"})).unwrap();
    let mut headers = FieldTable::default();
    headers.insert("idempotency-key".into(), AMQPValue::LongString(LongString::from(format!("order-{n}"))));
    let properties =
        BasicProperties::default().with_headers(headers).with_user_id(PRODUCER.into()).with_delivery_mode(2);
    rabbitmq::publish_confirmed(channel, "", queue, &body, properties).await.unwrap();
}

/// The messages ready in `queue`, once it exists.
async fn depth(connection: &Connection, queue: &str) -> Option<u32> {
    // A passive declaration of a queue that does not exist closes its channel: one channel each.
    let channel = connection.create_channel().await.ok()?;
    let options = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
    channel.queue_declare(queue.into(), options, FieldTable::default()).await.ok().map(|queue| queue.message_count())
}

async fn payments(system: &System) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM payments").fetch_one(system.pool()).await.unwrap()
}
