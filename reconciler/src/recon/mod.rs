//! Ledger reconciliation: compares the provider's charges and refunds with our ledger over a window
//! of time and records each discrepancy by class, nightly (tokio-cron-scheduler) and on demand
//! (`recon run`). A charge or refund the provider has not finished is kept ([`unfinished`],
//! [`unfinished_refunds`]) and read again by every later run until it is final, then compared like
//! those of that run's window.
//!
//! Runs only read payments, refunds and ledger entries: discrepancies are for operators, and nothing
//! here corrects anything.

pub mod compare;
mod ledger;
pub mod refunds;
pub mod runs;
pub mod unfinished;
pub mod unfinished_refunds;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_provider::{
    Charge, ListCharges, ListRefunds, PaymentProvider, Refund, RefundState, Retrieved, UnfinishedCharge,
};
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use oncepay_service::runner::Pass;
use oncepay_service::telemetry;
use oncepay_store::recon_runs::{Claim, Class, Discrepancy, RunStatus, Trigger, Window};

/// The reconciliation's settings.
#[derive(Debug, Clone)]
pub struct ReconConfig {
    /// Six-field cron expression (UTC) for the nightly run.
    pub schedule: String,
    /// Charges (and refunds) per provider page.
    pub page_size: u32,
    /// A running run whose heartbeat is older than this may be taken over.
    pub stale_after: Duration,
    /// How often the reconciler looks for a run an operator queued.
    pub queue_interval: Duration,
    /// How many previous days the nightly job makes sure are reconciled (1: yesterday only).
    pub catch_up_days: u32,
    /// Whether payments are charged (and refunded) in tenants' connected accounts (Stripe
    /// Connect): each of those is listed, rather than only oncepay's own account.
    pub connected_accounts: bool,
}

/// What one run found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The run.
    pub run_id: Uuid,
    /// Provider charges compared.
    pub provider_charges: usize,
    /// Ledger entries compared.
    pub ledger_entries: usize,
    /// Provider refunds compared.
    pub provider_refunds: usize,
    /// Refund ledger entries compared.
    pub refund_ledger_entries: usize,
    /// Discrepancies per class (every class present).
    pub by_class: Vec<(Class, usize)>,
}

/// What asking to reconcile a window did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// This process ran it.
    Completed(Summary),
    /// Another run holds the window (running or completed).
    AlreadyClaimed {
        /// That run.
        run_id: Uuid,
        /// Its status: running or completed.
        status: RunStatus,
    },
}

/// The reconciliation loop.
pub struct Reconciliation<P> {
    pool: PgPool,
    provider: P,
    config: ReconConfig,
}

