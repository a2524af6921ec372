//! The drainer: claims due outbox rows, asks the provider to charge each one, and records what
//! happened.
//!
//! A send is a claim (its own short transaction), then the provider call with no transaction open,
//! then the recording, guarded by the fencing token. Any number of drainers, in any number of
//! processes, may run at once. The drainer never decides an outcome itself ([`verdict`]) and never
//! writes SQL itself ([`outbox`], [`record`]).
//!
//! [`verdict`]: crate::verdict
//! [`outbox`]: crate::outbox
//! [`record`]: crate::record

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::Context;
use futures::future::join_all;
use oncepay_domain::ids::TenantId;
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::KeyWindow;
use oncepay_provider::{PaymentProvider, SendOutcome};
use oncepay_service::backoff::Backoff;
use oncepay_service::group_commit::GroupCommits;
use oncepay_service::telemetry;
use oncepay_store::StoreError;
use oncepay_store::connections::Connections;
use oncepay_store::notify::{Notifier, PAYMENT_CHANNEL, Wakeups};
use sqlx::{Connection, PgPool};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::events::EventSender;
use crate::events::hand_off::{HandOff, Reserved};
use crate::metrics::{self, Kind};
use crate::record::{self, RecordError, Recorded, SettledSend};
use crate::rotation::Rotation;
use crate::verdict::{self, RetryPolicy, SendVerdict};
use crate::wake::{Wake, Woken};
use oncepay_store::sending::{self, ClaimRequest, Claimed};

/// How many times to retry recording a result after a transient failure (the database was briefly
/// unreachable, a deadlock). After that, the worker gives up and the sweeper takes the payment back
/// when the lease expires.
const RECORD_RETRIES: u32 = 4;

/// The delays between those retries: short, well inside any lease.
const RECORD_BACKOFF: Backoff = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(2) };

/// How a drainer runs.
#[derive(Debug, Clone)]
pub struct DrainerConfig {
    /// Names this worker in leases; its audit actor is `worker:<id>`.
    pub worker_id: String,
    /// Most rows one claim takes.
    pub batch_size: u32,
    /// Most provider calls in flight at once.
    pub max_in_flight: u32,
    /// How long a claimed row stays leased.
    pub lease: Duration,
    /// How often to look for due rows without a notification.
    pub poll_interval: Duration,
    /// How many claims one queued send gets while the provider cannot be reached.
    pub max_attempts: u32,
    /// Delays between those claims.
    pub backoff: Backoff,
    /// How long the provider deduplicates resends of a key.
    pub key_window: KeyWindow,
    /// How long in-flight sends may take to finish after shutdown.
    pub shutdown_grace: Duration,
}

/// What a drainer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Rows claimed.
    pub claimed: u64,
    /// Payments recorded `succeeded`.
    pub succeeded: u64,
    /// Payments recorded `failed` (declined, or the provider never reachable).
    pub failed: u64,
    /// Payments back to `pending` for a retry.
    pub retried: u64,
    /// Payments recorded `unknown`.
    pub unknown: u64,
    /// Results not recorded because the lease had been taken over.
    pub lease_lost: u64,
    /// Payments someone else had already settled; only the row was removed.
    pub superseded: u64,
    /// Results not recorded because of an error (the lease expires and the sweeper takes over).
    pub errors: u64,
}

impl Counts {
    fn count(&mut self, result: &Result<Recorded, RecordError>) {
        match result {
            Ok(Recorded::Moved(PaymentStatus::Succeeded)) => self.succeeded += 1,
            Ok(Recorded::Moved(PaymentStatus::Failed)) => self.failed += 1,
            Ok(Recorded::Moved(PaymentStatus::Pending)) => self.retried += 1,
            Ok(Recorded::Moved(PaymentStatus::Unknown)) => self.unknown += 1,
            // A send never moves a payment to these; the state machine would have refused it.
            Ok(Recorded::Moved(PaymentStatus::Processing | PaymentStatus::DeadLettered)) | Err(_) => self.errors += 1,
            Ok(Recorded::LeaseLost) => self.lease_lost += 1,
            Ok(Recorded::Superseded(_)) => self.superseded += 1,
        }
    }

