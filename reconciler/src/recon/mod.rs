//! Ledger reconciliation: compares the provider's charges with our ledger over a window of time and
//! records each discrepancy by class, nightly (tokio-cron-scheduler) and on demand (`recon run`).
//! A charge the provider has not finished is kept ([`unfinished`]) and read again by every later run
//! until it is final, then compared like the charges of that run's window.
//!
//! Runs only read payments and ledger entries: discrepancies are for operators, and nothing here
//! corrects anything.

pub mod commands;
pub mod compare;
pub mod runs;
pub mod unfinished;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_provider::{Charge, ListCharges, PaymentProvider, Retrieved, UnfinishedCharge};
use sqlx::{PgConnection, PgPool};
use time::{Date, OffsetDateTime, Time};
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::recon::compare::{Class, LedgerEntry};
use crate::recon::runs::{Claim, RunStatus, Trigger};

/// A half-open window of time, `[start, end)`, in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Inclusive.
    pub start: OffsetDateTime,
    /// Exclusive.
    pub end: OffsetDateTime,
}

/// A window that ends before it starts, or is not in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a reconciliation window must start before it ends, on whole seconds")]
pub struct BadWindow;

impl Window {
    /// Checks the bounds.
    pub fn new(start: OffsetDateTime, end: OffsetDateTime) -> Result<Self, BadWindow> {
        if start < end && start.nanosecond() == 0 && end.nanosecond() == 0 {
            Ok(Self { start, end })
        } else {
            Err(BadWindow)
        }
    }

    /// The UTC day `date`.
    pub fn day(date: Date) -> Self {
        let start = date.with_time(Time::MIDNIGHT).assume_utc();
        Self { start, end: start + time::Duration::DAY }
    }

    /// The UTC day before the one containing `now`.
    pub fn previous_day(now: OffsetDateTime) -> Self {
        Self::day(now.to_offset(time::UtcOffset::UTC).date().previous_day().unwrap_or(Date::MIN))
    }
}

/// The reconciliation's settings.
#[derive(Debug, Clone)]
pub struct ReconConfig {
    /// Six-field cron expression (UTC) for the nightly run.
    pub schedule: String,
    /// Charges per provider page.
    pub page_size: u32,
    /// A running run whose heartbeat is older than this may be taken over.
    pub stale_after: Duration,
    /// How many previous days the nightly job makes sure are reconciled (1: yesterday only).
    pub catch_up_days: u32,
    /// Whether payments are charged in tenants' connected accounts (Stripe Connect): each of those
    /// is listed, rather than only oncepay's own account.
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
        tracing::Span::current().record("run.id", tracing::field::display(run_id));
        tracing::info!("reconciliation started");
        match self.reconcile(&mut conn, run_id, &window).await {
            Ok(summary) => {
                for (class, n) in &summary.by_class {
                    metrics::counter!(crate::metrics::RECON_DISCREPANCIES, "class" => class.as_str())
                        .increment(*n as u64);
                }
                tracing::info!(
                    provider_charges = summary.provider_charges,
                    ledger_entries = summary.ledger_entries,
                    discrepancies = summary.by_class.iter().map(|(_, n)| n).sum::<usize>(),
                    "reconciliation completed"
                );
                metrics::counter!(crate::metrics::RECON_RUNS, "status" => "completed").increment(1);
                Ok(Reconciled::Completed(summary))
            }
            Err(error) => {
                metrics::counter!(crate::metrics::RECON_RUNS, "status" => "failed").increment(1);
                let reason = format!("{error:#}");
                if let Err(not_recorded) = runs::fail(&mut conn, run_id, &reason).await {
                    tracing::error!(error = format!("{not_recorded:#}"), "cannot mark the run failed");
                }
                Err(error.context(format!("reconciliation run {run_id} failed")))
            }
        }
    }

    /// Pages through the provider's charges created in the window, reads again the charges earlier
    /// runs left unfinished, reads the ledger entries that may match them all, compares the two sides
    /// and stores the discrepancies, the counts and the unfinished charges in one transaction.
    async fn reconcile(&self, conn: &mut PgConnection, run_id: Uuid, window: &Window) -> anyhow::Result<Summary> {
        let listed = self.provider_charges(conn, run_id, window).await?;
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
        let ledger = ledger_entries(conn, window, &charges).await?;
        runs::heartbeat(conn, run_id).await?;
        let mut found = compare::compare(&charges, &ledger);
        found.extend(still.iter().map(compare::unfinished));
        let in_window = ledger.iter().filter(|e| e.in_window).count();
        let kept = runs::Unfinished { still: &still, settled: &reread.settled };
        runs::complete(conn, run_id, charges.len(), in_window, &found, &kept).await?;
        let by_class =
            Class::ALL.iter().map(|class| (*class, found.iter().filter(|d| d.class == *class).count())).collect();
        Ok(Summary { run_id, provider_charges: charges.len(), ledger_entries: in_window, by_class })
    }

    /// Every charge the provider created in the window, in every account a charge of oncepay's may
    /// be in, page by page, proving the run alive after each page. No transaction is open during a
    /// provider call.
    async fn provider_charges(&self, conn: &mut PgConnection, run_id: Uuid, window: &Window) -> anyhow::Result<Listed> {
        let mut charges: Vec<Charge> = Vec::new();
        let mut unfinished: Vec<UnfinishedCharge> = Vec::new();
        for account in self.accounts(conn, window).await? {
            let mut query = ListCharges {
                account,
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
                    tracing::warn!(charge.id = %id, error = %error, "cannot read an unfinished charge again; it stays open");
                    reread.still.push(open.last_seen);
                }
            }
            runs::heartbeat(conn, run_id).await?;
        }
        Ok(reread)
    }

    /// The provider accounts to list for `window`: oncepay's own, unless payments are charged in
    /// connected accounts; then every account connected to a tenant now, and every account (oncepay's
    /// own among them) that a ledger entry of the window was booked in, so an account an operator
    /// has since replaced is still read for the days it was charged in.
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