impl<P: PaymentProvider + 'static> Reconciliation<P> {
    /// Reconciliation over `pool` and `provider`.
    pub fn new(pool: PgPool, provider: P, config: ReconConfig) -> Self {
        Self { pool, provider, config }
    }

    /// Runs the nightly job on its schedule until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut scheduler = JobScheduler::new().await.context("cannot start the scheduler")?;
        let this = Arc::clone(&self);
        let job = Job::new_async(self.config.schedule.as_str(), move |_, _| {
            let this = Arc::clone(&this);
            Box::pin(async move {
                if let Err(error) = this.run_once().await {
                    metrics::counter!(crate::metrics::LOOP_ERRORS, "loop" => "recon").increment(1);
                    tracing::error!(error = format!("{error:#}"), "nightly reconciliation failed");
                }
            })
        })
        .with_context(|| format!("recon.schedule {:?} is not a six-field cron expression", self.config.schedule))?;
        scheduler.add(job).await.context("cannot schedule the nightly reconciliation")?;
        scheduler.start().await.context("cannot start the scheduler")?;
        tracing::info!(schedule = %self.config.schedule, "nightly reconciliation scheduled");
        shutdown.cancelled().await;
        scheduler.shutdown().await.context("cannot stop the scheduler")?;
        tracing::info!("nightly reconciliation stopped");
        Ok(())
    }

    /// The nightly job: reconciles each of the last `catch_up_days` UTC days that has no live or
    /// completed run, oldest first (yesterday, and any earlier day whose run failed).
    pub async fn run_once(&self) -> anyhow::Result<Vec<Reconciled>> {
        let today = OffsetDateTime::now_utc();
        let mut results = Vec::new();
        for days_back in (1..=self.config.catch_up_days.max(1)).rev() {
            let window = Window::previous_day(today - time::Duration::days(i64::from(days_back) - 1));
            results.push(self.run_window(window, Trigger::Schedule).await?);
        }
        Ok(results)
    }

    /// Reconciles one window, unless another run holds it.
    ///
    /// The window is claimed first ([`runs::claim`]): with several reconcilers, one wins and the
    /// others skip. A failure marks the run `failed`, which frees the window for a later attempt.
    #[tracing::instrument(name = "recon.run", skip_all, fields(window.start = %window.start, window.end = %window.end, run.id))]
    pub async fn run_window(&self, window: Window, trigger: Trigger) -> anyhow::Result<Reconciled> {
        let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
        let run_id = match runs::claim(&mut conn, &window, trigger, self.config.stale_after).await? {
            Claim::Won(run_id) => run_id,
            Claim::Taken { run_id, status } => {
                tracing::info!(run.id = %run_id, run.status = %status, "the window is already reconciled or in progress");
                return Ok(Reconciled::AlreadyClaimed { run_id, status });
            }
        };
        self.work(&mut conn, run_id, &window).await.map(Reconciled::Completed)
    }

    /// Runs the oldest run an operator queued, if there is one; `Ok(true)` when it ran one, so
    /// another may be waiting.
    #[tracing::instrument(name = "recon.queued", skip_all, fields(window.start, window.end, run.id))]
    pub async fn run_queued(&self) -> anyhow::Result<bool> {
        let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
        let Some((run_id, window)) = runs::start_queued(&mut conn).await? else {
            return Ok(false);
        };
        let span = tracing::Span::current();
        span.record("window.start", tracing::field::display(window.start));
        span.record("window.end", tracing::field::display(window.end));
        self.work(&mut conn, run_id, &window).await?;
        Ok(true)
    }

    /// Works run `run_id`, which this process holds: completes it with what it found, or marks it
    /// failed.
    async fn work(&self, conn: &mut PgConnection, run_id: Uuid, window: &Window) -> anyhow::Result<Summary> {
        tracing::Span::current().record("run.id", tracing::field::display(run_id));
        tracing::info!("reconciliation started");
        match self.reconcile(conn, run_id, window).await {
            Ok(summary) => {
                for (class, n) in &summary.by_class {
                    metrics::counter!(crate::metrics::RECON_DISCREPANCIES, "class" => class.as_str())
                        .increment(*n as u64);
                }
                tracing::info!(
                    provider_charges = summary.provider_charges,
                    ledger_entries = summary.ledger_entries,
                    provider_refunds = summary.provider_refunds,
                    refund_ledger_entries = summary.refund_ledger_entries,
                    discrepancies = summary.by_class.iter().map(|(_, n)| n).sum::<usize>(),
                    "reconciliation completed"
                );
                metrics::counter!(crate::metrics::RECON_RUNS, "status" => "completed").increment(1);
                Ok(summary)
            }
            Err(error) => {
                metrics::counter!(crate::metrics::RECON_RUNS, "status" => "failed").increment(1);
                let reason = format!("{error:#}");
                if let Err(not_recorded) = runs::fail(conn, run_id, &reason).await {
                    tracing::error!(error = format!("{not_recorded:#}"), "cannot mark the run failed");
                }
                Err(error.context(format!("reconciliation run {run_id} failed")))
            }
        }
    }

    /// Compares the charges, then the refunds, of the window and of earlier runs' unfinished ones,
    /// and stores the discrepancies, the counts and what is still unfinished in one transaction.
    async fn reconcile(&self, conn: &mut PgConnection, run_id: Uuid, window: &Window) -> anyhow::Result<Summary> {
        let accounts = self.accounts(conn, window).await?;
        let charges = self.compare_charges(conn, run_id, window, &accounts).await?;
        let refunds = self.compare_refunds(conn, run_id, window, &accounts).await?;
        let found: Vec<Discrepancy> = charges.found.iter().chain(&refunds.found).cloned().collect();
        let counts = runs::Counts {
            provider_charges: charges.compared,
            ledger_entries: charges.in_window,
            provider_refunds: refunds.compared,
            refund_ledger_entries: refunds.in_window,
        };
        let charges_kept = runs::Unfinished { still: &charges.still, settled: &charges.settled };
        let refunds_kept = runs::Unfinished { still: &refunds.still, settled: &refunds.settled };
        runs::complete(conn, run_id, &counts, &found, &charges_kept, &refunds_kept).await?;
        let by_class =
            Class::ALL.iter().map(|class| (*class, found.iter().filter(|d| d.class == *class).count())).collect();
        Ok(Summary {
            run_id,
            provider_charges: counts.provider_charges,
            ledger_entries: counts.ledger_entries,
            provider_refunds: counts.provider_refunds,
            refund_ledger_entries: counts.refund_ledger_entries,
            by_class,
        })
    }

    /// Pages through the provider's charges created in the window, reads again the charges earlier
    /// runs left unfinished, reads the ledger entries that may match them all, and compares the two
    /// sides.
    async fn compare_charges(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        window: &Window,
        accounts: &[Option<ProviderAccount>],
    ) -> anyhow::Result<Compared<UnfinishedCharge>> {
        let listed = self.provider_charges(conn, run_id, window, accounts).await?;
        let reread = self.read_unfinished_again(conn, run_id).await?;
        let mut charges: HashMap<String, Charge> = HashMap::new();
        charges.extend(listed.charges.into_iter().chain(reread.finished).map(|c| (c.id.clone(), c)));
        let mut charges: Vec<Charge> = charges.into_values().collect();
        charges.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        // A charge listed unfinished and also read final (an overlapping window) is final.
        let mut still: HashMap<String, UnfinishedCharge> = HashMap::new();
        still.extend(listed.unfinished.into_iter().chain(reread.still).map(|u| (u.id.clone(), u)));
        still.retain(|id, _| !charges.iter().any(|c| &c.id == id));
        let mut still: Vec<UnfinishedCharge> = still.into_values().collect();
        still.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        let ledger = ledger::charge_entries(conn, window, &charges).await?;
        runs::heartbeat(conn, run_id).await?;
        let mut found = compare::compare(&charges, &ledger);
        found.extend(still.iter().map(compare::unfinished));
        Ok(Compared {
            compared: charges.len(),
            in_window: ledger.iter().filter(|e| e.in_window).count(),
            found,
            still,
            settled: reread.settled,
        })
    }

    /// Pages through the provider's refunds created in the window, reads again the refunds earlier
    /// runs left unfinished, reads the refunds and refund ledger entries that may match them all, and
    /// compares the two sides.
    async fn compare_refunds(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        window: &Window,
        accounts: &[Option<ProviderAccount>],
    ) -> anyhow::Result<Compared<Refund>> {
        let listed = self.provider_refunds(conn, run_id, window, accounts).await?;
        let open = unfinished_refunds::open(conn).await?;
        let open_ids: Vec<String> = open.iter().map(|o| o.last_seen.id.clone()).collect();
        let reread = self.read_unfinished_refunds_again(conn, run_id, open).await?;
        // A refund seen both unfinished and final (an overlapping window, a read that failed) is final.
        let mut by_id: HashMap<String, Refund> = HashMap::new();
        for refund in listed.into_iter().chain(reread) {
            match by_id.get(&refund.id) {
                Some(seen) if seen.status != RefundState::Pending => {}
                _ => {
                    by_id.insert(refund.id.clone(), refund);
                }
            }
        }
        let mut refunds: Vec<Refund> = by_id.into_values().collect();
        refunds.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        let (still, finished): (Vec<&Refund>, Vec<&Refund>) =
            refunds.iter().partition(|r| r.status == RefundState::Pending);
        let final_ids: HashSet<&str> = finished.iter().map(|r| r.id.as_str()).collect();
        let settled: Vec<String> = open_ids.into_iter().filter(|id| final_ids.contains(id.as_str())).collect();
        let ours = ledger::refunds(conn, window, &refunds).await?;
        runs::heartbeat(conn, run_id).await?;
        let mut found = refunds::compare(&refunds, &ours);
        found.extend(still.iter().map(|r| refunds::unfinished(r)));
        Ok(Compared {
            compared: finished.len(),
            in_window: ours.iter().filter(|o| o.entry.as_ref().is_some_and(|e| e.in_window)).count(),
            found,
            still: still.into_iter().cloned().collect(),
            settled,
        })
    }

    /// Every charge the provider created in the window, in every account a charge of oncepay's may
    /// be in, page by page, proving the run alive after each page. No transaction is open during a
    /// provider call.
    async fn provider_charges(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        window: &Window,
        accounts: &[Option<ProviderAccount>],
    ) -> anyhow::Result<Listed> {
        let mut charges: Vec<Charge> = Vec::new();
        let mut unfinished: Vec<UnfinishedCharge> = Vec::new();
        for account in accounts {
            let mut query = ListCharges {
                account: account.clone(),
                created_gte: window.start.unix_timestamp(),
                created_lt: window.end.unix_timestamp(),
                starting_after: None,
                limit: self.config.page_size,
            };
            loop {
                let page = self.provider.list_charges(&query).await.with_context(|| match &query.account {
                    Some(account) => format!("cannot list the provider's charges in account {account}"),
                    None => "cannot list the provider's charges".to_owned(),
                })?;
                runs::heartbeat(conn, run_id).await?;
                unfinished.extend(page.unfinished);
                let Some(last) = page.data.last() else { break };
                query.starting_after = Some(last.id.clone());
                let more = page.has_more;
                charges.extend(page.data);
                if !more {
                    break;
                }
            }
        }
        Ok(Listed { charges, unfinished })
    }

    /// Reads again, by id, every charge earlier runs left unfinished, proving the run alive after
    /// each. A charge that cannot be read now stays open, as unfinished.
    async fn read_unfinished_again(&self, conn: &mut PgConnection, run_id: Uuid) -> anyhow::Result<Reread> {
        let mut reread = Reread::default();
        for open in unfinished::open(conn).await? {
            let id = open.last_seen.id.clone();
            match self.provider.retrieve(&id, open.account.as_ref()).await {
                Ok(Retrieved::Final(charge)) => {
                    reread.settled.push(id);
                    reread.finished.push(charge);
                }
                Ok(Retrieved::Unfinished(charge)) => reread.still.push(charge),
                // Reported again as it was last seen, and read again next time.
                Ok(Retrieved::Missing) => {
                    tracing::warn!(charge.id = %id, "the provider no longer finds a charge it had not finished");
                    reread.still.push(open.last_seen);
                }
                Err(error) => {
                    tracing::warn!(charge.id = %id, error = %telemetry::error_chain(&error), "cannot read an unfinished charge again; it stays open");
                    reread.still.push(open.last_seen);
                }
            }
            runs::heartbeat(conn, run_id).await?;
        }
        Ok(reread)
    }

    /// Every refund the provider created in the window, in every state, in every account a refund
    /// of oncepay's may be in, page by page, proving the run alive after each page. No transaction is
    /// open during a provider call.
    async fn provider_refunds(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        window: &Window,
        accounts: &[Option<ProviderAccount>],
    ) -> anyhow::Result<Vec<Refund>> {
        let mut refunds: Vec<Refund> = Vec::new();
        for account in accounts {
            let mut query = ListRefunds {
                account: account.clone(),
                created_gte: window.start.unix_timestamp(),
                created_lt: window.end.unix_timestamp(),
                starting_after: None,
                limit: self.config.page_size,
            };
            loop {
                let page = self.provider.list_refunds(&query).await.with_context(|| match &query.account {
                    Some(account) => format!("cannot list the provider's refunds in account {account}"),
                    None => "cannot list the provider's refunds".to_owned(),
                })?;
                runs::heartbeat(conn, run_id).await?;
                let Some(last) = page.data.last() else { break };
                query.starting_after = Some(last.id.clone());
                let more = page.has_more;
                refunds.extend(page.data);
                if !more {
                    break;
                }
            }
        }
        Ok(refunds)
    }

    /// Reads again, by id, every refund in `open` (those earlier runs left unfinished), proving the
    /// run alive after each: each as it stands now, or as it was last seen when it cannot be read
    /// now (it then stays open).
    async fn read_unfinished_refunds_again(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        open: Vec<unfinished_refunds::OpenRefund>,
    ) -> anyhow::Result<Vec<Refund>> {
        let mut reread = Vec::with_capacity(open.len());
        for open in open {
            let id = open.last_seen.id.clone();
            match self.provider.retrieve_refund(&id, open.account.as_ref()).await {
                Ok(Some(refund)) => reread.push(refund),
                // Reported again as it was last seen, and read again next time.
                Ok(None) => {
                    tracing::warn!(refund.id = %id, "the provider no longer finds a refund it had not finished");
                    reread.push(open.last_seen);
                }
                Err(error) => {
                    tracing::warn!(refund.id = %id, error = %telemetry::error_chain(&error), "cannot read an unfinished refund again; it stays open");
                    reread.push(open.last_seen);
                }
            }
            runs::heartbeat(conn, run_id).await?;
        }
        Ok(reread)
    }

    /// The provider accounts to list for `window`: oncepay's own, unless payments are charged in
    /// connected accounts; then every account connected to a tenant now, and every account (oncepay's
    /// own among them) that a ledger or refund ledger entry of the window was booked in, so an
    /// account an operator has since replaced is still read for the days it was charged or refunded
    /// in.
    async fn accounts(&self, conn: &mut PgConnection, window: &Window) -> anyhow::Result<Vec<Option<ProviderAccount>>> {
        if !self.config.connected_accounts {
            return Ok(vec![None]);
        }
        let accounts = sqlx::query_scalar!(
            r#"
            SELECT provider_account AS "account: ProviderAccount" FROM tenants WHERE provider_account IS NOT NULL
            UNION
            SELECT p.provider_account FROM ledger_entries l JOIN payments p USING (tenant_id, payment_id)
            WHERE l.charged_at >= $1 AND l.charged_at < $2
            UNION
            SELECT p.provider_account FROM refund_ledger_entries l JOIN payments p USING (tenant_id, payment_id)
            WHERE l.refunded_at >= $1 AND l.refunded_at < $2
            "#,
            window.start,
            window.end,
        )
        .fetch_all(conn)
        .await
        .context("cannot read the provider accounts to reconcile")?;
        Ok(accounts)
    }
}

