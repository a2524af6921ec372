//! Reconciliation runs and their discrepancies, stored: claiming a window, proving the run is alive,
//! finishing it, and reading runs back for operators.
//!
//! At most one live or completed run per window. Every write after the claim is fenced on
//! `status = 'running'`, so a run that was taken over cannot finish or record discrepancies.

use std::fmt;
use std::time::Duration;

use anyhow::Context;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_provider::{Refund, UnfinishedCharge};
use serde::Serialize;
use sqlx::{Acquire, PgConnection};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::recon::Window;
use crate::recon::compare::Discrepancy;

/// Who started a run: the `recon_run_trigger` column type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "recon_run_trigger", rename_all = "snake_case")]
pub enum Trigger {
    /// The nightly schedule.
    Schedule,
    /// An operator's `recon run`.
    Operator,
}

impl Trigger {
    /// The name, as stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Schedule => "schedule",
            Self::Operator => "operator",
        }
    }
}

/// Where a run stands: the `recon_run_status` column type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "recon_run_status", rename_all = "snake_case")]
pub enum RunStatus {
    /// Asked for by an operator; the next reconciler to look starts it.
    Queued,
    /// Still comparing, and proving it is alive with heartbeats.
    Running,
    /// Finished; its discrepancies are recorded.
    Completed,
    /// Stopped with an error, or taken over after its heartbeat stopped.
    Failed,
}

impl RunStatus {
    /// The name, as stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of trying to claim or queue a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The window is this new run's.
    Won(Uuid),
    /// Another run already covers it (queued, running or completed).
    Taken {
        /// That run.
        run_id: Uuid,
        /// `Queued`, `Running` or `Completed`.
        status: RunStatus,
    },
}

/// Claims `window`: starts a run unless a live or completed one exists; takes over a stale one.
pub async fn claim(
    conn: &mut PgConnection,
    window: &Window,
    trigger: Trigger,
    stale_after: Duration,
) -> anyhow::Result<Claim> {
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    // A `running` run whose heartbeat is older than the staleness limit is presumed dead: mark it
    // `failed`, which frees the window for the insert below.
    let abandoned = sqlx::query!(
        r#"
        UPDATE recon_runs
        SET status = 'failed', finished_at = now(),
            error = 'abandoned: no heartbeat since ' || heartbeat_at::text || '; taken over'
        WHERE window_start = $1 AND window_end = $2 AND status = 'running'
          AND heartbeat_at < now() - make_interval(secs => $3)
        "#,
        window.start,
        window.end,
        stale_after.as_secs_f64(),
    )
    .execute(&mut *tx)
    .await
    .context("cannot take over a stale run")?;
    if abandoned.rows_affected() > 0 {
        tracing::warn!(window.start = %window.start, "took over a reconciliation run whose heartbeat stopped");
    }
    let claim = hold(&mut tx, window, trigger, RunStatus::Running).await?;
    tx.commit().await.context("cannot commit the claim")?;
    Ok(claim)
}

/// Queues `window` for an operator: the next reconciler to look runs it ([`start_queued`]).
pub async fn queue(conn: &mut PgConnection, window: &Window) -> anyhow::Result<Claim> {
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let claim = hold(&mut tx, window, Trigger::Operator, RunStatus::Queued).await?;
    tx.commit().await.context("cannot commit the queued run")?;
    Ok(claim)
}

/// Inserts a run of `window` in `status`, unless a queued, running or completed run holds it.
async fn hold(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    window: &Window,
    trigger: Trigger,
    status: RunStatus,
) -> anyhow::Result<Claim> {
    let run_id = Uuid::now_v7();
    // A partial unique index allows one live or completed run per window: among reconcilers racing
    // for it, one insert wins and the others read its run.
    let won = sqlx::query_scalar!(
        r#"
        INSERT INTO recon_runs (run_id, window_start, window_end, trigger, status)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (window_start, window_end) WHERE status <> 'failed' DO NOTHING
        RETURNING run_id
        "#,
        run_id,
        window.start,
        window.end,
        trigger as _,
        status as _,
    )
    .fetch_optional(&mut **tx)
    .await
    .context("cannot start the run")?;
    Ok(match won {
        Some(run_id) => Claim::Won(run_id),
        None => {
            let existing = sqlx::query!(
                r#"
                SELECT run_id, status AS "status: RunStatus" FROM recon_runs
                WHERE window_start = $1 AND window_end = $2 AND status <> 'failed'
                "#,
                window.start,
                window.end,
            )
            .fetch_one(&mut **tx)
            .await
            .context("cannot read the run that holds the window")?;
            Claim::Taken { run_id: existing.run_id, status: existing.status }
        }
    })
}

