//! The workload: what many merchants would send, drawn from one seed, driven through the real
//! client library (`oncepay_client`) from many concurrent tasks.
//!
//! [`Plan::draw`] turns a seed into payment intents; [`run`] sends them over a span of time and
//! records everything the clients saw as [`Observations`], for the checker to judge. A send that
//! gets no response is sent again, always as the same intent, as a merchant would. Part of the
//! intents are published to RabbitMQ instead, as a producer publishes them (the client library's
//! `Publisher`: confirms, the same message again without one, the api's reply read back), and
//! followed over HTTP like the rest. Nothing here judges a result: it only records.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use oncepay_client::{
    Client, Error, IdempotencyKey, Payment, PaymentId, PaymentIntent, PaymentStatus, Publisher, RetryPolicy,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use uuid::Uuid;

use crate::refunds::{self, RefundJob, RefundRecord};
use crate::system::Tenant;

/// The shape of a workload.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// Everything random is drawn from this.
    pub seed: u64,
    /// Payment intents in all, over all tenants (a shared key counts once per tenant).
    pub intents: usize,
    /// Intents in progress at once.
    pub concurrency: usize,
    /// Intents start evenly over this span.
    pub spread: Duration,
    /// Fraction of intents sent as a storm of concurrent duplicates.
    pub storm_rate: f64,
    /// Copies in a storm (at least 2).
    pub storm_size: usize,
    /// Fraction of intents whose key another tenant uses at the same time.
    pub shared_key_rate: f64,
    /// Fraction of intents followed by the same key with another amount.
    pub misuse_rate: f64,
    /// Fraction of intents followed by a read of another tenant's payment.
    pub probe_rate: f64,
    /// How long each task follows its payment towards a terminal status.
    pub follow: Duration,
    /// How many times a task sends an intent without a response again before leaving it for later.
    pub resends: u32,
    /// The payment methods intents draw theirs from, e.g. test cards; none leaves the field out.
    pub payment_methods: Vec<String>,
    /// Fraction of intents whose payment, once succeeded, is refunded ([`refunds::RefundPlan`]).
    pub refund_rate: f64,
    /// Fraction of intents published to RabbitMQ instead of sent over HTTP (the tenants need
    /// producers: [`Tenant::producer_url`]).
    pub broker_rate: f64,
}

/// One intent of the plan.
#[derive(Debug, Clone)]
pub struct Job {
    /// Its position in the plan.
    pub index: usize,
    /// Which tenant sends it.
    pub tenant: usize,
    /// The intent, with its key.
    pub intent: PaymentIntent,
    /// Copies sent at once (1: a plain send).
    pub copies: usize,
    /// The api process the first copy goes to (further copies go to the next ones).
    pub api: usize,
    /// Follow it with the same key and another amount.
    pub misuse: bool,
    /// Follow it with a read of another tenant's payment.
    pub probe: bool,
    /// When to start, from the beginning of the run.
    pub start_at: Duration,
    /// What to refund once the payment has succeeded.
    pub refund: Option<RefundJob>,
    /// Published to RabbitMQ (its copies too) instead of sent over HTTP.
    pub via_broker: bool,
}

/// The whole workload, drawn from a seed.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Intents, in start order.
    pub jobs: Vec<Job>,
}