/// The runs operators queue, as a background loop: each pass runs the oldest one.
pub struct QueuedRuns<P>(pub Arc<Reconciliation<P>>);

impl<P: PaymentProvider + 'static> Pass for QueuedRuns<P> {
    const NAME: &'static str = "recon_queue";

    fn interval(&self) -> Duration {
        self.0.config.queue_interval
    }

    async fn pass(&self) -> anyhow::Result<bool> {
        self.0.run_queued().await
    }
}

/// What the listing of a window found.
struct Listed {
    /// Final charges.
    charges: Vec<Charge>,
    /// Charges the provider has not finished.
    unfinished: Vec<UnfinishedCharge>,
}

/// What comparing one side of a window (charges or refunds) found, to record with the run.
struct Compared<T> {
    /// The provider's finished objects compared.
    compared: usize,
    /// The ledger entries of the window compared.
    in_window: usize,
    /// The discrepancies.
    found: Vec<Discrepancy>,
    /// What the provider has not finished yet: kept open.
    still: Vec<T>,
    /// The ids of those open from an earlier run and now final: closed.
    settled: Vec<String>,
}

/// What reading earlier runs' unfinished charges again found.
#[derive(Default)]
struct Reread {
    /// Those now final.
    finished: Vec<Charge>,
    /// Their ids: their rows close with this run.
    settled: Vec<String>,
    /// Those still unfinished.
    still: Vec<UnfinishedCharge>,
}