/// What the listing of a window found.
struct Listed {
    /// Final charges.
    charges: Vec<Charge>,
    /// Charges the provider has not finished.
    unfinished: Vec<UnfinishedCharge>,
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

/// The ledger entries booked in the window, plus those of every payment the charges name (so a
/// charge is matched to its entry even if the two sides put it on different sides of a boundary).
async fn ledger_entries(
    conn: &mut PgConnection,
    window: &Window,
    charges: &[Charge],
) -> anyhow::Result<Vec<LedgerEntry>> {
    let mut with_tenant: BTreeSet<(TenantId, PaymentId)> = BTreeSet::new();
    let mut without_tenant: BTreeSet<PaymentId> = BTreeSet::new();
    for charge in charges {
        match compare::payment_of(charge) {
            Some((Some(tenant), payment)) => {
                with_tenant.insert((tenant, payment));
            }
            Some((None, payment)) => {
                without_tenant.insert(payment);
            }
            None => {}
        }
    }
    let (tenants, payments): (Vec<_>, Vec<_>) = with_tenant.iter().map(|(t, p)| (t.as_uuid(), p.as_uuid())).unzip();
    let rows = sqlx::query!(
        r#"
        SELECT tenant_id AS "tenant_id!: TenantId", payment_id AS "payment_id!: PaymentId",
               provider_charge_id AS "provider_charge_id!", amount AS "amount!: Amount",
               currency AS "currency!: Currency", charged_at AS "charged_at!"
        FROM ledger_entries WHERE charged_at >= $1 AND charged_at < $2
        UNION
        SELECT tenant_id, payment_id, provider_charge_id, amount, currency, charged_at
        FROM ledger_entries WHERE (tenant_id, payment_id) IN (SELECT * FROM unnest($3::uuid[], $4::uuid[]))
        "#,
        window.start,
        window.end,
        &tenants,
        &payments,
    )
    .fetch_all(&mut *conn)
    .await
    .context("cannot read the ledger")?;
    let mut entries: HashMap<PaymentId, LedgerEntry> = HashMap::new();
    let mut add = |tenant_id, payment_id, provider_charge_id, amount, currency, charged_at: OffsetDateTime| {
        entries.insert(
            payment_id,
            LedgerEntry {
                tenant_id,
                payment_id,
                provider_charge_id,
                amount,
                currency,
                charged_at,
                in_window: window.start <= charged_at && charged_at < window.end,
            },
        );
    };
    for r in rows {
        add(r.tenant_id, r.payment_id, r.provider_charge_id, r.amount, r.currency, r.charged_at);
    }
    if !without_tenant.is_empty() {
        // Charges whose metadata a provider dropped name only the payment: rare, and read by id alone.
        let ids: Vec<_> = without_tenant.iter().map(PaymentId::as_uuid).collect();
        let rows = sqlx::query!(
            r#"
            SELECT tenant_id AS "tenant_id: TenantId", payment_id AS "payment_id: PaymentId",
                   provider_charge_id, amount AS "amount: Amount", currency AS "currency: Currency", charged_at
            FROM ledger_entries WHERE payment_id = ANY($1)
            "#,
            &ids,
        )
        .fetch_all(&mut *conn)
        .await
        .context("cannot read the ledger")?;
        for r in rows {
            add(r.tenant_id, r.payment_id, r.provider_charge_id, r.amount, r.currency, r.charged_at);
        }
    }
    Ok(entries.into_values().collect())
}

#[cfg(test)]
mod tests {
    use time::macros::{date, datetime};

    use super::*;

    #[test]
    fn the_nightly_window_is_the_whole_previous_utc_day() {
        let window = Window::previous_day(datetime!(2026-03-02 01:30 +02:00));
        assert_eq!(window, Window::day(date!(2026 - 02 - 28)));
        assert_eq!(window.start, datetime!(2026-02-28 00:00 UTC));
        assert_eq!(window.end, datetime!(2026-03-01 00:00 UTC));
    }

    #[test]
    fn a_window_must_start_before_it_ends_on_whole_seconds() {
        let t = datetime!(2026-03-01 00:00 UTC);
        assert!(Window::new(t, t + time::Duration::SECOND).is_ok());
        assert_eq!(Window::new(t, t), Err(BadWindow));
        assert_eq!(Window::new(t, t + time::Duration::milliseconds(1500)), Err(BadWindow));
    }
}