impl Plan {
    /// Draws the workload of `config` for `tenants` tenants and `apis` api processes: amounts,
    /// currencies, customers, payment methods, which api process each intent goes to, which are sent as a duplicate
    /// storm (the same intent several times at once, through different api processes), which keys
    /// two tenants use at once (they must become two payments), and which intents are followed by a
    /// key misuse (the same key with another body: 422 expected) or by a read of another tenant's
    /// payment (404 expected).
    pub fn draw(config: &WorkloadConfig, tenants: usize, apis: usize) -> anyhow::Result<Self> {
        let mut rng = StdRng::seed_from_u64(config.seed);
        let currencies = ["EUR", "USD", "GBP", "JPY"];
        let mut jobs = Vec::with_capacity(config.intents);
        let n = config.intents.max(1);
        while jobs.len() < config.intents {
            let index = jobs.len();
            let tenant = rng.random_range(0..tenants);
            let key = format!("k-{:016x}-{index}", config.seed);
            let shared = tenants > 1 && rng.random_bool(config.shared_key_rate) && jobs.len() + 2 <= config.intents;
            let owners =
                if shared { vec![tenant, (tenant + rng.random_range(1..tenants)) % tenants] } else { vec![tenant] };
            for owner in owners {
                let index = jobs.len();
                let amount = rng.random_range(100..100_000);
                let currency = currencies[rng.random_range(0..currencies.len())];
                let mut builder = PaymentIntent::builder(amount, currency, format!("cus-t{owner}-{index}"))
                    .metadata("order", format!("o-{index}"));
                // Drawn only when there is a choice, so that plans without one stay as they were.
                if !config.payment_methods.is_empty() {
                    let method = &config.payment_methods[rng.random_range(0..config.payment_methods.len())];
                    builder = builder.payment_method(method.clone());
                }
                let intent = builder.build_with_key(IdempotencyKey::new(key.clone())?);
                let storm = rng.random_bool(config.storm_rate);
                // Drawn only with a broker, so that plans without one stay as they were.
                let via_broker = config.broker_rate > 0.0 && rng.random_bool(config.broker_rate);
                jobs.push(Job {
                    index,
                    tenant: owner,
                    intent,
                    copies: if storm { config.storm_size.max(2) } else { 1 },
                    api: rng.random_range(0..apis.max(1)),
                    misuse: rng.random_bool(config.misuse_rate),
                    probe: rng.random_bool(config.probe_rate),
                    start_at: config.spread.mul_f64(index as f64 / n as f64),
                    refund: RefundJob::draw(config.seed, index, owner, config.refund_rate)?,
                    via_broker,
                });
            }
        }
        Ok(Self { jobs })
    }
}

/// What the clients saw for one intent.
#[derive(Debug, Clone)]
pub struct IntentRecord {
    /// The tenant that sent it.
    pub tenant: usize,
    /// Its idempotency key.
    pub key: String,
    /// What it asked for.
    pub amount: i64,
    /// What it asked for.
    pub currency: String,
    /// What it asked for.
    pub customer_id: String,
    /// Every payment id any response to it carried.
    pub payment_ids: BTreeSet<Uuid>,
    /// Sends (`create` calls, each with the client's own retries).
    pub sends: u32,
    /// Sends that got a 2xx response.
    pub answered: u32,
    /// Of those, how many were replays.
    pub replayed: u32,
    /// Sends that got no response (the client gave up).
    pub gave_up: u32,
    /// Responses that were neither 2xx nor a retryable failure (status and problem kind).
    pub rejected: Vec<String>,
    /// Responses whose payment is not what the intent asked for (another tenant's data?).
    pub mismatches: Vec<String>,
    /// The status the client last saw while following it.
    pub last_status: Option<String>,
    /// The key-misuse probe, if one was sent over HTTP.
    pub misuse: Option<MisuseOutcome>,
    /// What the producer saw, if it was published to RabbitMQ.
    pub published: Option<Publishing>,
}

/// What a producer saw of an intent it published to RabbitMQ. A reply counts as an answer
/// ([`IntentRecord::answered`]).
#[derive(Debug, Clone, Default)]
pub struct Publishing {
    /// Publishes RabbitMQ confirmed.
    pub confirmed: u32,
    /// Attempts without a confirmation, published again.
    pub republished: u32,
    /// Publishes never confirmed, after every attempt.
    pub unconfirmed: u32,
    /// Confirmed publishes whose reply did not come in time.
    pub unreplied: u32,
    /// The amount of a confirmed key misuse (the same key, another amount, published once the first
    /// was answered): it must be dead-lettered.
    pub misuse: Option<i64>,
}

/// What a key misuse (same key, another amount) got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MisuseOutcome {
    /// 422 `idempotency-key-reused`, as the contract says.
    Rejected,
    /// A 2xx with this payment: the misuse was accepted.
    Accepted(Uuid),
    /// Another response (status, kind).
    Other(String),
    /// No response.
    NoAnswer,
}

/// A read of another tenant's payment.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The tenant that asked.
    pub tenant: usize,
    /// Whose payment it asked for.
    pub owner: usize,
    /// The payment.
    pub payment_id: Uuid,
    /// What came back.
    pub outcome: ProbeOutcome,
}

/// What a read of another tenant's payment got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// 404, as the contract says.
    NotFound,
    /// The payment was shown.
    Shown(String),
    /// Another response, or none.
    Inconclusive(String),
}

/// Everything the clients saw.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    /// By (tenant, key).
    pub intents: BTreeMap<(usize, String), IntentRecord>,
    /// Cross-tenant reads.
    pub probes: Vec<Probe>,
    /// Refund intents, by (tenant, key).
    pub refunds: BTreeMap<(usize, String), RefundRecord>,
}