    fn count_task(&mut self, finished: Result<Result<Recorded, RecordError>, tokio::task::JoinError>) {
        match finished {
            Ok(result) => self.count(&result),
            Err(error) => {
                tracing::error!(error = %error, "a send task ended abnormally; its lease will expire and be swept");
                self.errors += 1;
            }
        }
    }

    /// Sends that reached an outcome, recorded or not.
    pub fn finished(&self) -> u64 {
        self.succeeded + self.failed + self.retried + self.unknown + self.lease_lost + self.superseded + self.errors
    }
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, other: Self) {
        self.claimed += other.claimed;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.retried += other.retried;
        self.unknown += other.unknown;
        self.lease_lost += other.lease_lost;
        self.superseded += other.superseded;
        self.errors += other.errors;
    }
}

/// How one send task ended: what recording its outcome did.
type Sent = Result<Recorded, RecordError>;

/// Waits up to `grace` for the sends `in_flight` to finish, counting each into `totals`; aborts
/// those still running then. An aborted send keeps its lease, which the sweeper takes back.
async fn finish_in_flight(mut in_flight: JoinSet<Sent>, grace: Duration, totals: &mut Counts) {
    tracing::info!(in_flight = in_flight.len(), "stopped claiming; finishing the sends in flight");
    let deadline = Instant::now() + grace;
    while !in_flight.is_empty() {
        match tokio::time::timeout_at(deadline, in_flight.join_next()).await {
            Ok(Some(finished)) => totals.count_task(finished),
            Ok(None) => break,
            Err(_) => {
                tracing::warn!(
                    abandoned = in_flight.len(),
                    "the grace period ended with sends in flight; their leases will expire and be swept"
                );
                in_flight.abort_all();
                break;
            }
        }
    }
}

/// Drains the outbox into a provider. Cheap to clone; clones share everything.
pub struct Drainer<P> {
    inner: Arc<Inner<P>>,
}

impl<P> Clone for Drainer<P> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

struct Inner<P> {
    pool: PgPool,
    /// Claims' and recordings' connections (the drainer's own, or shared with the event sender):
    /// they skip the round trip sqlx's pool spends pinging a connection at every checkout and
    /// return (`oncepay_store::connections`). The pool serves the listener, the notifier and
    /// `/readyz`.
    connections: Arc<Connections>,
    /// One group commit per tenant, so that a recording transaction holds one tenant's payments:
    /// under Citus, one shard's.
    settlements: GroupCommits<TenantId, (Claimed, SendVerdict), Result<Recorded, RecordError>>,
    wakeups: Wakeups,
    /// The tenants to claim from, in turns.
    rotation: Mutex<Rotation>,
    /// Whether the next claim should scan the outbox for tenants with due rows first.
    rescan: AtomicBool,
    provider: P,
    config: DrainerConfig,
    actor: String,
    /// Where the deliveries of the events it writes go, leased to this worker: the worker's event
    /// sender ([`crate::events::hand_off`]). Without one, a claim takes them.
    hand_off: Option<HandOff>,
}