/// Starts the oldest queued run: marks it running, for this process to work, and returns it with
/// its window. Reconcilers racing for the queue each take a different run.
pub async fn start_queued(conn: &mut PgConnection) -> anyhow::Result<Option<(Uuid, Window)>> {
    let started = sqlx::query!(
        r#"
        UPDATE recon_runs SET status = 'running', started_at = now(), heartbeat_at = now()
        WHERE run_id = (
            SELECT run_id FROM recon_runs WHERE status = 'queued'
            ORDER BY started_at, run_id LIMIT 1 FOR UPDATE SKIP LOCKED
        )
        RETURNING run_id, window_start, window_end
        "#,
    )
    .fetch_optional(conn)
    .await
    .context("cannot start a queued run")?;
    started
        .map(|run| {
            let window = Window::new(run.window_start, run.window_end)
                .with_context(|| format!("queued run {} has a window the database should have refused", run.run_id))?;
            Ok((run.run_id, window))
        })
        .transpose()
}

/// A run that was taken over by another reconciler while it worked.
#[derive(Debug, thiserror::Error)]
#[error("run {0} was taken over by another reconciler")]
pub struct TakenOver(pub Uuid);

/// Proves the run is alive; fails if it was taken over.
pub async fn heartbeat(conn: &mut PgConnection, run_id: Uuid) -> anyhow::Result<()> {
    let beat =
        sqlx::query!("UPDATE recon_runs SET heartbeat_at = now() WHERE run_id = $1 AND status = 'running'", run_id)
            .execute(conn)
            .await
            .context("cannot record the run's heartbeat")?;
    if beat.rows_affected() == 0 {
        return Err(TakenOver(run_id).into());
    }
    Ok(())
}

/// What a run saw of the charges (`T` = [`UnfinishedCharge`]) or refunds (`T` = [`Refund`]) the
/// provider had not finished.
#[derive(Debug, Clone, Copy)]
pub struct Unfinished<'a, T> {
    /// Still unfinished: kept open.
    pub still: &'a [T],
    /// Open from an earlier run and now final: closed.
    pub settled: &'a [String],
}

/// What a run compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Provider charges.
    pub provider_charges: usize,
    /// Ledger entries of the window.
    pub ledger_entries: usize,
    /// Provider refunds.
    pub provider_refunds: usize,
    /// Refund ledger entries of the window.
    pub refund_ledger_entries: usize,
}

/// Records the discrepancies and the unfinished charges and refunds and completes the run, in one
/// transaction.
pub async fn complete(
    conn: &mut PgConnection,
    run_id: Uuid,
    counts: &Counts,
    found: &[Discrepancy],
    charges: &Unfinished<'_, UnfinishedCharge>,
    refunds: &Unfinished<'_, Refund>,
) -> anyhow::Result<()> {
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let count = |n: usize| i32::try_from(n).context("too many to count");
    let completed = sqlx::query!(
        r#"
        UPDATE recon_runs
        SET status = 'completed', finished_at = now(), heartbeat_at = now(),
            provider_charges = $2, ledger_entries = $3, provider_refunds = $4, refund_ledger_entries = $5,
            discrepancies = $6
        WHERE run_id = $1 AND status = 'running'
        "#,
        run_id,
        count(counts.provider_charges)?,
        count(counts.ledger_entries)?,
        count(counts.provider_refunds)?,
        count(counts.refund_ledger_entries)?,
        count(found.len())?,
    )
    .execute(&mut *tx)
    .await
    .context("cannot complete the run")?;
    if completed.rows_affected() == 0 {
        return Err(TakenOver(run_id).into());
    }
    for d in found {
        sqlx::query!(
            r#"
            INSERT INTO recon_discrepancies
                (run_id, class, tenant_id, payment_id, provider_charge_id, refund_id, provider_refund_id, ours,
                 theirs, detail)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
            "#,
            run_id,
            d.class.as_str(),
            d.tenant_id.map(|t| t.as_uuid()),
            d.payment_id.map(|p| p.as_uuid()),
            d.provider_charge_id,
            d.refund_id.map(|r| r.as_uuid()),
            d.provider_refund_id,
            d.ours,
            d.theirs,
            d.detail,
        )
        .execute(&mut *tx)
        .await
        .context("cannot record a discrepancy")?;
    }
    super::unfinished::record(&mut tx, run_id, charges.still, charges.settled).await?;
    super::unfinished_refunds::record(&mut tx, run_id, refunds.still, refunds.settled).await?;
    tx.commit().await.context("cannot commit the run's discrepancies")?;
    Ok(())
}