impl Observations {
    /// `create` calls made.
    pub fn sends(&self) -> u64 {
        self.intents.values().map(|r| u64::from(r.sends)).sum::<u64>()
            + self.intents.values().filter(|r| r.misuse.is_some()).count() as u64
    }

    /// Intents with at least one 2xx response.
    pub fn accepted(&self) -> usize {
        self.intents.values().filter(|r| r.answered > 0).count()
    }

    /// Intents that never got a response.
    pub fn unanswered(&self) -> Vec<&IntentRecord> {
        self.intents.values().filter(|r| r.answered == 0).collect()
    }
}

type Shared = Arc<Mutex<Observations>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Observations> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The clients: one per (tenant, api process), sharing nothing but the seed's plan; and each
/// tenant's producer, if it has one.
#[derive(Debug, Clone)]
pub struct Clients {
    by_tenant: Vec<Vec<Client>>,
    producers: Vec<Option<String>>,
    policy: RetryPolicy,
}

/// How long a producer waits for the api's reply to a confirmed message.
const REPLY_WAIT: Duration = Duration::from_secs(10);

impl Clients {
    /// A client for every tenant on every api URL.
    pub fn new(tenants: &[Tenant], api_urls: &[String]) -> anyhow::Result<Self> {
        let policy = RetryPolicy {
            max_attempts: 8,
            base_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            ..RetryPolicy::default()
        };
        let mut by_tenant = Vec::new();
        for tenant in tenants {
            let mut clients = Vec::new();
            for url in api_urls {
                clients.push(
                    Client::builder(url.clone(), tenant.api_key.clone())
                        .connect_timeout(Duration::from_secs(2))
                        .timeout(Duration::from_secs(5))
                        .long_poll(Duration::from_secs(5))
                        .retry_policy(policy)
                        .build()?,
                );
            }
            by_tenant.push(clients);
        }
        let producers = tenants.iter().map(|tenant| tenant.producer_url.clone()).collect();
        Ok(Self { by_tenant, producers, policy })
    }

    fn get(&self, tenant: usize, api: usize) -> &Client {
        let clients = &self.by_tenant[tenant];
        &clients[api % clients.len()]
    }

    /// A publisher for `tenant`'s producer, on a connection of its own (opened on its first
    /// publish, closed when it is dropped).
    fn publisher(&self, tenant: usize) -> Option<Publisher> {
        let url = self.producers.get(tenant)?.as_deref()?;
        Publisher::new(url, crate::broker::QUEUE).ok().map(|publisher| publisher.retry_policy(self.policy))
    }
}

/// Sends the plan, spread over the span, and records what the clients saw.
pub async fn run(plan: &Plan, config: &WorkloadConfig, clients: &Clients) -> Observations {
    let shared: Shared = Arc::new(Mutex::new(Observations::default()));
    {
        let mut observations = lock(&shared);
        for job in &plan.jobs {
            observations.intents.insert((job.tenant, job.intent.key().as_str().to_owned()), record_for(job));
        }
    }
    // Accepted payments by tenant, for the cross-tenant reads.
    let accepted: Arc<Mutex<Vec<(usize, Uuid)>>> = Arc::default();
    let begin = Instant::now();
    // By index: a closure over `&Job` would make the future too general to spawn.
    futures::stream::iter(0..plan.jobs.len())
        .map(|index| {
            let (shared, accepted, job) = (shared.clone(), accepted.clone(), &plan.jobs[index]);
            async move {
                tokio::time::sleep_until(begin + job.start_at).await;
                run_job(job, config, clients, &shared, &accepted).await;
            }
        })
        .buffer_unordered(config.concurrency.max(1))
        .collect::<()>()
        .await;
    lock(&shared).clone()
}

/// Sends every intent that never got a response once more (after the system was healed), with
/// patience, and records the responses.
pub async fn resend_unanswered(plan: &Plan, clients: &Clients, observations: &mut Observations) {
    let shared: Shared = Arc::new(Mutex::new(std::mem::take(observations)));
    let pending: Vec<&Job> = plan
        .jobs
        .iter()
        .filter(|job| {
            lock(&shared)
                .intents
                .get(&(job.tenant, job.intent.key().as_str().to_owned()))
                .is_some_and(|r| r.answered == 0)
        })
        .collect();
    futures::stream::iter(pending)
        .for_each_concurrent(16, |job| {
            let shared = shared.clone();
            async move {
                for attempt in 0..5 {
                    if deliver_once(job, clients, job.api + attempt, &shared).await.is_some() {
                        break;
                    }
                }
            }
        })
        .await;
    *observations = lock(&shared).clone();
}