impl<P: PaymentProvider + 'static> Drainer<P> {
    /// A drainer on `pool`'s database that sends to `provider`. Claims and recordings use a set of
    /// connections of their own, as many as `pool` may open at most.
    pub fn new(pool: PgPool, provider: P, config: DrainerConfig) -> Self {
        let connections = Arc::new(Connections::like(&pool));
        Self::build(pool, connections, provider, config, None)
    }

    /// A drainer as [`Drainer::new`] makes, that hands the deliveries of the events it writes to
    /// `events` without a claim, and shares its connections: the worker's hot paths open at most
    /// as many as its pool may.
    pub fn handing_events_to(pool: PgPool, provider: P, config: DrainerConfig, events: &EventSender) -> Self {
        Self::build(pool, events.connections(), provider, config, Some(events.hand_off()))
    }

    fn build(
        pool: PgPool,
        connections: Arc<Connections>,
        provider: P,
        config: DrainerConfig,
        hand_off: Option<HandOff>,
    ) -> Self {
        let actor = format!("worker:{}", config.worker_id);
        let inner = Inner {
            pool,
            connections,
            settlements: GroupCommits::default(),
            wakeups: Wakeups::default(),
            rotation: Mutex::default(),
            rescan: AtomicBool::new(true),
            provider,
            config,
            actor,
            hand_off,
        };
        Self { inner: Arc::new(inner) }
    }

    /// How it runs.
    pub fn config(&self) -> &DrainerConfig {
        &self.inner.config
    }

    /// Its name in the audit trail: `worker:<id>`.
    pub fn actor(&self) -> &str {
        &self.inner.actor
    }

    /// Claims one batch (at most `batch_size`, and never more than `max_in_flight`), sends every row
    /// at once and records each outcome. Errs only if the claim fails; a recording that fails is
    /// counted in [`Counts::errors`].
    pub async fn run_once(&self) -> anyhow::Result<Counts> {
        let claimed = self.claim(self.claim_limit(0)).await.context("claiming due outbox rows")?;
        let mut counts = Counts { claimed: claimed.len() as u64, ..Counts::default() };
        for result in join_all(claimed.into_iter().map(|claimed| self.process(claimed))).await {
            counts.count(&result);
        }
        if let Err(error) = self.notifier().flush().await {
            tracing::warn!(error = %error, "cannot announce the recorded payments; long polls will find them by polling");
        }
        Ok(counts)
    }

    /// Drains until `shutdown` is cancelled, then finishes what is in flight within the grace
    /// period. Returns what it did.
    ///
    /// Keeps up to `max_in_flight` sends going, claiming as slots free up, woken by `LISTEN` with a
    /// polling fallback. At shutdown it stops claiming and gives the sends in flight the grace period
    /// to finish and be recorded; a send still running after that keeps its lease, which the sweeper
    /// takes back.
    pub async fn run(&self, shutdown: CancellationToken) -> Counts {
        let config = self.config();
        tracing::info!(worker.id = %config.worker_id, max_in_flight = config.max_in_flight, "draining the outbox");
        let wake = Wake::spawn(self.inner.pool.clone(), config.poll_interval);
        let announcing = CancellationToken::new();
        let notifier = tokio::spawn(self.notifier().run(announcing.clone()));
        let mut poll = tokio::time::interval(config.poll_interval);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut in_flight = JoinSet::new();
        let mut totals = Counts::default();
        // Whether a claim might find something: after a wake-up, a poll tick, or a full batch.
        let mut maybe_due = true;

        while !shutdown.is_cancelled() {
            let limit = self.claim_limit(in_flight.len());
            if maybe_due && limit > 0 {
                maybe_due = self.claim_and_send(limit, &mut in_flight, &mut totals).await;
                // A full batch and slots still free: claim the next batch at once.
                if maybe_due && self.claim_limit(in_flight.len()) > 0 {
                    continue;
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => {}
                Some(finished) = in_flight.join_next() => {
                    totals.count_task(finished);
                    while let Some(finished) = in_flight.try_join_next() {
                        totals.count_task(finished);
                    }
                }
                () = wake.notified() => {
                    self.heard(wake.take());
                    maybe_due = true;
                }
                _ = poll.tick() => {
                    // Tenants no wake-up named (their rows queued again, or a notification lost).
                    self.inner.rescan.store(true, Ordering::Release);
                    maybe_due = true;
                }
            }
        }

        drop(wake);
        finish_in_flight(in_flight, config.shutdown_grace, &mut totals).await;
        announcing.cancel();
        if let Err(error) = notifier.await {
            tracing::error!(error = %error, "the payment notifier task failed");
        }
        tracing::info!(?totals, "the drainer stopped");
        totals
    }

    /// Claims up to `limit` due rows and starts sending each into `in_flight`. Returns whether the
    /// next claim might find more: after a full batch.
    async fn claim_and_send(&self, limit: u32, in_flight: &mut JoinSet<Sent>, totals: &mut Counts) -> bool {
        match self.claim(limit).await {
            Ok(claimed) => {
                let full = claimed.len() == limit as usize;
                totals.claimed += claimed.len() as u64;
                for row in claimed {
                    let this = self.clone();
                    in_flight.spawn(async move { this.process(row).await });
                }
                full
            }
            Err(error) => {
                // Most likely the database is unreachable: try again at the next poll tick.
                tracing::warn!(error = %telemetry::error_chain(&error), "claiming due outbox rows failed");
                false
            }
        }
    }

    /// Takes the tenants a wake-up named into the rotation, and asks for a scan of the outbox if
    /// one named no one.
    fn heard(&self, woken: Woken) {
        let mut rotation = self.rotation();
        for tenant in woken.tenants {
            rotation.add(tenant);
        }
        if woken.scan {
            self.inner.rescan.store(true, Ordering::Release);
        }
    }

    /// Claims up to `limit` due rows for this worker: lease, fencing token and `pending → processing`,
    /// committed before any of them is sent.
    ///
    /// Each claim statement names one tenant. The tenants with due rows take turns, each getting an
    /// equal share of `limit` ([`Rotation`]); they are the ones wake-ups named, and those a scan of
    /// the outbox finds when the rotation is empty or a poll tick or a nameless wake-up asked for one.
    /// Rows claimed before a statement fails are returned, not lost: they are leased to this worker.
    pub async fn claim(&self, limit: u32) -> Result<Vec<Claimed>, StoreError> {
        let config = self.config();
        let mut conn = self.inner.connections.acquire().await?;
        if self.inner.rescan.swap(false, Ordering::AcqRel) || self.rotation().is_empty() {
            match sending::due_tenants(&mut conn).await {
                Ok(tenants) => tenants.into_iter().for_each(|tenant| self.rotation().add(tenant)),
                Err(error) => {
                    self.inner.rescan.store(true, Ordering::Release);
                    return Err(error);
                }
            }
        }
        let mut claimed = Vec::new();
        let mut remaining = limit;
        self.rotation().begin();
        loop {
            // Not in the loop's condition: the lock would be held through the body.
            let next = self.rotation().next(remaining);
            let Some(turn) = next else { break };
            let request = ClaimRequest {
                tenant_id: turn.tenant,
                limit: turn.share,
                worker_id: &config.worker_id,
                actor: self.actor(),
                lease: config.lease,
                resend_horizon: config.key_window.resend_horizon(),
            };
            match sending::claim(&mut conn, &request).await {
                Ok(rows) => {
                    remaining = remaining.saturating_sub(u32::try_from(rows.len()).unwrap_or(u32::MAX));
                    self.rotation().done(turn, rows.len());
                    claimed.extend(rows);
                }
                Err(error) => {
                    // Its turn comes again at the next claim.
                    self.rotation().add(turn.tenant);
                    if claimed.is_empty() {
                        return Err(error);
                    }
                    tracing::warn!(error = %telemetry::error_chain(&error), tenant.id = %turn.tenant, "claiming from a tenant failed; sending what was claimed");
                    metrics::claimed(Kind::Payment, claimed.len());
                    return Ok(claimed);
                }
            }
        }
        conn.release();
        metrics::claimed(Kind::Payment, claimed.len());
        Ok(claimed)
    }

    fn rotation(&self) -> MutexGuard<'_, Rotation> {
        self.inner.rotation.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends one claimed payment to the provider. Never fails: every way it can go is an outcome. The
    /// downstream idempotency key is derived from the payment id, so every resend carries the same one.
    pub async fn send(&self, claimed: &Claimed) -> SendOutcome {
        let started = Instant::now();
        let outcome = self.inner.provider.create_charge(&claimed.charge_request()).await;
        metrics::provider_outcome(Kind::Payment, outcome.class(), started.elapsed());
        outcome
    }

    /// What to record for `outcome`.
    pub fn decide(&self, claimed: &Claimed, outcome: &SendOutcome) -> SendVerdict {
        let policy = RetryPolicy { max_attempts: self.config().max_attempts, backoff: self.config().backoff };
        verdict::decide(claimed, outcome, &policy, &mut rand::rng())
    }

    /// Records `verdict` under `claimed`'s fencing token and announces a payment that moved. A
    /// terminal verdict is recorded in one transaction with every other one of the same tenant that
    /// is waiting to be recorded at that moment ([`GroupCommits`]); a retry or an uncertain outcome
    /// in a transaction of its own. A recording that fails for a transient reason is retried a few times.
    #[tracing::instrument(name = "worker.record", skip_all, fields(payment.id = %claimed.payment_id, decision = verdict.label()))]
    pub async fn record(&self, claimed: &Claimed, verdict: &SendVerdict) -> Result<Recorded, RecordError> {
        let result = if SettledSend::of(claimed, verdict).is_some() {
            let queued = (claimed.clone(), verdict.clone());
            let settlements = &self.inner.settlements;
            let settled = settlements.submit(claimed.tenant_id, queued, |batch| self.record_together(batch)).await;
            settled.unwrap_or(Err(RecordError::Abandoned))
        } else {
            self.retrying(|| self.record_alone(claimed, verdict)).await
        };
        // Announced after the commit, many payments per notification: a `NOTIFY` in each recording
        // would make their commits wait for one another (`oncepay_store::notify`).
        if let Ok(Recorded::Moved(_)) = result {
            self.inner.wakeups.announce(claimed.payment_id);
        }
        result
    }

    /// Records `batch` in one transaction. If that fails for a reason other than an unavailable
    /// database (a payment in a status it cannot be in, a row the database refuses), records each on
    /// its own, so that one payment's problem does not keep the others from being recorded.
    async fn record_together(&self, batch: Vec<(Claimed, SendVerdict)>) -> Vec<Result<Recorded, RecordError>> {
        let settlements: Option<Vec<SettledSend<'_>>> =
            batch.iter().map(|(claimed, verdict)| SettledSend::of(claimed, verdict)).collect();
        if let Some(settlements) = settlements.filter(|s| s.len() > 1) {
            match self.retrying(|| self.record_settlements(&settlements)).await {
                Ok(recorded) => return recorded.into_iter().map(Ok).collect(),
                // The database is still unavailable after the retries: so it is for each of them.
                Err(error) if error.is_transient() => {
                    let error = Arc::new(error);
                    return batch.iter().map(|_| Err(RecordError::Together(Arc::clone(&error)))).collect();
                }
                Err(error) => tracing::warn!(
                    error = %telemetry::error_chain(&error),
                    sends = batch.len(),
                    "recording sends together failed; recording them one by one"
                ),
            }
        }
        let mut results = Vec::with_capacity(batch.len());
        for (claimed, verdict) in &batch {
            results.push(self.retrying(|| self.record_alone(claimed, verdict)).await);
        }
        results
    }

    /// Runs `attempt` until it succeeds, fails for a reason that is not transient, or has been retried
    /// [`RECORD_RETRIES`] times.
    async fn retrying<T, A, F>(&self, attempt: A) -> Result<T, RecordError>
    where
        A: Fn() -> F,
        F: Future<Output = Result<T, RecordError>>,
    {
        let mut retry = 0;
        loop {
            match attempt().await {
                Err(error) if error.is_transient() && retry < RECORD_RETRIES => {
                    retry += 1;
                    let delay = RECORD_BACKOFF.delay(retry, &mut rand::rng());
                    tracing::warn!(error = %telemetry::error_chain(&error), retry, delay_ms = delay.as_millis(), "recording failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                result => return result,
            }
        }
    }

    async fn record_alone(&self, claimed: &Claimed, verdict: &SendVerdict) -> Result<Recorded, RecordError> {
        let mut conn = self.inner.connections.acquire().await?;
        let reserved = self.inner.hand_off.as_ref().and_then(|hand_off| hand_off.reserve(1));
        let lease = reserved.as_ref().map(Reserved::lease);
        let (recorded, leased) =
            record::record(conn.begin().await?, self.actor(), claimed, verdict, lease.as_ref()).await?;
        conn.release();
        if let Some(reserved) = reserved {
            reserved.hand(leased);
        }
        Ok(recorded)
    }

    async fn record_settlements(&self, settlements: &[SettledSend<'_>]) -> Result<Vec<Recorded>, RecordError> {
        let mut conn = self.inner.connections.acquire().await?;
        let reserved = self.inner.hand_off.as_ref().and_then(|hand_off| hand_off.reserve(settlements.len()));
        let lease = reserved.as_ref().map(Reserved::lease);
        let (recorded, leased) =
            record::record_settlements(conn.begin().await?, self.actor(), settlements, lease.as_ref()).await?;
        conn.release();
        if let Some(reserved) = reserved {
            reserved.hand(leased);
        }
        Ok(recorded)
    }

    /// The sender of this drainer's announcements to long polls.
    fn notifier(&self) -> Notifier {
        Notifier::new(self.inner.pool.clone(), PAYMENT_CHANNEL, self.inner.wakeups.clone())
    }

    /// Sends one claimed payment (unless a send could charge twice) and records the outcome, in the
    /// trace of the request that created it, so the provider call carries that trace's `traceparent`.
    pub async fn process(&self, claimed: Claimed) -> Result<Recorded, RecordError> {
        let span = tracing::info_span!(
            "worker.process",
            payment.id = %claimed.payment_id,
            tenant.id = %claimed.tenant_id,
            attempt = claimed.attempt,
            // Named `decision` in traces, as docs/operating.md ("Traces") documents.
            decision = tracing::field::Empty,
        );
        if let Some(trace) = &claimed.trace {
            telemetry::continue_trace(&span, trace);
        }
        async {
            // The lease is held and the payment is `processing`; nothing sent yet.
            #[cfg(feature = "failpoints")]
            fail::fail_point!("worker::after_claim", |_| oncepay_service::failpoints::crash("worker::after_claim"));
            let verdict = if claimed.send_is_safe() {
                let outcome = self.send(&claimed).await;
                // The provider has responded; nothing recorded yet.
                #[cfg(feature = "failpoints")]
                fail::fail_point!("worker::after_provider", |_| oncepay_service::failpoints::crash(
                    "worker::after_provider"
                ));
                self.decide(&claimed, &outcome)
            } else {
                verdict::key_window_passed()
            };
            tracing::Span::current().record("decision", verdict.label());
            let result = self.record(&claimed, &verdict).await;
            // The outcome is committed.
            #[cfg(feature = "failpoints")]
            fail::fail_point!("worker::after_record", |_| oncepay_service::failpoints::crash("worker::after_record"));
            self.report(&claimed, &verdict, &result);
            result
        }
        .instrument(span)
        .await
    }

    fn report(&self, claimed: &Claimed, verdict: &SendVerdict, result: &Result<Recorded, RecordError>) {
        match result {
            Ok(Recorded::Moved(status)) => {
                if *status != PaymentStatus::Pending {
                    metrics::drained(Kind::Payment, claimed.accepted_at);
                }
                match verdict {
                    SendVerdict::Settle { reason, .. } | SendVerdict::Retry { reason, .. } => {
                        tracing::info!(payment.status = status.as_str(), %reason, "recorded the send's outcome");
                    }
                    SendVerdict::Uncertain { code, reason, .. } => {
                        tracing::warn!(payment.status = status.as_str(), %code, %reason, "the send's outcome is uncertain; queued for the reconciler");
                    }
                }
            }
            Ok(Recorded::LeaseLost) => {
                metrics::lease_lost(Kind::Payment);
                tracing::warn!(
                    fencing_token = claimed.fencing_token,
                    "the lease was taken over before the outcome could be recorded; recorded nothing"
                );
            }
            Ok(Recorded::Superseded(status)) => {
                tracing::info!(
                    payment.status = status.as_str(),
                    "the payment had already been settled by someone else"
                );
            }
            Err(error) => {
                metrics::record_error(Kind::Payment);
                tracing::error!(
                    error = %telemetry::error_chain(error),
                    "could not record the send's outcome; the lease will expire and be swept"
                );
            }
        }
    }

    /// How many rows the next claim may take with `in_flight` sends running.
    fn claim_limit(&self, in_flight: usize) -> u32 {
        let free = (self.config().max_in_flight as usize).saturating_sub(in_flight);
        u32::try_from(free).unwrap_or(u32::MAX).min(self.config().batch_size)
    }
}
