//! The RabbitMQ front door: the topology the api declares, and the consumer that feeds the intake
//! queue's messages to [`message::take`] and settles each one with RabbitMQ.
//!
//! Topology, declared at every connection, idempotently (names from `[broker]`):
//! - `queue`: a durable quorum queue, where producers publish (default exchange, routing key the
//!   queue's name). RabbitMQ dead-letters a message delivered `delivery_limit` times to
//!   `dead_letter_exchange`, at least once (`x-dead-letter-strategy`), with its own reason
//!   (`x-first-death-reason: delivery_limit`).
//! - `dead_letter_exchange` (direct) and `dead_letter_queue` (quorum), bound by the dead-letter
//!   queue's name: the messages that will never be payments, for an operator.
//! - `delay_queue`: a durable queue without consumers, whose messages expire after `delay_ms` back
//!   into `queue`.
//!
//! What the consumer does with a message ([`Outcome`]): taken, it answers `reply_to` (if any) and
//! acknowledges; refused, it publishes a copy to the dead-letter exchange with the reason
//! (`oncepay-reason`), the problem (`oncepay-problem`) and the time (`oncepay-failed-at`) and
//! acknowledges once RabbitMQ has confirmed the copy; later, it publishes a copy to the delay queue
//! and acknowledges once confirmed; with the store unavailable, it keeps the message and tries it
//! again after a backoff, until the store answers or the process stops. Beside the consumer, the
//! queue's and the dead-letter queue's messages, and the oldest dead letter's age, are sampled into
//! gauges and for the console. The copies keep the
//! message's `user_id`, so the api's broker user must be an impersonator. A message is acknowledged
//! only after its payment is committed (or its copy confirmed): a consumer killed in between leaves
//! it to be delivered again, and intake replays it.

use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use oncepay_service::backoff::Backoff;
use oncepay_service::telemetry;
use oncepay_store::broker_queues::{self, Queue};
use secrecy::ExposeSecret;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::message::{self, Message, Outcome};
use crate::metrics::{BROKER_DEAD_LETTER_AGE, BROKER_MESSAGES, BROKER_QUEUE_MESSAGES};
use crate::settings::BrokerSettings;
use crate::state::AppState;

/// The message header that carries the idempotency key.
pub const KEY_HEADER: &str = "idempotency-key";
/// The header of a dead-lettered message that says why.
pub const REASON_HEADER: &str = "oncepay-reason";
/// The header of a dead-lettered message with the problem document HTTP would have answered.
pub const PROBLEM_HEADER: &str = "oncepay-problem";
/// The header of a dead-lettered message with when it was refused (AMQP timestamp, seconds).
pub const FAILED_AT_HEADER: &str = "oncepay-failed-at";

/// How long to wait between tries of a message while the store is unavailable, and between
/// connections to the broker.
const BACKOFF: Backoff = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(5) };

/// How long the sampler trusts what it saw at the head of the dead-letter queue while the queue's
/// size stays the same: a dead letter re-published and another refused between two samples leave the
/// size as it was and change the head.
const HEAD_TRUSTED_FOR: Duration = Duration::from_secs(60);

/// Takes payment requests from RabbitMQ until stopped.
pub struct Consumer {
    settings: BrokerSettings,
    state: AppState,
}

impl Consumer {
    /// A consumer of `settings`' queue, feeding the intake of `state`.
    pub fn new(settings: BrokerSettings, state: AppState) -> Self {
        Self { settings, state }
    }