fn record_for(job: &Job) -> IntentRecord {
    IntentRecord {
        tenant: job.tenant,
        key: job.intent.key().as_str().to_owned(),
        amount: job.intent.amount(),
        currency: job.intent.currency().to_owned(),
        customer_id: job.intent.customer_id().to_owned(),
        payment_ids: BTreeSet::new(),
        sends: 0,
        answered: 0,
        replayed: 0,
        gave_up: 0,
        rejected: Vec::new(),
        mismatches: Vec::new(),
        last_status: None,
        misuse: None,
        published: job.via_broker.then(Publishing::default),
    }
}

async fn run_job(
    job: &Job,
    config: &WorkloadConfig,
    clients: &Clients,
    shared: &Shared,
    accepted: &Mutex<Vec<(usize, Uuid)>>,
) {
    let key = (job.tenant, job.intent.key().as_str().to_owned());
    // The first round: every copy at once, through consecutive api processes.
    let copies = (0..job.copies).map(|copy| deliver_once(job, clients, job.api + copy, shared));
    let mut payment = futures::future::join_all(copies).await.into_iter().flatten().next();
    // No response even after the client's own retries (the api was down, PostgreSQL crashed): send
    // the same intent again a few times, as a merchant would. What is still without a response is
    // left to `resend_unanswered` once the system is healed.
    let mut resends = 0;
    while payment.is_none() && resends < config.resends {
        resends += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
        payment = deliver_once(job, clients, job.api + resends as usize, shared).await;
    }
    let Some(payment) = payment else { return };
    accepted.lock().unwrap_or_else(PoisonError::into_inner).push((job.tenant, payment.id.as_uuid()));
    let client = clients.get(job.tenant, job.api);

    if job.misuse && job.via_broker {
        publish_misuse(job, clients, shared).await;
    } else if job.misuse {
        let misuse = PaymentIntent::builder(job.intent.amount() + 1, job.intent.currency(), job.intent.customer_id())
            .build_with_key(job.intent.key().clone());
        let outcome = match client.create(&misuse).await {
            Ok(created) => MisuseOutcome::Accepted(created.payment.id.as_uuid()),
            Err(error) if error.status() == Some(422) && is_kind(&error, "idempotency-key-reused") => {
                MisuseOutcome::Rejected
            }
            Err(Error::GaveUp { .. }) => MisuseOutcome::NoAnswer,
            Err(error) => MisuseOutcome::Other(describe(&error)),
        };
        if let Some(record) = lock(shared).intents.get_mut(&key) {
            record.misuse = Some(outcome);
        }
    }

    if job.probe {
        let foreign = {
            let accepted = accepted.lock().unwrap_or_else(PoisonError::into_inner);
            let others: Vec<_> = accepted.iter().filter(|(tenant, _)| *tenant != job.tenant).copied().collect();
            let mut rng = StdRng::seed_from_u64(config.seed ^ job.index as u64);
            (!others.is_empty()).then(|| others[rng.random_range(0..others.len())])
        };
        if let Some((owner, payment_id)) = foreign {
            let outcome = match client.get(&PaymentId::from(payment_id)).await {
                Ok(shown) => ProbeOutcome::Shown(format!("{} {} {}", shown.id, shown.amount, shown.customer_id)),
                Err(error) if error.status() == Some(404) => ProbeOutcome::NotFound,
                Err(error) => ProbeOutcome::Inconclusive(describe(&error)),
            };
            lock(shared).probes.push(Probe { tenant: job.tenant, owner, payment_id, outcome });
        }
    }

    let last = if payment.status.is_terminal() {
        Some(payment)
    } else {
        match client.wait_for_terminal(&payment.id, config.follow).await {
            Ok(last) => {
                if let Some(record) = lock(shared).intents.get_mut(&key) {
                    check_shown(record, &last);
                }
                Some(last)
            }
            Err(error) => {
                if let Some(record) = lock(shared).intents.get_mut(&key) {
                    record.last_status = Some(format!("unfollowed: {}", describe(&error)));
                }
                None
            }
        }
    };
    let Some(last) = last else { return };
    if let Some(record) = lock(shared).intents.get_mut(&key) {
        record.last_status = Some(last.status.as_str().to_owned());
    }

    if let Some(refund) = &job.refund
        && last.status == PaymentStatus::Succeeded
    {
        let apis: Vec<&Client> = (0..config.storm_size.max(2)).map(|i| clients.get(job.tenant, job.api + i)).collect();
        let seen = refunds::run(refund, &last, &apis, config.storm_size, config.follow).await;
        let mut observations = lock(shared);
        for record in seen {
            observations.refunds.insert((record.tenant, record.key.clone()), record);
        }
    }
}

