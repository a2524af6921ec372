//! Delivering events to merchants' endpoints (issue 49), in the worker beside the sends: no new
//! process, and more workers deliver more.
//!
//! The loop claims due deliveries (`oncepay_store::merchant_deliveries::claim`: leased, fenced, at
//! most a few per endpoint, a payment's in order), sends each as an HTTP request ([`http`]) or a
//! message to a RabbitMQ exchange ([`exchange`]), both carrying the same [`message`], judges the answer
//! ([`verdict`], pure) and records the attempt under the claim's fencing token, in one transaction
//! with the same endpoint's other attempts waiting to be recorded at that moment. A worker that dies
//! mid-delivery leaves a lease that runs out; the next claim takes the delivery again, and the
//! endpoint may see it twice, with the same `webhook-id`: delivery is at least once.
//!
//! The deliveries of the payments this worker's drainer settles come without a claim: queued leased
//! to this worker and handed over once their transaction has committed ([`hand_off`]).
//!
//! An attempt starts only if it ends, timeout included, before the claim's lease can run out,
//! counted from before the claim was asked for. A worker paused between its claim and its send
//! (a stop, a long garbage pause, a lock wait) wakes up to a lease another worker may hold by now,
//! and a payment's later event may have gone out since: sending then would let the endpoint see
//! the payment's events out of order. It drops the claim instead, and the lease runs out.

pub mod exchange;
pub mod hand_off;
pub mod http;
pub mod message;
pub mod verdict;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use oncepay_domain::ids::TenantId;
use oncepay_service::group_commit::GroupCommits;
use oncepay_service::telemetry;
use oncepay_store::StoreError;
use oncepay_store::connections::Connections;
use oncepay_store::merchant_deliveries::{self, ClaimedDelivery, Record, Recording};
use uuid::Uuid;

use oncepay_domain::endpoint_url::EXCHANGE_SCHEME;

use crate::metrics;
use exchange::Publisher;
use hand_off::{HandOff, Handed};
use http::Sender;
use verdict::Rules;

/// How the event sender runs.
#[derive(Debug, Clone)]
pub struct EventSenderConfig {
    /// This worker's name in leases and attempts.
    pub worker_id: String,
    /// Most deliveries one claim takes.
    pub batch_size: u32,
    /// Most deliveries in flight at once.
    pub max_in_flight: u32,
    /// Most deliveries in flight to one endpoint, across all workers.
    pub per_endpoint: u32,
    /// How long a claimed delivery stays leased; longer than an attempt may take.
    pub lease: Duration,
    /// How often to look for due deliveries.
    pub poll_interval: Duration,
    /// How attempts are judged.
    pub rules: Rules,
}

/// Each endpoint's attempts waiting to be recorded: recorded together, one transaction per
/// endpoint and turn.
type Records = GroupCommits<(TenantId, Uuid), Record, Result<Recording, Arc<StoreError>>>;

/// Delivers events until shutdown.
#[derive(Clone)]
pub struct EventSender {
    /// Claims' and records' connections, which skip sqlx's ping at every checkout and return
    /// (`oncepay_store::connections`); the worker's drainer shares them.
    connections: Arc<Connections>,
    sender: Sender,
    publisher: Publisher,
    config: EventSenderConfig,
    records: Arc<Records>,
    /// The slots of claimed deliveries: `max_in_flight` less the hand-offs' half ([`hand_off`]).
    claim_slots: Arc<Semaphore>,
    hand_off: HandOff,
    /// The deliveries handed over, taken by [`EventSender::run`].
    handed: Arc<Mutex<Option<mpsc::UnboundedReceiver<Handed>>>>,
}

