//! The broker phase's load on a RabbitMQ node (issue 48): a producer that publishes payment
//! requests as a merchant's system does, and a consumer that only acknowledges.
//!
//! The producer publishes the body of `POST /v1/payments` with a fresh `idempotency-key` header and
//! its broker user as `user_id`, persistently, with many publisher confirms outstanding. The same
//! messages measure the node alone (a scratch quorum queue whose messages are acknowledged unread,
//! with the api's prefetch: what no consumer can beat on this node) and the api taking them as
//! payments. Each measurement runs from the first publish of its batch to the last acknowledgement,
//! or to the last payment committed, after a warm-up batch (and, for payments, the database's
//! statistics brought up to date), and returns a [`Row`]. Nothing here starts or stops a process.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use oncepay_domain::ids::TenantId;
use tokio::time::{Instant, sleep};

use crate::cpu::{ClientSource, CpuSampler, CpuUsage, Role};
use crate::dataset;
use crate::measure::{self, Target};
use crate::report::{Kind, Row};

/// The name of the node's own ceiling's row.
pub const CEILING: &str = "broker_ceiling";

/// The name of the row of payments taken from the broker.
pub const INTAKE: &str = "broker_accept";

/// The setup of the HTTP accepts the broker phase measures, sent to the api that consumes.
pub const HTTP_SETUP: &str = "1 api process, consuming from RabbitMQ";

/// The api's prefetch unless the run overrides it (`broker.prefetch` in the api's
/// `config/default.toml`, which a test keeps this equal to). The phase passes it to the api, so both
/// consumers have the same.
pub const DEFAULT_PREFETCH: u16 = 256;

/// Publisher confirms the producer leaves outstanding before it waits for the oldest: enough that
/// the producer never waits on the node's disk, as a producer of many orders at once would not.
pub const CONFIRMS_IN_FLIGHT: usize = 1000;

/// How long the queue and the payments may both stand still before the run gives up on the rest.
const STALL: Duration = Duration::from_secs(60);

/// How long the api may take to declare its queue once it is ready.
const DECLARED_WITHIN: Duration = Duration::from_secs(30);

/// Messages of one measurement: a warm-up batch, then the measured one.
#[derive(Debug, Clone, Copy)]
pub struct Batches {
    /// Published and taken before the measurement.
    pub warmup: u64,
    /// Published and taken in it.
    pub measured: u64,
}

/// The api's queues, named by the phase (`broker.queue`, `broker.dead_letter_queue`,
/// `broker.delay_queue`, and the dead-letter exchange).
#[derive(Debug, Clone)]
pub struct Queues {
    /// Where producers publish.
    pub queue: String,
    /// The messages that will never be payments.
    pub dead_letters: String,
    /// The exchange that routes to `dead_letters`.
    pub dead_letter_exchange: String,
    /// The messages the api put off.
    pub delayed: String,
}

impl Queues {
    /// The phase's names.
    pub fn new() -> Self {
        Self {
            queue: "bench.payments".into(),
            dead_letters: "bench.payments.dead-letters".into(),
            dead_letter_exchange: "bench.dead-letters".into(),
            delayed: "bench.payments.delayed".into(),
        }
    }

    /// The api's settings, by name, to consume `self.queue` on the node at `url` with `prefetch`.
    pub fn api_settings(&self, url: &str, prefetch: u16) -> Vec<(&'static str, String)> {
        vec![
            ("broker.url", url.to_owned()),
            ("broker.prefetch", prefetch.to_string()),
            ("broker.queue", self.queue.clone()),
            ("broker.dead_letter_queue", self.dead_letters.clone()),
            ("broker.dead_letter_exchange", self.dead_letter_exchange.clone()),
            ("broker.delay_queue", self.delayed.clone()),
        ]
    }
}

impl Default for Queues {
    fn default() -> Self {
        Self::new()
    }
}

/// A producer: one connection as its broker user, one channel with publisher confirms.
pub struct Producer {
    _connection: Connection,
    channel: Channel,
    user: String,
}

/// When a batch's first message went out and its last was confirmed.
#[derive(Debug, Clone, Copy)]
struct Published {
    first: Instant,
    confirmed: Instant,
}

impl Producer {
    /// Connects to `url` as `user`, whose name each message carries as its `user_id`.
    pub async fn connect(url: &str, user: &str) -> anyhow::Result<Self> {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .context("the producer cannot connect to RabbitMQ")?;
        let channel = connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok(Self { _connection: connection, channel, user: user.to_owned() })
    }

