//! The reaper: deletes idempotency keys past their retention (the payments' and the refunds'),
//! webhook ids past theirs, and the events sent to merchants past theirs.
//!
//! A key is deleted only once it has expired and its payment or refund is terminal; an event only
//! once it is past its retention and no delivery of it is still owed. Payments, refunds, their audit
//! trails and the ledgers are never deleted here.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use oncepay_domain::ids::TenantId;
use sqlx::PgPool;

use oncepay_service::runner::Pass;

/// The reaper's limits.
#[derive(Debug, Clone)]
pub struct ReaperConfig {
    /// Pause after a pass that found less than a full batch.
    pub interval: Duration,
    /// Rows per delete.
    pub batch_size: u32,
    /// How long a webhook id is remembered for deduplication.
    pub webhook_retention: Duration,
    /// How long an event sent to merchants is kept, for its deliveries' history and for replays.
    pub event_retention: Duration,
}

/// What one pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Expired idempotency keys of terminal payments.
    pub keys: u64,
    /// Expired idempotency keys of terminal refunds.
    pub refund_keys: u64,
    /// Webhook ids past their retention.
    pub webhook_events: u64,
    /// Events to merchants past their retention, with their deliveries and attempts.
    pub merchant_events: u64,
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
        Ok([counts.keys, counts.refund_keys, counts.webhook_events, counts.merchant_events].iter().any(|n| *n >= full))
    }
}

impl Reaper {
    /// A reaper over `pool`.
    pub fn new(pool: PgPool, config: ReaperConfig) -> Self {
        Self { pool, config }
    }

    /// One pass: at most one batch of payments' keys, one of refunds' keys, one of webhook ids and one
    /// of events to merchants.
    ///
    /// Each batch is read without locks across tenants (the tenants of its oldest rows), then deleted
    /// one tenant at a time, each by one short statement (`FOR UPDATE SKIP LOCKED`, oldest first): the
    /// reaper never holds many locks or writes a burst of WAL, several reapers can run at once, and
    /// under Citus each delete stays on its tenant's shard (SCALING.md).
    #[tracing::instrument(name = "reaper.pass", skip_all, fields(reaped.keys, reaped.refund_keys, reaped.webhook_events, reaped.merchant_events))]
    pub async fn run_once(&self) -> anyhow::Result<Counts> {
        let batch = i64::from(self.config.batch_size);
        let keys = self.reap_keys(batch).await.context("cannot delete expired idempotency keys")?;
        metrics::counter!(crate::metrics::REAPED_KEYS).increment(keys);
        let refund_keys = self.reap_refund_keys(batch).await.context("cannot delete expired refund keys")?;
        metrics::counter!(crate::metrics::REAPED_REFUND_KEYS).increment(refund_keys);
        let webhook_events = self.reap_webhook_ids(batch).await.context("cannot delete old webhook ids")?;
        let merchant_events =
            self.reap_merchant_events(batch).await.context("cannot delete old events to merchants")?;
        metrics::counter!(crate::metrics::REAPED_MERCHANT_EVENTS).increment(merchant_events);

        let span = tracing::Span::current();
        span.record("reaped.keys", keys);
        span.record("reaped.refund_keys", refund_keys);
        span.record("reaped.webhook_events", webhook_events);
        span.record("reaped.merchant_events", merchant_events);
        Ok(Counts { keys, refund_keys, webhook_events, merchant_events })
    }