impl EventSender {
    /// An event sender over `connections`, sending requests through `sender` and messages to
    /// exchanges through `publisher`.
    pub fn new(connections: Arc<Connections>, sender: Sender, publisher: Publisher, config: EventSenderConfig) -> Self {
        let (claim_slots, handed_slots) = split_slots(config.max_in_flight);
        let (hand_off, handed) =
            HandOff::new(config.worker_id.clone(), config.lease, config.per_endpoint, handed_slots);
        let claim_slots = Arc::new(Semaphore::new(usize::try_from(claim_slots).unwrap_or(usize::MAX)));
        Self {
            connections,
            sender,
            publisher,
            config,
            records: Arc::new(Records::default()),
            claim_slots,
            hand_off,
            handed: Arc::new(Mutex::new(Some(handed))),
        }
    }

    /// Where the drainer hands the deliveries it queued leased to this worker ([`hand_off`]).
    pub fn hand_off(&self) -> HandOff {
        self.hand_off.clone()
    }

    /// Its connections, for the drainer to share.
    pub fn connections(&self) -> Arc<Connections> {
        Arc::clone(&self.connections)
    }

    /// Claims, sends and records until `shutdown`; then lets the deliveries in flight finish.
    ///
    /// A claim that came back short of what it asked for found every due delivery there was room
    /// for: the next claim waits for the poll, or for the end of a delivery to an endpoint that had
    /// more due than room. Claiming after every delivery cost a claim per delivery, each walking the
    /// pending deliveries, mostly for nothing (BENCHMARKS.md, "Events to merchants").
    pub async fn run(self, shutdown: CancellationToken) {
        // Only one run takes the hand-offs; another one of the same sender (a clone) claims alone.
        let handed = self.handed.lock().unwrap_or_else(PoisonError::into_inner).take();
        let mut handed = handed.unwrap_or_else(|| mpsc::unbounded_channel().1);
        let mut in_flight = JoinSet::new();
        let mut poll = tokio::time::interval(self.config.poll_interval);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Whether a claim might find something: after a poll tick, a full claim, or the end of a
        // delivery whose endpoint had more due.
        let mut maybe_due = true;
        while !shutdown.is_cancelled() {
            let room = self.room();
            if maybe_due && room > 0 {
                let asked_at = Instant::now();
                let claimed = self.claim(room).await;
                maybe_due = claimed.len() == room as usize;
                for delivery in claimed {
                    let Ok(slot) = Arc::clone(&self.claim_slots).try_acquire_owned() else {
                        // Cannot happen: the claim took at most the free slots, and only this loop
                        // takes them. Its lease runs out, and a claim takes it then.
                        break;
                    };
                    let this = self.clone();
                    in_flight.spawn(async move { this.deliver(delivery, asked_at, slot).await });
                }
                // A full claim and room still free: claim again at once.
                if maybe_due && self.room() > 0 {
                    continue;
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => {}
                Some(Handed { delivery, asked_at, slot }) = handed.recv() => {
                    let this = self.clone();
                    in_flight.spawn(async move { this.deliver(delivery, asked_at, slot).await });
                }
                Some(ended) = in_flight.join_next() => {
                    maybe_due |= ended.unwrap_or(false);
                    while let Some(ended) = in_flight.try_join_next() {
                        maybe_due |= ended.unwrap_or(false);
                    }
                }
                _ = poll.tick() => maybe_due = true,
            }
        }
        while in_flight.join_next().await.is_some() {}
    }

    /// How many deliveries the next claim may take, with its slots as they are ([`claim_room`]).
    fn room(&self) -> u32 {
        let (slots, _) = split_slots(self.config.max_in_flight);
        let in_flight =
            usize::try_from(slots).unwrap_or(usize::MAX).saturating_sub(self.claim_slots.available_permits());
        claim_room(slots, self.config.batch_size, in_flight)
    }

    /// Claims up to `limit` due deliveries, one statement per tenant with any due (so that under
    /// Citus each runs on its tenant's shard alone). The tenants go in a random order, each taking
    /// an equal share of what is left, so that one tenant's backlog takes no claim whole. What was
    /// claimed before a statement failed is kept: it is leased to this worker.
    async fn claim(&self, limit: u32) -> Vec<ClaimedDelivery> {
        let mut claimed = Vec::new();
        let done = async {
            let mut conn = self.connections.acquire().await?;
            let mut tenants = merchant_deliveries::due_tenants(&mut conn).await?;
            tenants.shuffle(&mut rand::rng());
            for (turn, tenant_id) in tenants.iter().enumerate() {
                let left = limit.saturating_sub(u32::try_from(claimed.len()).unwrap_or(u32::MAX));
                if left == 0 {
                    break;
                }
                let share = tenant_share(left, tenants.len() - turn);
                let config = &self.config;
                claimed.extend(
                    merchant_deliveries::claim(
                        &mut conn,
                        *tenant_id,
                        &config.worker_id,
                        share,
                        config.per_endpoint,
                        config.lease,
                    )
                    .await?,
                );
            }
            conn.release();
            Ok::<_, StoreError>(())
        }
        .await;
        if let Err(error) = done {
            tracing::warn!(error = %telemetry::error_chain(&error), "cannot claim event deliveries; trying again");
        }
        claimed
    }

    /// Sends `claimed`, asked for at `asked_at`, and records the attempt, in `slot`; or drops it if
    /// the attempt could outlast the lease. Whether its endpoint had more due
    /// ([`ClaimedDelivery::more_due`]).
    async fn deliver(&self, claimed: ClaimedDelivery, asked_at: Instant, slot: OwnedSemaphorePermit) -> bool {
        let _slot = slot;
        let more_due = claimed.more_due;
        if !ends_within_lease(asked_at.elapsed(), self.sender.timeout(), self.config.lease) {
            metrics::delivery_lease_lost();
            tracing::warn!(event.id = %claimed.event_id, endpoint.id = %claimed.endpoint_id,
                "a claimed delivery was not sent: its lease could run out before the attempt ends");
            return more_due;
        }
        let now = time::OffsetDateTime::now_utc();
        let (outcome, attempt) = match claimed.url.strip_prefix(EXCHANGE_SCHEME) {
            Some(exchange) => self.publisher.send(&claimed, exchange, now).await,
            None => self.sender.send(&claimed, now).await,
        };
        let number = u32::try_from(claimed.attempts).unwrap_or(0) + 1;
        let (next, health) = verdict::judge(outcome, number, &self.config.rules, rand::random::<f64>());
        let (tenant_id, endpoint_id, event_id) = (claimed.tenant_id, claimed.endpoint_id, claimed.event_id);
        let record = Record { claimed, attempt, next, health };
        let recorded = self.records.submit((tenant_id, endpoint_id), record, |batch| self.record(batch)).await;
        match recorded {
            Some(Ok(Recording::Recorded { disabled })) => {
                metrics::delivery(next);
                if disabled {
                    metrics::endpoint_disabled(health);
                    tracing::warn!(endpoint.id = %endpoint_id, tenant.id = %tenant_id,
                        "an endpoint was disabled: no more events go to it until the merchant enables it");
                }
            }
            Some(Ok(Recording::LeaseLost)) => metrics::delivery_lease_lost(),
            Some(Err(error)) => {
                tracing::warn!(error = %telemetry::error_chain(&error), event.id = %event_id,
                    "cannot record a delivery attempt; its lease will run out and it is tried again");
            }
            None => {
                tracing::warn!(event.id = %event_id,
                    "a delivery attempt was not recorded; its lease will run out and it is tried again");
            }
        }
        more_due
    }

    /// Records `batch`, one endpoint's attempts waiting at this moment, in one transaction.
    async fn record(&self, batch: Vec<Record>) -> Vec<Result<Recording, Arc<StoreError>>> {
        let recorded = async {
            let mut conn = self.connections.acquire().await?;
            let recordings = merchant_deliveries::record(&mut conn, &self.config.worker_id, &batch).await?;
            conn.release();
            Ok::<_, StoreError>(recordings)
        }
        .await;
        match recorded {
            Ok(recordings) => recordings.into_iter().map(Ok).collect(),
            Err(error) => {
                let error = Arc::new(error);
                batch.iter().map(|_| Err(Arc::clone(&error))).collect()
            }
        }
    }
}

/// How much of a claim's `left` room the next of `tenants` (it included) with deliveries due may
/// take: an equal share, rounded up, so that one tenant's backlog leaves room for the others'. A
/// tenant that takes less leaves the rest to those after it.
fn tenant_share(left: u32, tenants: usize) -> u32 {
    left.div_ceil(u32::try_from(tenants).unwrap_or(u32::MAX).max(1))
}

/// The sender's `max_in_flight` slots, split between claims and hand-offs: half each, the odd one
/// to claims, so that one slot is a claim's.
fn split_slots(max_in_flight: u32) -> (u32, u32) {
    (max_in_flight - max_in_flight / 2, max_in_flight / 2)
}

/// How many deliveries a claim may take with `in_flight` of `max_in_flight` under way, at most
/// `batch_size`: none until half a batch of slots is free. A busy worker then claims in batches:
/// refilling one slot per delivery that ended cost a claim per delivery (BENCHMARKS.md, "Events to
/// merchants").
fn claim_room(max_in_flight: u32, batch_size: u32, in_flight: usize) -> u32 {
    let busy = u32::try_from(in_flight).unwrap_or(u32::MAX);
    let free = max_in_flight.saturating_sub(busy);
    let batch = batch_size.min(max_in_flight);
    if free < batch.div_ceil(2) { 0 } else { free.min(batch) }
}

/// Whether an attempt that may take `timeout`, started `since_claim` after the claim was asked
/// for, ends before a lease of `lease` from the claim runs out.
fn ends_within_lease(since_claim: Duration, timeout: Duration, lease: Duration) -> bool {
    since_claim.saturating_add(timeout) < lease
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_worker_claims_once_half_a_batch_of_slots_is_free() {
        assert_eq!(claim_room(64, 32, 0), 32);
        assert_eq!(claim_room(64, 32, 40), 24);
        assert_eq!(claim_room(64, 32, 48), 16);
        assert_eq!(claim_room(64, 32, 49), 0, "15 free slots wait for one more");
        assert_eq!(claim_room(64, 32, 64), 0);
        assert_eq!(claim_room(8, 8, 4), 4);
        assert_eq!(claim_room(8, 8, 5), 0);
        assert_eq!(claim_room(4, 32, 2), 2, "a batch is never larger than the worker's slots");
        assert_eq!(claim_room(1, 1, 0), 1);
        assert_eq!(claim_room(1, 1, 1), 0);
    }

    #[test]
    fn each_tenant_with_deliveries_due_gets_an_equal_share_of_a_claim() {
        assert_eq!(tenant_share(2, 2), 1, "two tenants, room for two: one each");
        assert_eq!(tenant_share(32, 3), 11);
        assert_eq!(tenant_share(21, 2), 11, "what the first took is no longer left");
        assert_eq!(tenant_share(5, 1), 5, "the last tenant may take what is left");
        assert_eq!(tenant_share(1, 4), 1, "never nothing while room is left");
        assert_eq!(tenant_share(0, 4), 0);
    }

    #[test]
    fn an_attempt_starts_only_if_it_ends_before_the_lease_can_run_out() {
        let (timeout, lease) = (Duration::from_secs(15), Duration::from_secs(60));
        assert!(ends_within_lease(Duration::ZERO, timeout, lease));
        assert!(ends_within_lease(Duration::from_secs(44), timeout, lease));
        assert!(!ends_within_lease(Duration::from_secs(45), timeout, lease));
        assert!(!ends_within_lease(Duration::from_secs(3600), timeout, lease));
        assert!(!ends_within_lease(Duration::MAX, timeout, lease));
    }
}