    /// Publishes `count` payment requests with fresh keys to `queue`, at most
    /// [`CONFIRMS_IN_FLIGHT`] of them unconfirmed, and returns once every one is confirmed. A message
    /// RabbitMQ did not take is an error: it would never become a payment.
    async fn publish(&self, queue: &str, count: u64) -> anyhow::Result<Published> {
        let batch: u64 = rand::random();
        let mut in_flight = VecDeque::with_capacity(CONFIRMS_IN_FLIGHT);
        let first = Instant::now();
        for n in 0..count {
            if in_flight.len() >= CONFIRMS_IN_FLIGHT
                && let Some(oldest) = in_flight.pop_front()
            {
                taken(oldest.await?)?;
            }
            // Every key as long as the others, so every message is the same size.
            let key = format!("bench-{batch:016x}-{n:010}");
            let headers = FieldTable::from(BTreeMap::from([(
                ShortString::from("idempotency-key"),
                AMQPValue::LongString(LongString::from(key)),
            )]));
            let properties = BasicProperties::default()
                .with_headers(headers)
                .with_user_id(self.user.as_str().into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            let options = BasicPublishOptions::default();
            let body = dataset::BODY.as_bytes();
            in_flight.push_back(self.channel.basic_publish("".into(), queue.into(), options, body, properties).await?);
        }
        for confirm in in_flight {
            taken(confirm.await?)?;
        }
        Ok(Published { first, confirmed: Instant::now() })
    }
}

fn taken(confirmation: Confirmation) -> anyhow::Result<()> {
    match confirmation {
        Confirmation::Ack(None) => Ok(()),
        other => bail!("RabbitMQ did not take a published message: {other:?}"),
    }
}

/// The node's own ceiling: `batches` published by `producer` to a scratch quorum queue while one
/// consumer on `admin` acknowledges each message unread, `prefetch` at a time and concurrently, as
/// the api takes them. The rate runs from the measured batch's first publish to its last
/// acknowledgement. The queue is deleted afterwards.
pub async fn ceiling(
    target: &Target<'_>,
    producer: &Producer,
    admin: &Connection,
    prefetch: u16,
    batches: Batches,
) -> anyhow::Result<Row> {
    let channel = admin.create_channel().await?;
    let queue = format!("bench.ceiling.{:016x}", rand::random::<u64>());
    let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    let quorum = FieldTable::from(BTreeMap::from([(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from("quorum")),
    )]));
    channel.queue_declare(queue.as_str().into(), durable, quorum).await?;
    channel.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "bench-ceiling".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    tokio::try_join!(producer.publish(&queue, batches.warmup), acknowledge(&mut consumer, prefetch, batches.warmup))?;
    target.checkpoint().await?;

    let sampler = CpuSampler::new(target.postmasters, ClientSource::ThisProcess);
    let cpu_from = sampler.sample();
    let (published, last_ack) = tokio::try_join!(
        producer.publish(&queue, batches.measured),
        acknowledge(&mut consumer, prefetch, batches.measured)
    )?;
    let cpu = sampler.sample().since(&cpu_from);

    channel.basic_cancel("bench-ceiling".into(), BasicCancelOptions::default()).await?;
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await?;
    let _ = channel.close(200, "the ceiling is measured".into()).await;
    let taken =
        Taken { messages: batches.measured, seconds: last_ack.duration_since(published.first).as_secs_f64(), cpu };
    let setup = format!("RabbitMQ alone, acknowledged unread, {CONFIRMS_IN_FLIGHT} confirms in flight");
    let mut row = taken.row(Kind::Raw, CEILING, prefetch, setup, target, &[Role::Broker]);
    row.extra.insert("published_per_s".into(), publish_rate(published, batches.measured));
    Ok(row)
}

/// Acknowledges the next `count` deliveries of `consumer`, `prefetch` at a time, and says when
/// the last acknowledgement went out.
async fn acknowledge(consumer: &mut lapin::Consumer, prefetch: u16, count: u64) -> anyhow::Result<Instant> {
    consumer
        .by_ref()
        .take(usize::try_from(count)?)
        .map_err(anyhow::Error::from)
        .try_for_each_concurrent(usize::from(prefetch), |delivery| async move {
            delivery.ack(BasicAckOptions::default()).await?;
            Ok(())
        })
        .await?;
    Ok(Instant::now())
}