    /// Deletes up to `batch` expired keys of terminal payments.
    ///
    /// A key whose payment is still pending, processing, unknown or dead-lettered is what makes a
    /// client's retry find that payment instead of creating another, so it stays however old it is.
    /// A key's expiry restarts when its payment becomes terminal (`shared/store/sql/store_response.sql`), so
    /// a late settlement keeps its key for the full retention after that. A terminal payment never
    /// changes again, so the status read here cannot go stale.
    async fn reap_keys(&self, batch: i64) -> Result<u64, sqlx::Error> {
        let tenants = sqlx::query_scalar!(
            r#"
            SELECT DISTINCT tenant_id AS "tenant_id!: TenantId" FROM (
                SELECT k.tenant_id
                FROM idempotency_keys k JOIN payments p USING (tenant_id, payment_id)
                WHERE k.expires_at < now() AND p.status IN ('succeeded', 'failed')
                ORDER BY k.expires_at
                LIMIT $1
            ) oldest
            "#,
            batch,
        )
        .fetch_all(&self.pool)
        .await?;
        by_tenant(tenants, batch, |tenant_id, limit| async move {
            let deleted = sqlx::query!(
                r#"
                WITH doomed AS (
                    SELECT k.tenant_id, k.idempotency_key
                    FROM idempotency_keys k JOIN payments p USING (tenant_id, payment_id)
                    WHERE k.tenant_id = $2 AND k.expires_at < now() AND p.status IN ('succeeded', 'failed')
                    ORDER BY k.expires_at
                    LIMIT $1
                    FOR UPDATE OF k SKIP LOCKED
                )
                DELETE FROM idempotency_keys k USING doomed
                WHERE k.tenant_id = $2 AND k.idempotency_key = doomed.idempotency_key
                "#,
                limit,
                tenant_id.as_uuid(),
            )
            .execute(&self.pool)
            .await?;
            Ok(deleted.rows_affected())
        })
        .await
    }

    /// Deletes up to `batch` expired keys of terminal refunds, as [`Reaper::reap_keys`] does
    /// payments' keys: a key whose refund is pending, processing, unknown or dead-lettered stays
    /// however old it is.
    ///
    /// A refund key's expiry restarts when its refund becomes terminal (`settling::settle` in the
    /// store), as a payment key's does.
    async fn reap_refund_keys(&self, batch: i64) -> Result<u64, sqlx::Error> {
        let tenants = sqlx::query_scalar!(
            r#"
            SELECT DISTINCT tenant_id AS "tenant_id!: TenantId" FROM (
                SELECT k.tenant_id
                FROM refund_keys k JOIN refunds r USING (tenant_id, refund_id)
                WHERE k.expires_at < now() AND r.status IN ('succeeded', 'failed')
                ORDER BY k.expires_at
                LIMIT $1
            ) oldest
            "#,
            batch,
        )
        .fetch_all(&self.pool)
        .await?;
        by_tenant(tenants, batch, |tenant_id, limit| async move {
            let deleted = sqlx::query!(
                r#"
                WITH doomed AS (
                    SELECT k.tenant_id, k.idempotency_key
                    FROM refund_keys k JOIN refunds r USING (tenant_id, refund_id)
                    WHERE k.tenant_id = $2 AND k.expires_at < now() AND r.status IN ('succeeded', 'failed')
                    ORDER BY k.expires_at
                    LIMIT $1
                    FOR UPDATE OF k SKIP LOCKED
                )
                DELETE FROM refund_keys k USING doomed
                WHERE k.tenant_id = $2 AND k.idempotency_key = doomed.idempotency_key
                "#,
                limit,
                tenant_id.as_uuid(),
            )
            .execute(&self.pool)
            .await?;
            Ok(deleted.rows_affected())
        })
        .await
    }

    /// Deletes up to `batch` webhook ids past their retention.
    async fn reap_webhook_ids(&self, batch: i64) -> Result<u64, sqlx::Error> {
        let retention = self.config.webhook_retention.as_secs_f64();
        let tenants = sqlx::query_scalar!(
            r#"
            SELECT DISTINCT tenant_id AS "tenant_id!: TenantId" FROM (
                SELECT tenant_id FROM webhook_events
                WHERE received_at < now() - make_interval(secs => $2)
                ORDER BY received_at
                LIMIT $1
            ) oldest
            "#,
            batch,
            retention,
        )
        .fetch_all(&self.pool)
        .await?;
        by_tenant(tenants, batch, |tenant_id, limit| async move {
            let deleted = sqlx::query!(
                r#"
                WITH doomed AS (
                    SELECT tenant_id, webhook_id FROM webhook_events
                    WHERE tenant_id = $3 AND received_at < now() - make_interval(secs => $2)
                    ORDER BY received_at
                    LIMIT $1
                    FOR UPDATE SKIP LOCKED
                )
                DELETE FROM webhook_events w USING doomed
                WHERE w.tenant_id = $3 AND w.webhook_id = doomed.webhook_id
                "#,
                limit,
                retention,
                tenant_id.as_uuid(),
            )
            .execute(&self.pool)
            .await?;
            Ok(deleted.rows_affected())
        })
        .await
    }

