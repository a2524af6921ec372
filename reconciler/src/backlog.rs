//! The backlog gauges: how much work is waiting, and for how long, sampled from PostgreSQL.
//!
//! The reconciler owns this so that the tables are read once per reconciler, not once per worker.
//! This module writes nothing.

use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::metrics::{
    BACKLOG_SAMPLED_AT, OLDEST_PENDING_AGE, OLDEST_PENDING_REFUND_AGE, OLDEST_UNKNOWN_AGE, OLDEST_UNKNOWN_REFUND_AGE,
    OPEN_DEAD_LETTERS, OUTBOX_DEPTH, REFUND_CONFLICT, REFUND_OUTBOX_DEPTH, REFUND_UNRESOLVED, UNKNOWN_PAYMENTS,
    UNKNOWN_REFUNDS,
};
use oncepay_ops::dead_letters::Kind;
use oncepay_service::runner::Pass;

/// One kind's queue (payments' or refunds'): its outbox and those `unknown`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Queue {
    /// Outbox rows claimable now.
    pub outbox_due: i64,
    /// Outbox rows waiting for a retry's backoff to end.
    pub outbox_scheduled: i64,
    /// Outbox rows leased to a worker.
    pub outbox_leased: i64,
    /// Age of the oldest outbox row: the one waiting longest to be sent to an outcome.
    pub oldest_pending: Duration,
    /// Those in `unknown`.
    pub unknown: i64,
    /// How long the oldest of them has been `unknown`.
    pub oldest_unknown: Duration,
}

/// What one sample saw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backlog {
    /// Payments.
    pub payments: Queue,
    /// Refunds.
    pub refunds: Queue,
    /// Open `unresolved` dead letters.
    pub dead_letters_unresolved: i64,
    /// Open `conflict` dead letters.
    pub dead_letters_conflict: i64,
    /// Refunds automation gave up on (`dead_lettered`), waiting for an operator.
    pub refunds_dead_lettered: i64,
    /// Open conflicts on final refunds (`refund_dead_letters`).
    pub refund_conflicts: i64,
}

/// The gauges one kind's queue is published to.
struct Gauges {
    outbox_depth: &'static str,
    oldest_pending: &'static str,
    unknown: &'static str,
    oldest_unknown: &'static str,
}

const PAYMENTS: Gauges = Gauges {
    outbox_depth: OUTBOX_DEPTH,
    oldest_pending: OLDEST_PENDING_AGE,
    unknown: UNKNOWN_PAYMENTS,
    oldest_unknown: OLDEST_UNKNOWN_AGE,
};

const REFUNDS: Gauges = Gauges {
    outbox_depth: REFUND_OUTBOX_DEPTH,
    oldest_pending: OLDEST_PENDING_REFUND_AGE,
    unknown: UNKNOWN_REFUNDS,
    oldest_unknown: OLDEST_UNKNOWN_REFUND_AGE,
};