/// The api consuming the phase's queue.
pub struct Consuming<'a> {
    /// The api process.
    pub api: SocketAddr,
    /// Its queues.
    pub queues: &'a Queues,
    /// Its prefetch.
    pub prefetch: u16,
    /// The tenant the producer's broker user is mapped to, whose payments are only these.
    pub tenant: TenantId,
}

/// Payments from the queue the api consumes: `batches` published by `producer`. The rate runs from
/// the measured batch's first publish until the tenant's payments hold every message of it (first
/// the queue's ready messages read from the node until none is left, then the payments counted,
/// since counting costs PostgreSQL a scan of the tenant's rows).
///
/// Every message must have become exactly one payment: as many payments and keys as messages (each
/// key names a payment of its own), none dead-lettered. Anything else fails the run.
pub async fn intake(
    target: &Target<'_>,
    producer: &Producer,
    admin: &Connection,
    consuming: &Consuming<'_>,
    batches: Batches,
) -> anyhow::Result<Row> {
    let queue = consuming.queues.queue.as_str();
    let watch = admin.create_channel().await?;
    let before = dataset::payments_of(&mut *target.pool.acquire().await?, consuming.tenant).await?;
    producer.publish(queue, batches.warmup).await?;
    wait_for_payments(target, &watch, queue, consuming.tenant, before + batches.warmup).await?;
    // Statistics that know the new tenant, as a tenant that has been paying for a while has: without
    // them the planner expects it to have no keys, and reads a group of its keys by scanning all of
    // them (BENCHMARKS.md, "Payments from RabbitMQ").
    dataset::settle_database(&mut *target.pool.acquire().await?).await?;

    let groups_before = measure::intake_groups(&[consuming.api]).await?;
    let outcomes_before = outcomes(consuming.api).await?;
    let sampler = CpuSampler::new(target.postmasters, ClientSource::ThisProcess);
    let cpu_from = sampler.sample();
    let published = producer.publish(queue, batches.measured).await?;
    let expected = before + batches.warmup + batches.measured;
    let committed = wait_for_payments(target, &watch, queue, consuming.tenant, expected).await?;
    let cpu = sampler.sample().since(&cpu_from);
    let groups = measure::intake_groups(&[consuming.api]).await? - groups_before;
    let outcomes_after = outcomes(consuming.api).await?;

    let mut conn = target.pool.acquire().await?;
    let payments = dataset::payments_of(&mut conn, consuming.tenant).await?;
    let keys = dataset::keys_of(&mut conn, consuming.tenant).await?;
    drop(conn);
    let dead_letters = ready(&watch, &consuming.queues.dead_letters).await?;
    ensure!(
        (payments, keys, dead_letters) == (expected, expected, 0),
        "{expected} messages became {payments} payments with {keys} keys, and {dead_letters} dead-lettered"
    );

    let taken =
        Taken { messages: batches.measured, seconds: committed.duration_since(published.first).as_secs_f64(), cpu };
    let setup = format!("1 api process, {CONFIRMS_IN_FLIGHT} confirms in flight");
    let roles = [Role::Api, Role::Postgres, Role::Broker];
    let mut row = taken.row(Kind::Service, INTAKE, consuming.prefetch, setup, target, &roles);
    let extra = &mut row.extra;
    extra.insert("published_per_s".into(), publish_rate(published, batches.measured));
    if groups.count > 0.0 {
        extra.insert("mean_group_size".into(), groups.requests / groups.count);
    }
    for (outcome, count) in outcomes_after {
        let count = count - outcomes_before.get(&outcome).copied().unwrap_or(0.0);
        if count > 0.0 {
            extra.insert(format!("messages {outcome}"), count);
        }
    }
    Ok(row)
}

/// Waits until `tenant` has `expected` payments, and says when it found them.
async fn wait_for_payments(
    target: &Target<'_>,
    watch: &Channel,
    queue: &str,
    tenant: TenantId,
    expected: u64,
) -> anyhow::Result<Instant> {
    let mut seen = (u32::MAX, 0);
    let mut moved = Instant::now();
    loop {
        let waiting = ready(watch, queue).await?;
        // While messages wait, the api is still at work; the last few it holds are counted for.
        let payments =
            if waiting == 0 { dataset::payments_of(&mut *target.pool.acquire().await?, tenant).await? } else { 0 };
        if payments >= expected {
            return Ok(Instant::now());
        }
        if (waiting, payments) != seen {
            seen = (waiting, payments);
            moved = Instant::now();
        } else if moved.elapsed() > STALL {
            bail!(
                "no progress for {STALL:?}: {waiting} messages ready in {queue}, {payments} of {expected} payments; \
                 see the api's log"
            );
        }
        sleep(Duration::from_millis(if waiting == 0 { 5 } else { 20 })).await;
    }
}

