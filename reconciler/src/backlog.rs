//! The backlog gauges: how much work is waiting, and for how long, sampled from PostgreSQL.
//!
//! The reconciler owns this so that the tables are read once per reconciler, not once per worker.
//! This module writes nothing.

use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::metrics::{
    BACKLOG_SAMPLED_AT, OLDEST_PENDING_AGE, OLDEST_UNKNOWN_AGE, OPEN_DEAD_LETTERS, OUTBOX_DEPTH, REFUND_CONFLICT,
    UNKNOWN_PAYMENTS,
};
use oncepay_ops::dead_letters::Kind;
use oncepay_service::runner::Pass;

/// What one sample saw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backlog {
    /// Outbox rows claimable now.
    pub outbox_due: i64,
    /// Outbox rows waiting for a retry's backoff to end.
    pub outbox_scheduled: i64,
    /// Outbox rows leased to a worker.
    pub outbox_leased: i64,
    /// Age of the oldest outbox row: the payment waiting longest to be sent to an outcome.
    pub oldest_pending: Duration,
    /// Payments in `unknown`.
    pub unknown: i64,
    /// How long the oldest of them has been `unknown`.
    pub oldest_unknown: Duration,
    /// Open `unresolved` dead letters.
    pub dead_letters_unresolved: i64,
    /// Open `conflict` dead letters.
    pub dead_letters_conflict: i64,
    /// Open conflicts on final refunds (`refund_dead_letters`).
    pub refund_conflicts: i64,
}

/// Reads the backlog in one statement: the outbox (rows due, scheduled for a retry, leased; the oldest
/// row's age), the `unknown` queue (size, oldest age), the open dead letters (by kind) and the open
/// conflicts on refunds.
///
/// Cheap by construction: the outbox and the `unknown` queue hold only unfinished work (rows are
/// deleted when it finishes), and open dead letters are read through their partial indexes
/// (`dead_letters_open`, `refund_dead_letters_open_by_age`), however many resolved ones accumulate.
pub async fn sample(pool: &PgPool) -> Result<Backlog, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        WITH outbox_now AS (
            SELECT count(*) FILTER (WHERE locked_until IS NULL AND available_at <= now()) AS due,
                   count(*) FILTER (WHERE locked_until IS NULL AND available_at > now()) AS scheduled,
                   count(*) FILTER (WHERE locked_until IS NOT NULL) AS leased,
                   min(created_at) AS oldest
            FROM outbox
        ), unknown_now AS (
            SELECT count(*) AS unknown, min(since) AS oldest FROM unknown_payments
        ), dead_letters_now AS (
            SELECT count(*) FILTER (WHERE kind = 'unresolved') AS unresolved,
                   count(*) FILTER (WHERE kind = 'conflict') AS conflict
            FROM dead_letters WHERE resolved_at IS NULL
        ), refund_conflicts_now AS (
            SELECT count(*) AS conflicts FROM refund_dead_letters WHERE resolved_at IS NULL
        )
        SELECT o.due AS "due!", o.scheduled AS "scheduled!", o.leased AS "leased!",
               COALESCE(extract(epoch FROM now() - o.oldest), 0)::float8 AS "oldest_pending_secs!",
               u.unknown AS "unknown!",
               COALESCE(extract(epoch FROM now() - u.oldest), 0)::float8 AS "oldest_unknown_secs!",
               d.unresolved AS "unresolved!", d.conflict AS "conflict!", r.conflicts AS "refund_conflicts!"
        FROM outbox_now o, unknown_now u, dead_letters_now d, refund_conflicts_now r
        "#
    )
    .fetch_one(pool)
    .await?;
    Ok(Backlog {
        outbox_due: row.due,
        outbox_scheduled: row.scheduled,
        outbox_leased: row.leased,
        oldest_pending: seconds(row.oldest_pending_secs),
        unknown: row.unknown,
        oldest_unknown: seconds(row.oldest_unknown_secs),
        dead_letters_unresolved: row.unresolved,
        dead_letters_conflict: row.conflict,
        refund_conflicts: row.refund_conflicts,
    })
}

/// A non-negative duration from seconds (a clock step can make an age briefly negative).
fn seconds(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO)
}

impl Backlog {
    /// Sets the gauges to this sample.
    pub fn publish(&self) {
        // Row counts far below 2^53: exact as f64.
        metrics::gauge!(OUTBOX_DEPTH, "state" => "due").set(self.outbox_due as f64);
        metrics::gauge!(OUTBOX_DEPTH, "state" => "scheduled").set(self.outbox_scheduled as f64);
        metrics::gauge!(OUTBOX_DEPTH, "state" => "leased").set(self.outbox_leased as f64);
        metrics::gauge!(OLDEST_PENDING_AGE).set(self.oldest_pending.as_secs_f64());
        metrics::gauge!(UNKNOWN_PAYMENTS).set(self.unknown as f64);
        metrics::gauge!(OLDEST_UNKNOWN_AGE).set(self.oldest_unknown.as_secs_f64());
        metrics::gauge!(OPEN_DEAD_LETTERS, "kind" => Kind::Unresolved.as_str())
            .set(self.dead_letters_unresolved as f64);
        metrics::gauge!(OPEN_DEAD_LETTERS, "kind" => Kind::Conflict.as_str()).set(self.dead_letters_conflict as f64);
        metrics::gauge!(OPEN_DEAD_LETTERS, "kind" => REFUND_CONFLICT).set(self.refund_conflicts as f64);
        metrics::gauge!(BACKLOG_SAMPLED_AT).set(OffsetDateTime::now_utc().unix_timestamp() as f64);
    }
}

/// Samples the backlog every `interval` until shutdown.
pub struct Sampler {
    pool: PgPool,
    interval: Duration,
}

/// A sample is never followed at once by another: the gauges only need to be fresh.
impl Pass for Sampler {
    const NAME: &'static str = "backlog";

    fn interval(&self) -> Duration {
        self.interval
    }

    async fn pass(&self) -> anyhow::Result<bool> {
        self.run_once().await?;
        Ok(false)
    }
}

impl Sampler {
    /// A sampler over `pool`.
    pub fn new(pool: PgPool, interval: Duration) -> Self {
        Self { pool, interval }
    }

    /// One sample, published. A failed sample leaves the gauges as they were and counts a loop error;
    /// [`BACKLOG_SAMPLED_AT`] says how old they are.
    pub async fn run_once(&self) -> anyhow::Result<Backlog> {
        let backlog = sample(&self.pool).await.context("cannot sample the backlog")?;
        backlog.publish();
        Ok(backlog)
    }
}
