//! The reaper: deletes idempotency keys past their retention, and webhook ids past theirs.
//!
//! A key is deleted only once it has expired and its payment is terminal. Payments, their audit trail
//! and the ledger are never deleted here.

use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;

use crate::runner::Pass;

/// The reaper's limits.
#[derive(Debug, Clone)]
pub struct ReaperConfig {
    /// Pause after a pass that found less than a full batch.
    pub interval: Duration,
    /// Rows per delete.
    pub batch_size: u32,
    /// How long a webhook id is remembered for deduplication.
    pub webhook_retention: Duration,
}

/// What one pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Expired idempotency keys of terminal payments.
    pub keys: u64,
    /// Webhook ids past their retention.
    pub webhook_events: u64,
}

/// The reaper loop.
pub struct Reaper {
    pool: PgPool,
    config: ReaperConfig,
}

/// A full batch of either kind may have left more behind it.
impl Pass for Reaper {
    const NAME: &'static str = "reaper";

    fn interval(&self) -> Duration {
        self.config.interval
    }

    async fn pass(&self) -> anyhow::Result<bool> {
        let full = u64::from(self.config.batch_size);
        let counts = self.run_once().await?;
        Ok(counts.keys >= full || counts.webhook_events >= full)
    }
}

impl Reaper {
    /// A reaper over `pool`.
    pub fn new(pool: PgPool, config: ReaperConfig) -> Self {
        Self { pool, config }
    }

    /// One pass: at most one batch of keys and one of webhook ids.
    ///
    /// Each batch is one short statement (`FOR UPDATE SKIP LOCKED`, oldest first), so the reaper never
    /// holds many locks or writes a burst of WAL, and several reapers can run at once.
    #[tracing::instrument(name = "reaper.pass", skip_all, fields(reaped.keys, reaped.webhook_events))]
    pub async fn run_once(&self) -> anyhow::Result<Counts> {
        let batch = i64::from(self.config.batch_size);
        // A key whose payment is still pending, processing, unknown or dead-lettered is what makes a
        // client's retry find that payment instead of creating another, so it stays however old it is.
        // A key's expiry restarts when its payment becomes terminal (`store/sql/store_response.sql`),
        // so a late settlement keeps its key for the full retention after that. A terminal payment
        // never changes again, so the status read in this statement cannot go stale.
        let keys = sqlx::query!(
            r#"
            WITH doomed AS (
                SELECT k.tenant_id, k.idempotency_key
                FROM idempotency_keys k JOIN payments p USING (tenant_id, payment_id)
                WHERE k.expires_at < now() AND p.status IN ('succeeded', 'failed')
                ORDER BY k.expires_at
                LIMIT $1
                FOR UPDATE OF k SKIP LOCKED
            )
            DELETE FROM idempotency_keys k USING doomed
            WHERE k.tenant_id = doomed.tenant_id AND k.idempotency_key = doomed.idempotency_key
            "#,
            batch,
        )
        .execute(&self.pool)
        .await
        .context("cannot delete expired idempotency keys")?
        .rows_affected();
        metrics::counter!(crate::metrics::REAPED_KEYS).increment(keys);

        let webhook_events = sqlx::query!(
            r#"
            WITH doomed AS (
                SELECT tenant_id, webhook_id FROM webhook_events
                WHERE received_at < now() - make_interval(secs => $2)
                ORDER BY received_at
                LIMIT $1
                FOR UPDATE SKIP LOCKED
            )
            DELETE FROM webhook_events w USING doomed
            WHERE w.tenant_id = doomed.tenant_id AND w.webhook_id = doomed.webhook_id
            "#,
            batch,
            self.config.webhook_retention.as_secs_f64(),
        )
        .execute(&self.pool)
        .await
        .context("cannot delete old webhook ids")?
        .rows_affected();

        let span = tracing::Span::current();
        span.record("reaped.keys", keys);
        span.record("reaped.webhook_events", webhook_events);
        Ok(Counts { keys, webhook_events })
    }
}