/// Waits until the api has declared `queue` on the node of `admin`.
pub async fn wait_for_queue(admin: &Connection, queue: &str) -> anyhow::Result<()> {
    oncepay_devkit::wait::wait_until("the api to declare its queue", DECLARED_WITHIN, || async {
        // A passive declaration of a queue that does not exist closes its channel: one channel each.
        let channel = admin.create_channel().await.ok()?;
        let found = ready(&channel, queue).await.ok().map(drop);
        let _ = channel.close(200, "checked".into()).await;
        found
    })
    .await
}

/// The messages ready (not held by a consumer) in `queue`.
async fn ready(channel: &Channel, queue: &str) -> anyhow::Result<u32> {
    let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
    Ok(channel.queue_declare(queue.into(), passive, FieldTable::default()).await?.message_count())
}

/// Messages of a batch published per second, first publish to last confirm.
fn publish_rate(published: Published, messages: u64) -> f64 {
    messages as f64 / published.confirmed.duration_since(published.first).as_secs_f64().max(f64::EPSILON)
}

/// The api's messages from the broker so far, by outcome (`oncepay_api_broker_messages_total`).
async fn outcomes(api: SocketAddr) -> anyhow::Result<BTreeMap<String, f64>> {
    let text = reqwest::get(format!("http://{api}/metrics")).await?.error_for_status()?.text().await?;
    Ok(outcomes_in(&text))
}

/// [`outcomes`] read from the text of `/metrics`.
fn outcomes_in(metrics: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("oncepay_api_broker_messages_total{outcome=\"")?;
            let (outcome, value) = rest.split_once("\"}")?;
            Some((outcome.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// What one measurement took: its messages, the seconds from the first publish to the last
/// message taken, and the CPU spent meanwhile.
struct Taken {
    messages: u64,
    seconds: f64,
    cpu: CpuUsage,
}

impl Taken {
    /// Its row, with the CPU per message of `roles`.
    fn row(self, kind: Kind, name: &str, prefetch: u16, setup: String, target: &Target<'_>, roles: &[Role]) -> Row {
        let seconds = self.seconds.max(f64::EPSILON);
        Row {
            kind,
            name: name.into(),
            concurrency: u32::from(prefetch),
            setup,
            dataset: target.dataset.into(),
            ops: self.messages,
            seconds,
            rate: self.messages as f64 / seconds,
            latency: None,
            errors: 0,
            cpu_seconds_per_op: Row::cost_per_op(&self.cpu, roles, self.messages),
            cpu: self.cpu,
            comparison: None,
            extra: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outcomes_are_read_from_the_apis_metrics_and_nothing_else_is() {
        let metrics = "# TYPE oncepay_api_broker_messages_total counter\n\
                       oncepay_api_broker_messages_total{outcome=\"created\"} 5000\n\
                       oncepay_api_broker_messages_total{outcome=\"replayed\"} 3\n\
                       oncepay_api_broker_queue_messages{queue=\"payments\"} 12\n\
                       oncepay_api_intake_group_size_sum 5003\n";

        let outcomes = outcomes_in(metrics);

        assert_eq!(outcomes, BTreeMap::from([("created".into(), 5000.0), ("replayed".into(), 3.0)]));
    }

    #[test]
    fn the_default_prefetch_is_the_apis() {
        let defaults = include_str!("../../api/config/default.toml");
        let (_, broker) = defaults.split_once("\n[broker]\n").expect("the api's defaults have a [broker] table");
        let prefetch = broker.lines().find_map(|line| line.strip_prefix("prefetch = ")).expect("broker.prefetch");

        assert_eq!(prefetch.trim().parse::<u16>().unwrap(), DEFAULT_PREFETCH);
    }

    #[test]
    fn the_api_is_given_the_phases_queues_and_prefetch() {
        let settings = Queues::new().api_settings("amqp://oncepay:secret@127.0.0.1:5672/%2f", 256);

        let names: Vec<&str> = settings.iter().map(|(name, _)| *name).collect();
        assert!(names.contains(&"broker.url") && names.contains(&"broker.delay_queue"), "{names:?}");
        assert!(settings.contains(&("broker.prefetch", "256".into())), "{settings:?}");
    }
}
