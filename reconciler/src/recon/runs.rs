//! A reconciliation run as the reconciler does it: claiming a window (or starting a queued run),
//! proving the run is alive, and finishing it. What operators read and queue is the store's
//! ([`oncepay_store::recon_runs`]).
//!
//! At most one queued, live or completed run per window. Every write after the claim is fenced on
//! `status = 'running'`, so a run that was taken over cannot finish or record discrepancies.

use std::time::Duration;

use anyhow::Context;
use oncepay_provider::{Refund, UnfinishedCharge};
use oncepay_store::recon_runs::{self, Claim, Discrepancy, RunStatus, Trigger, Window};
use sqlx::{Acquire, PgConnection};
use uuid::Uuid;

/// Claims `window`: starts a run unless a queued, live or completed one holds it; takes over a stale
/// one ([`recon_runs::hold`]).
pub async fn claim(
    conn: &mut PgConnection,
    window: &Window,
    trigger: Trigger,
    stale_after: Duration,
) -> anyhow::Result<Claim> {
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let claim = recon_runs::hold(&mut tx, window, trigger, RunStatus::Running, stale_after).await?;
    tx.commit().await.context("cannot commit the claim")?;
    Ok(claim)
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