/// The job's intent once, as the job goes: published to RabbitMQ, or sent over HTTP through the
/// client for api process `api`. The payment if an answer came.
async fn deliver_once(job: &Job, clients: &Clients, api: usize, shared: &Shared) -> Option<Payment> {
    if job.via_broker {
        publish_once(job, clients, shared).await
    } else {
        send_once(job, clients.get(job.tenant, api), shared).await
    }
}

/// One publish of the job's intent to RabbitMQ, as its tenant's producer; the payment if the api's
/// reply came.
async fn publish_once(job: &Job, clients: &Clients, shared: &Shared) -> Option<Payment> {
    let mut publisher = clients.publisher(job.tenant)?;
    let result = publisher.publish(&job.intent, REPLY_WAIT).await;
    let mut observations = lock(shared);
    let record = observations.intents.get_mut(&(job.tenant, job.intent.key().as_str().to_owned()))?;
    record.sends += 1;
    let counts = record.published.get_or_insert_default();
    let Ok(published) = result else {
        counts.unconfirmed += 1;
        return None;
    };
    counts.confirmed += 1;
    counts.republished += published.attempts - 1;
    let Some((payment, replayed)) = published.reply else {
        counts.unreplied += 1;
        return None;
    };
    record.answered += 1;
    record.replayed += u32::from(replayed);
    record.payment_ids.insert(payment.id.as_uuid());
    check_shown(record, &payment);
    Some(payment)
}

/// The same key with another amount, published once the first message was answered (so it is the
/// later one): it must be dead-lettered as `idempotency_key_reused`, and its key keep its payment.
async fn publish_misuse(job: &Job, clients: &Clients, shared: &Shared) {
    let Some(mut publisher) = clients.publisher(job.tenant) else { return };
    let amount = job.intent.amount() + 1;
    let misuse = PaymentIntent::builder(amount, job.intent.currency(), job.intent.customer_id())
        .build_with_key(job.intent.key().clone());
    if publisher.publish(&misuse, Duration::ZERO).await.is_ok()
        && let Some(record) = lock(shared).intents.get_mut(&(job.tenant, job.intent.key().as_str().to_owned()))
    {
        record.published.get_or_insert_default().misuse = Some(amount);
    }
}

/// One `create` of the job's intent through `client`; the payment if the response was 2xx.
async fn send_once(job: &Job, client: &Client, shared: &Shared) -> Option<Payment> {
    let result = client.create(&job.intent).await;
    let mut observations = lock(shared);
    let record = observations.intents.get_mut(&(job.tenant, job.intent.key().as_str().to_owned()))?;
    record.sends += 1;
    match result {
        Ok(created) => {
            record.answered += 1;
            record.replayed += u32::from(created.replayed);
            record.payment_ids.insert(created.payment.id.as_uuid());
            check_shown(record, &created.payment);
            Some(created.payment)
        }
        Err(Error::GaveUp { .. }) => {
            record.gave_up += 1;
            None
        }
        Err(error) => {
            record.rejected.push(describe(&error));
            None
        }
    }
}

/// Notes a response whose payment is not the one this intent made.
fn check_shown(record: &mut IntentRecord, shown: &Payment) {
    if shown.amount != record.amount || shown.currency != record.currency || shown.customer_id != record.customer_id {
        record
            .mismatches
            .push(format!("payment {} shows {} {} for {}", shown.id, shown.amount, shown.currency, shown.customer_id));
    }
    if !record.payment_ids.contains(&shown.id.as_uuid()) {
        record.mismatches.push(format!("followed payment {} is not the one this key was answered with", shown.id));
    }
}

fn is_kind(error: &Error, kind: &str) -> bool {
    error.problem().is_some_and(|problem| problem.kind() == kind)
}

fn describe(error: &Error) -> String {
    match (error.status(), error.problem()) {
        (Some(status), Some(problem)) => format!("{status} {}", problem.kind()),
        (Some(status), None) => format!("{status}"),
        _ => error.to_string(),
    }
}