    /// Consumes on a thread of its own until `shutdown`, as one more worker of the api: like an HTTP
    /// worker's, its runtime is its own, and so are the database connections it opens.
    pub fn start(self, shutdown: CancellationToken) -> std::io::Result<std::thread::JoinHandle<()>> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        // In a local set, as on an HTTP worker's runtime: intake writes a group in a task of its own.
        std::thread::Builder::new()
            .name("oncepay-broker".into())
            .spawn(move || tokio::task::LocalSet::new().block_on(&runtime, self.run(shutdown)))
    }

    /// Consumes until `shutdown`, connecting again (after a backoff) whenever the connection is
    /// lost. Messages it holds when it stops, unacknowledged, go back to the queue.
    async fn run(self, shutdown: CancellationToken) {
        let mut failures = 0;
        while !shutdown.is_cancelled() {
            match self.session(&shutdown).await {
                Ok(()) => failures = 0,
                Err(error) => {
                    failures += 1;
                    tracing::warn!(error = %format!("{error:#}"), failures, "the broker connection failed; connecting again");
                }
            }
            let pause = BACKOFF.delay(failures, &mut rand::rng());
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One connection: declares the topology and consumes until `shutdown` or a failure.
    async fn session(&self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let url = self.settings.url.as_ref().map(ExposeSecret::expose_secret).unwrap_or_default();
        let connection = Connection::connect(url, ConnectionProperties::default()).await?;
        let consuming = connection.create_channel().await?;
        let publishing = connection.create_channel().await?;
        publishing.confirm_select(ConfirmSelectOptions::default()).await?;
        declare(&consuming, &self.settings).await?;
        consuming.basic_qos(self.settings.prefetch, BasicQosOptions::default()).await?;
        let consumer = consuming
            .basic_consume(
                self.settings.queue.as_str().into(),
                "oncepay-api".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        tracing::info!(queue = %self.settings.queue, "taking payments from the broker");
        // The first failure to settle a message with the broker ends the session: the connection is
        // then suspect (RabbitMQ may have closed the channel the copies go out on), and its
        // unacknowledged messages go back to the queue when it closes.
        let ended = shutdown.child_token();
        let failed = std::sync::Mutex::new(None);
        let sampling = sample(&connection, &self.state, &self.settings, &ended);
        let consuming = consumer.take_until(ended.cancelled()).for_each_concurrent(
            usize::from(self.settings.prefetch),
            |delivery| {
                let (publishing, failed, ended) = (&publishing, &failed, &ended);
                async move {
                    let settled = match delivery {
                        Ok(delivery) => self.settle(publishing, delivery, ended).await,
                        Err(error) => Err(error.into()),
                    };
                    if let Err(error) = settled {
                        failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(error);
                        ended.cancel();
                    }
                }
            },
        );
        futures::future::join(consuming, sampling).await;
        let _ = connection.close(200, "the consumer is done with this connection".into()).await;
        failed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner).map_or(Ok(()), Err)
    }

    /// Takes one delivery and settles it with the broker as its [`Outcome`] says; while the store is
    /// unavailable, until the session has `ended`.
    async fn settle(
        &self,
        publishing: &Channel,
        delivery: lapin::message::Delivery,
        ended: &CancellationToken,
    ) -> anyhow::Result<()> {
        let properties = &delivery.properties;
        let user = properties.user_id().as_ref().map(ShortString::as_str);
        let key = header(properties, KEY_HEADER);
        let text = |name| header(properties, name).and_then(|value| std::str::from_utf8(value).ok());
        let message = Message {
            user,
            key,
            body: &delivery.data,
            traceparent: text("traceparent"),
            tracestate: text("tracestate"),
        };
        let mut attempts = 0;
        let outcome = loop {
            let outcome = message::take(&self.state, message).await;
            if !matches!(outcome, Outcome::StoreUnavailable) {
                break outcome;
            }
            attempts += 1;
            metrics::counter!(BROKER_MESSAGES, "outcome" => outcome.label()).increment(1);
            tokio::select! {
                // Unacknowledged: RabbitMQ delivers it again once this connection is gone.
                () = ended.cancelled() => return Ok(()),
                () = tokio::time::sleep(BACKOFF.delay(attempts, &mut rand::rng())) => {}
            }
        };
        metrics::counter!(BROKER_MESSAGES, "outcome" => outcome.label()).increment(1);
        match outcome {
            Outcome::Taken { resource, replayed } => {
                #[cfg(feature = "failpoints")]
                fail::fail_point!("api::broker::after_commit", |_| oncepay_service::failpoints::crash(
                    "api::broker::after_commit"
                ));
                if let Some(reply_to) = properties.reply_to() {
                    let mut reply = BasicProperties::default().with_content_type("application/json".into());
                    if let Some(correlation_id) = properties.correlation_id() {
                        reply = reply.with_correlation_id(correlation_id.clone());
                    }
                    let headers = FieldTable::from(std::collections::BTreeMap::from([(
                        ShortString::from("oncepay-replayed"),
                        AMQPValue::Boolean(replayed),
                    )]));
                    // A reply is a courtesy: the payment stands whether or not it arrives.
                    let published = publish(publishing, "", reply_to.as_str(), &resource, reply.with_headers(headers));
                    if let Err(error) = published.await {
                        tracing::warn!(error = %error, "the reply could not be published");
                    }
                }
                delivery.ack(BasicAckOptions::default()).await?;
            }
            Outcome::Refused { reason, problem } => {
                let mut headers = properties.headers().clone().unwrap_or_default();
                headers.insert(REASON_HEADER.into(), AMQPValue::LongString(LongString::from(reason)));
                let problem = serde_json::to_string(&problem).unwrap_or_default();
                headers.insert(PROBLEM_HEADER.into(), AMQPValue::LongString(LongString::from(problem)));
                let now = u64::try_from(OffsetDateTime::now_utc().unix_timestamp()).unwrap_or_default();
                headers.insert(FAILED_AT_HEADER.into(), AMQPValue::Timestamp(now));
                let copy = properties.clone().with_headers(headers);
                let exchange = self.settings.dead_letter_exchange.as_str();
                publish(publishing, exchange, &self.settings.dead_letter_queue, &delivery.data, copy).await?;
                tracing::warn!(reason, "a message that cannot become a payment was dead-lettered");
                delivery.ack(BasicAckOptions::default()).await?;
            }
            Outcome::Later { reason } => {
                publish(publishing, "", &self.settings.delay_queue, &delivery.data, properties.clone()).await?;
                tracing::debug!(reason, "a message was delayed");
                delivery.ack(BasicAckOptions::default()).await?;
            }
            // (The store's unavailability was tried again above until it was something else.)
            Outcome::Failed(_) | Outcome::StoreUnavailable => {
                tracing::error!(?outcome, "a message could not be taken; it goes back to the queue");
                delivery.nack(BasicNackOptions { requeue: true, ..BasicNackOptions::default() }).await?;
            }
        }
        Ok(())
    }
}

/// Samples, every `broker.sample_interval_ms` until `shutdown`, the messages waiting in the queue
/// and in the dead-letter queue, and when the oldest dead letter was refused: into gauges
/// (`oncepay_api_broker_queue_messages`, `oncepay_api_broker_dead_letter_age_seconds`) and into the
/// table the console reads (`oncepay_store::broker_queues`). Stops at the broker's first failure:
/// the connection is then going, and the next one samples again. A sample the database does not
/// take is only logged.
async fn sample(connection: &Connection, state: &AppState, settings: &BrokerSettings, shutdown: &CancellationToken) {
    let sampled = async {
        let channel = connection.create_channel().await?;
        let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        // The head of the dead-letter queue is looked at again only when its size changes, or once
        // what was seen there is older than HEAD_TRUSTED_FOR.
        let mut head: Option<Head> = None;
        loop {
            let declare = |name: &str| channel.queue_declare(name.into(), passive, FieldTable::default());
            let waiting = declare(&settings.queue).await?.message_count();
            let dead = declare(&settings.dead_letter_queue).await?.message_count();
            let now = std::time::Instant::now();
            let oldest = match head {
                Some(seen) if seen.still_holds(dead, now) => seen.oldest,
                _ => {
                    let oldest = match dead {
                        0 => None,
                        _ => refused_at_head(&channel, &settings.dead_letter_queue).await?,
                    };
                    head = Some(Head { size: dead, oldest, seen_at: now });
                    oldest
                }
            };
            let now = OffsetDateTime::now_utc();
            metrics::gauge!(BROKER_QUEUE_MESSAGES, "queue" => Queue::Payments.as_str()).set(f64::from(waiting));
            metrics::gauge!(BROKER_QUEUE_MESSAGES, "queue" => Queue::DeadLetters.as_str()).set(f64::from(dead));
            let age = oldest.map_or(0.0, |at| (now - at).as_seconds_f64().max(0.0));
            metrics::gauge!(BROKER_DEAD_LETTER_AGE).set(age);
            let samples = [(Queue::Payments, waiting, None), (Queue::DeadLetters, dead, oldest)];
            if let Err(error) = record(state, &samples, now).await {
                tracing::warn!(error = %telemetry::error_chain(&error), "the broker's queues could not be recorded for the console");
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok::<(), lapin::Error>(()),
                () = tokio::time::sleep(Duration::from_millis(settings.sample_interval_ms)) => {}
            }
        }
    };
    if let Err(error) = sampled.await {
        tracing::warn!(error = %error, "the broker's queues could not be sampled");
    }
}

/// What the sampler saw at the head of the dead-letter queue.
#[derive(Debug, Clone, Copy)]
struct Head {
    /// The queue's size then.
    size: u32,
    /// When its head was refused, if it had one that says.
    oldest: Option<OffsetDateTime>,
    seen_at: std::time::Instant,
}

impl Head {
    /// Whether what was seen may stand for the head of a queue of `size` messages at `now`.
    fn still_holds(&self, size: u32, now: std::time::Instant) -> bool {
        self.size == size && now.saturating_duration_since(self.seen_at) < HEAD_TRUSTED_FOR
    }
}

/// When the message at the head of `queue` was refused ([`refused_at`]), if it has a message and
/// says. The message is taken and given back at once, unchanged but for its `redelivered` flag:
/// AMQP has no other way to look at one.
async fn refused_at_head(channel: &Channel, queue: &str) -> lapin::Result<Option<OffsetDateTime>> {
    let Some(message) = channel.basic_get(queue.into(), BasicGetOptions { no_ack: false }).await? else {
        return Ok(None);
    };
    let delivery = message.delivery;
    let at = delivery.properties.headers().as_ref().and_then(refused_at);
    delivery.nack(BasicNackOptions { requeue: true, ..BasicNackOptions::default() }).await?;
    Ok(at)
}

/// When a dead letter with these headers was refused: its [`FAILED_AT_HEADER`] (the api refused
/// it), else the time of the first entry of RabbitMQ's `x-death` (RabbitMQ dead-lettered it, past
/// the delivery limit).
fn refused_at(headers: &FieldTable) -> Option<OffsetDateTime> {
    let seconds = |value: Option<&AMQPValue>| match value {
        Some(AMQPValue::Timestamp(seconds)) => i64::try_from(*seconds).ok(),
        _ => None,
    };
    let died = || match headers.inner().get("x-death")? {
        AMQPValue::FieldArray(deaths) => match deaths.as_slice().first()? {
            AMQPValue::FieldTable(death) => seconds(death.inner().get("time")),
            _ => None,
        },
        _ => None,
    };
    let at = seconds(headers.inner().get(FAILED_AT_HEADER)).or_else(died)?;
    OffsetDateTime::from_unix_timestamp(at).ok()
}

/// Writes `samples` (queue, messages, oldest refused) taken `at` for the console.
async fn record(
    state: &AppState,
    samples: &[(Queue, u32, Option<OffsetDateTime>)],
    at: OffsetDateTime,
) -> Result<(), oncepay_store::StoreError> {
    let mut conn = state.connections.acquire().await?;
    for (queue, messages, oldest) in samples {
        broker_queues::record(&mut conn, *queue, i64::from(*messages), *oldest, at).await?;
    }
    Ok(())
}

/// Declares the queues and the exchange, as the module's doc says; a no-op where they exist alike.
pub async fn declare(channel: &Channel, settings: &BrokerSettings) -> anyhow::Result<()> {
    let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    let string = |value: &str| AMQPValue::LongString(LongString::from(value));
    let table = |pairs: Vec<(&str, AMQPValue)>| {
        FieldTable::from(
            pairs
                .into_iter()
                .map(|(name, value)| (ShortString::from(name), value))
                .collect::<std::collections::BTreeMap<_, _>>(),
        )
    };
    channel
        .exchange_declare(
            settings.dead_letter_exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(
            settings.dead_letter_queue.as_str().into(),
            durable,
            table(vec![("x-queue-type", string("quorum"))]),
        )
        .await?;
    channel
        .queue_bind(
            settings.dead_letter_queue.as_str().into(),
            settings.dead_letter_exchange.as_str().into(),
            settings.dead_letter_queue.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(
            settings.queue.as_str().into(),
            durable,
            table(vec![
                ("x-queue-type", string("quorum")),
                ("x-delivery-limit", AMQPValue::LongLongInt(i64::from(settings.delivery_limit))),
                ("x-dead-letter-exchange", string(&settings.dead_letter_exchange)),
                ("x-dead-letter-routing-key", string(&settings.dead_letter_queue)),
                ("x-dead-letter-strategy", string("at-least-once")),
                ("x-overflow", string("reject-publish")),
            ]),
        )
        .await?;
    channel
        .queue_declare(
            settings.delay_queue.as_str().into(),
            durable,
            table(vec![
                ("x-queue-type", string("quorum")),
                ("x-message-ttl", AMQPValue::LongLongInt(i64::try_from(settings.delay_ms).unwrap_or(i64::MAX))),
                ("x-dead-letter-exchange", string("")),
                ("x-dead-letter-routing-key", string(&settings.queue)),
                ("x-dead-letter-strategy", string("at-least-once")),
                ("x-overflow", string("reject-publish")),
            ]),
        )
        .await?;
    Ok(())
}

/// Publishes persistently and waits for RabbitMQ's confirmation; a refusal is an error.
async fn publish(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
) -> anyhow::Result<()> {
    let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
    let confirm = channel
        .basic_publish(exchange.into(), routing_key.into(), options, body, properties.with_delivery_mode(2))
        .await?
        .await?;
    match confirm {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_)) => anyhow::bail!("RabbitMQ could not route the message to {routing_key}"),
        Confirmation::Nack(_) => anyhow::bail!("RabbitMQ refused the message for {routing_key}"),
        Confirmation::NotRequested => anyhow::bail!("publisher confirms are off on the publishing channel"),
    }
}

/// The bytes of a string header, if the message has it.
fn header<'a>(properties: &'a BasicProperties, name: &str) -> Option<&'a [u8]> {
    match properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(value) => Some(value.as_bytes()),
        AMQPValue::ShortString(value) => Some(value.as_str().as_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::FieldArray;

    use super::*;

    #[test]
    fn the_head_seen_stands_while_the_size_holds_and_for_a_minute_at_most() {
        let seen_at = std::time::Instant::now();
        let head = Head { size: 3, oldest: None, seen_at };
        let later = |secs| seen_at + Duration::from_secs(secs);

        let cases = [(3, 0, true), (3, 59, true), (3, 60, false), (2, 1, false), (4, 1, false)];
        for (size, after, holds) in cases {
            assert_eq!(head.still_holds(size, later(after)), holds, "{size} messages, {after} s later");
        }
    }

    fn table(pairs: Vec<(&str, AMQPValue)>) -> FieldTable {
        FieldTable::from(
            pairs
                .into_iter()
                .map(|(name, value)| (ShortString::from(name), value))
                .collect::<std::collections::BTreeMap<_, _>>(),
        )
    }

    #[test]
    fn a_dead_letter_was_refused_when_the_api_says_else_when_rabbitmq_first_killed_it() {
        let refused = table(vec![(FAILED_AT_HEADER, AMQPValue::Timestamp(1_700_000_000))]);
        let deaths = |time: u64| {
            let death = table(vec![
                ("reason", AMQPValue::LongString("delivery_limit".into())),
                ("time", AMQPValue::Timestamp(time)),
            ]);
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)]))
        };
        let delivery_limit = table(vec![("x-death", deaths(1_700_000_500))]);
        let both =
            table(vec![(FAILED_AT_HEADER, AMQPValue::Timestamp(1_700_000_000)), ("x-death", deaths(1_700_000_900))]);
        let at = |seconds| OffsetDateTime::from_unix_timestamp(seconds).ok();

        assert_eq!(refused_at(&refused), at(1_700_000_000));
        assert_eq!(refused_at(&delivery_limit), at(1_700_000_500));
        assert_eq!(refused_at(&both), at(1_700_000_000));
        assert_eq!(refused_at(&FieldTable::default()), None);
    }
}
