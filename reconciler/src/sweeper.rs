//! The sweeper: takes outbox leases back from workers that died or stalled, the payments' and the
//! refunds'. It never touches a lease that has not expired.
//!
//! The takeovers themselves are `oncepay_store::leases::sweep` and
//! `oncepay_store::refunds::sending::sweep`, kept with the worker's claim and record statements so
//! each protocol lives in one place; this module only runs them.

use std::time::Duration;

use anyhow::Context;
use oncepay_provider::KeyWindow;
use oncepay_store::leases::{self, SweepCounts};
use oncepay_store::refunds::sending;
use sqlx::PgPool;

use oncepay_service::runner::Pass;

/// Who the audit trail says moved the payment or the refund.
const ACTOR: &str = "sweeper";

/// The sweeper's limits.
#[derive(Debug, Clone)]
pub struct SweeperConfig {
    /// Pause after a pass that changed nothing.
    pub interval: Duration,
    /// Leases looked at per pass, of payments and of refunds each.
    pub batch_size: u32,
    /// How long a resend with the same key is certain to be deduplicated by the provider.
    pub key_window: KeyWindow,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Payments' leases.
    pub payments: SweepCounts,
    /// Refunds' leases.
    pub refunds: SweepCounts,
}

impl Counts {
    /// How many rows this pass changed.
    pub fn changed(&self) -> u64 {
        self.payments.changed() + self.refunds.changed()
    }
}

/// The sweeper loop.
pub struct Sweeper {
    pool: PgPool,
    config: SweeperConfig,
}

/// A pass that changed something may have left more expired leases behind it.
impl Pass for Sweeper {
    const NAME: &'static str = "sweeper";

    fn interval(&self) -> Duration {
        self.config.interval
    }

    async fn pass(&self) -> anyhow::Result<bool> {
        Ok(self.run_once().await?.changed() > 0)
    }
}

impl Sweeper {
    /// A sweeper over `pool`.
    pub fn new(pool: PgPool, config: SweeperConfig) -> Self {
        Self { pool, config }
    }

    /// One pass: up to `batch_size` expired payment leases and as many refund leases taken back.
    /// Inside the provider's key window a payment or a refund goes back to `pending` and is resent
    /// with the same key; past it, it becomes `unknown`, for the poller.
    #[tracing::instrument(name = "sweeper.pass", skip_all, fields(swept.payments, swept.refunds))]
    pub async fn run_once(&self) -> anyhow::Result<Counts> {
        let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
        let payments = leases::sweep(&mut conn, ACTOR, self.config.key_window, self.config.batch_size)
            .await
            .context("cannot sweep expired leases")?;
        count_taken_over(crate::metrics::LEASES_TAKEN_OVER, &payments);
        let refunds = sending::sweep(&mut conn, ACTOR, self.config.key_window, self.config.batch_size)
            .await
            .context("cannot sweep expired refund leases")?;
        count_taken_over(crate::metrics::REFUND_LEASES_TAKEN_OVER, &refunds);
        let span = tracing::Span::current();
        span.record("swept.payments", payments.changed());
        span.record("swept.refunds", refunds.changed());
        if refunds.released + refunds.uncertain > 0 {
            tracing::info!(
                refunds.released = refunds.released,
                refunds.uncertain = refunds.uncertain,
                "took back expired refund leases"
            );
        }
        Ok(Counts { payments, refunds })
    }
}

/// Adds what a sweep changed to the counter `name`, by outcome.
fn count_taken_over(name: &'static str, swept: &SweepCounts) {
    for (label, n) in [("released", swept.released), ("uncertain", swept.uncertain), ("obsolete", swept.obsolete)] {
        metrics::counter!(name, "outcome" => label).increment(n);
    }
}