    /// Deletes up to `batch` events to merchants past their retention whose deliveries are all
    /// delivered or dead-lettered, with those deliveries and their attempts.
    ///
    /// An event still owed to an endpoint (a delivery pending, retrying, or waiting for a disabled
    /// endpoint to be enabled) stays however old it is: nothing accepted for delivery is lost. A
    /// replay that makes a delivery pending again while this runs keeps its event too: the delete
    /// of deliveries skips pending ones, and the event's delete then fails on the delivery left,
    /// so the pass fails and the next one finds the event owed.
    async fn reap_merchant_events(&self, batch: i64) -> Result<u64, sqlx::Error> {
        let retention = self.config.event_retention.as_secs_f64();
        let tenants = sqlx::query_scalar!(
            r#"
            SELECT DISTINCT tenant_id AS "tenant_id!: TenantId" FROM (
                SELECT e.tenant_id FROM merchant_events e
                WHERE e.created_at < now() - make_interval(secs => $2)
                  AND NOT EXISTS (SELECT 1 FROM merchant_deliveries d
                                  WHERE d.tenant_id = e.tenant_id AND d.event_id = e.event_id AND d.state = 'pending')
                ORDER BY e.created_at
                LIMIT $1
            ) oldest
            "#,
            batch,
            retention,
        )
        .fetch_all(&self.pool)
        .await?;
        by_tenant(tenants, batch, |tenant_id, limit| async move {
            let deleted = sqlx::query!(
                r#"
                WITH doomed AS (
                    SELECT e.tenant_id, e.event_id FROM merchant_events e
                    WHERE e.tenant_id = $3 AND e.created_at < now() - make_interval(secs => $2)
                      AND NOT EXISTS (SELECT 1 FROM merchant_deliveries d
                                      WHERE d.tenant_id = e.tenant_id AND d.event_id = e.event_id
                                        AND d.state = 'pending')
                    ORDER BY e.created_at
                    LIMIT $1
                    FOR UPDATE SKIP LOCKED
                ), deliveries AS (
                    DELETE FROM merchant_deliveries d USING doomed
                    WHERE d.tenant_id = $3 AND d.event_id = doomed.event_id AND d.state <> 'pending'
                )
                DELETE FROM merchant_events e USING doomed
                WHERE e.tenant_id = $3 AND e.event_id = doomed.event_id
                "#,
                limit,
                retention,
                tenant_id.as_uuid(),
            )
            .execute(&self.pool)
            .await?;
            Ok(deleted.rows_affected())
        })
        .await
    }
}

/// Runs `delete(tenant, limit)` for each of `tenants` in turn, each with what is left of `batch`,
/// until the batch is spent; returns how many rows were deleted in all.
async fn by_tenant<D, F>(tenants: Vec<TenantId>, batch: i64, delete: D) -> Result<u64, sqlx::Error>
where
    D: Fn(TenantId, i64) -> F,
    F: Future<Output = Result<u64, sqlx::Error>>,
{
    let mut deleted = 0;
    for tenant_id in tenants {
        let left = batch.saturating_sub(i64::try_from(deleted).unwrap_or(i64::MAX));
        if left <= 0 {
            break;
        }
        deleted += delete(tenant_id, left).await?;
    }
    Ok(deleted)
}