/// Reads the backlog in one statement: of payments and of refunds, the outbox (rows due, scheduled
/// for a retry, leased; the oldest row's age) and those `unknown` (how many, and for how long the
/// oldest); the open dead letters by kind, the dead-lettered refunds and the open conflicts on
/// refunds. A refund has been `unknown` since its last event that made it so.
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
        ), refund_outbox_now AS (
            SELECT count(*) FILTER (WHERE locked_until IS NULL AND available_at <= now()) AS due,
                   count(*) FILTER (WHERE locked_until IS NULL AND available_at > now()) AS scheduled,
                   count(*) FILTER (WHERE locked_until IS NOT NULL) AS leased,
                   min(created_at) AS oldest
            FROM refund_outbox
        ), unknown_refunds_now AS (
            SELECT count(*) AS unknown, min(since.at) AS oldest
            FROM refunds r
            CROSS JOIN LATERAL (
                SELECT max(e.created_at) AS at FROM refund_events e
                WHERE e.tenant_id = r.tenant_id AND e.refund_id = r.refund_id AND e.to_status = 'unknown'
            ) since
            WHERE r.status = 'unknown'
        ), dead_letters_now AS (
            SELECT count(*) FILTER (WHERE kind = 'unresolved') AS unresolved,
                   count(*) FILTER (WHERE kind = 'conflict') AS conflict
            FROM dead_letters WHERE resolved_at IS NULL
        ), refunds_dead_lettered_now AS (
            SELECT count(*) AS dead_lettered FROM refunds WHERE status = 'dead_lettered'
        ), refund_conflicts_now AS (
            SELECT count(*) AS conflicts FROM refund_dead_letters WHERE resolved_at IS NULL
        )
        SELECT o.due AS "due!", o.scheduled AS "scheduled!", o.leased AS "leased!",
               COALESCE(extract(epoch FROM now() - o.oldest), 0)::float8 AS "oldest_pending_secs!",
               u.unknown AS "unknown!",
               COALESCE(extract(epoch FROM now() - u.oldest), 0)::float8 AS "oldest_unknown_secs!",
               ro.due AS "refunds_due!", ro.scheduled AS "refunds_scheduled!", ro.leased AS "refunds_leased!",
               COALESCE(extract(epoch FROM now() - ro.oldest), 0)::float8 AS "oldest_pending_refund_secs!",
               ru.unknown AS "unknown_refunds!",
               COALESCE(extract(epoch FROM now() - ru.oldest), 0)::float8 AS "oldest_unknown_refund_secs!",
               d.unresolved AS "unresolved!", d.conflict AS "conflict!",
               rd.dead_lettered AS "refunds_dead_lettered!", r.conflicts AS "refund_conflicts!"
        FROM outbox_now o, unknown_now u, refund_outbox_now ro, unknown_refunds_now ru, dead_letters_now d,
             refunds_dead_lettered_now rd, refund_conflicts_now r
        "#
    )
    .fetch_one(pool)
    .await?;
    Ok(Backlog {
        payments: Queue {
            outbox_due: row.due,
            outbox_scheduled: row.scheduled,
            outbox_leased: row.leased,
            oldest_pending: seconds(row.oldest_pending_secs),
            unknown: row.unknown,
            oldest_unknown: seconds(row.oldest_unknown_secs),
        },
        refunds: Queue {
            outbox_due: row.refunds_due,
            outbox_scheduled: row.refunds_scheduled,
            outbox_leased: row.refunds_leased,
            oldest_pending: seconds(row.oldest_pending_refund_secs),
            unknown: row.unknown_refunds,
            oldest_unknown: seconds(row.oldest_unknown_refund_secs),
        },
        dead_letters_unresolved: row.unresolved,
        dead_letters_conflict: row.conflict,
        refunds_dead_lettered: row.refunds_dead_lettered,
        refund_conflicts: row.refund_conflicts,
    })
}

fn seconds(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO)
}

impl Queue {
    fn publish(&self, gauges: &Gauges) {
        // Row counts far below 2^53: exact as f64.
        metrics::gauge!(gauges.outbox_depth, "state" => "due").set(self.outbox_due as f64);
        metrics::gauge!(gauges.outbox_depth, "state" => "scheduled").set(self.outbox_scheduled as f64);
        metrics::gauge!(gauges.outbox_depth, "state" => "leased").set(self.outbox_leased as f64);
        metrics::gauge!(gauges.oldest_pending).set(self.oldest_pending.as_secs_f64());
        metrics::gauge!(gauges.unknown).set(self.unknown as f64);
        metrics::gauge!(gauges.oldest_unknown).set(self.oldest_unknown.as_secs_f64());
    }
}

impl Backlog {
    /// Sets every backlog gauge to this sample.
    pub fn publish(&self) {
        self.payments.publish(&PAYMENTS);
        self.refunds.publish(&REFUNDS);
        metrics::gauge!(OPEN_DEAD_LETTERS, "kind" => Kind::Unresolved.as_str())
            .set(self.dead_letters_unresolved as f64);
        metrics::gauge!(OPEN_DEAD_LETTERS, "kind" => Kind::Conflict.as_str()).set(self.dead_letters_conflict as f64);
        metrics::gauge!(OPEN_DEAD_LETTERS, "kind" => REFUND_UNRESOLVED).set(self.refunds_dead_lettered as f64);
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