/// Marks the run failed with the reason, unless it was taken over meanwhile.
pub async fn fail(conn: &mut PgConnection, run_id: Uuid, error: &str) -> anyhow::Result<()> {
    sqlx::query!(
        r#"
        UPDATE recon_runs SET status = 'failed', finished_at = now(), error = $2
        WHERE run_id = $1 AND status = 'running'
        "#,
        run_id,
        error,
    )
    .execute(conn)
    .await
    .context("cannot record the run's failure")?;
    Ok(())
}

/// A run, as operators see it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Run {
    /// Its id.
    pub run_id: Uuid,
    /// Start of the window (inclusive).
    #[serde(with = "time::serde::rfc3339")]
    pub window_start: OffsetDateTime,
    /// End of the window (exclusive).
    #[serde(with = "time::serde::rfc3339")]
    pub window_end: OffsetDateTime,
    /// Who started it.
    pub trigger: Trigger,
    /// Where it stands.
    pub status: RunStatus,
    /// When it started.
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// When it last proved it was alive.
    #[serde(with = "time::serde::rfc3339")]
    pub heartbeat_at: OffsetDateTime,
    /// When it ended.
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// Provider charges compared.
    pub provider_charges: Option<i32>,
    /// Ledger entries compared.
    pub ledger_entries: Option<i32>,
    /// Provider refunds compared (none for a run of a version that compared only charges).
    #[serde(default)]
    pub provider_refunds: Option<i32>,
    /// Refund ledger entries compared (as `provider_refunds`).
    #[serde(default)]
    pub refund_ledger_entries: Option<i32>,
    /// Discrepancies.
    pub discrepancies: Option<i32>,
    /// Why it failed.
    pub error: Option<String>,
}

/// The latest runs, newest first.
pub async fn list(conn: &mut PgConnection, limit: u32) -> anyhow::Result<Vec<Run>> {
    sqlx::query_as!(
        Run,
        r#"
        SELECT run_id, window_start, window_end, trigger AS "trigger: Trigger", status AS "status: RunStatus",
               started_at, heartbeat_at, finished_at, provider_charges, ledger_entries, provider_refunds,
               refund_ledger_entries, discrepancies, error
        FROM recon_runs ORDER BY started_at DESC, run_id DESC LIMIT $1
        "#,
        i64::from(limit),
    )
    .fetch_all(conn)
    .await
    .context("cannot list the runs")
}

/// One run.
pub async fn find(conn: &mut PgConnection, run_id: Uuid) -> anyhow::Result<Option<Run>> {
    sqlx::query_as!(
        Run,
        r#"
        SELECT run_id, window_start, window_end, trigger AS "trigger: Trigger", status AS "status: RunStatus",
               started_at, heartbeat_at, finished_at, provider_charges, ledger_entries, provider_refunds,
               refund_ledger_entries, discrepancies, error
        FROM recon_runs WHERE run_id = $1
        "#,
        run_id,
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the run")
}

/// A run's discrepancies, by class then in the order found.
pub async fn discrepancies(conn: &mut PgConnection, run_id: Uuid) -> anyhow::Result<Vec<Discrepancy>> {
    let rows = sqlx::query!(
        r#"
        SELECT discrepancy_id, class, tenant_id AS "tenant_id: TenantId", payment_id AS "payment_id: PaymentId",
               provider_charge_id, refund_id AS "refund_id: RefundId", provider_refund_id, ours, theirs, detail
        FROM recon_discrepancies WHERE run_id = $1
        ORDER BY class, discrepancy_id
        "#,
        run_id,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the run's discrepancies")?;
    rows.into_iter()
        .map(|r| {
            Ok(Discrepancy {
                class: r.class.parse().with_context(|| format!("cannot read discrepancy {}", r.discrepancy_id))?,
                tenant_id: r.tenant_id,
                payment_id: r.payment_id,
                provider_charge_id: r.provider_charge_id,
                refund_id: r.refund_id,
                provider_refund_id: r.provider_refund_id,
                ours: r.ours,
                theirs: r.theirs,
                detail: r.detail,
            })
        })
        .collect()
}
