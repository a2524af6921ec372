//! The sweeper: takes outbox leases back from workers that died or stalled. It never touches a lease
//! that has not expired.
//!
//! The takeover itself is `oncepay_store::leases::sweep`, kept with the worker's claim and record
//! statements so the protocol lives in one place; this module only runs it.

use std::time::Duration;

use anyhow::Context;
use oncepay_provider::KeyWindow;
use oncepay_store::leases::{self, SweepCounts};
use sqlx::PgPool;

use crate::runner::Pass;

/// Who the audit trail says moved the payment.
const ACTOR: &str = "sweeper";

/// The sweeper's limits.
#[derive(Debug, Clone)]
pub struct SweeperConfig {
    /// Pause after a pass that changed nothing.
    pub interval: Duration,
    /// Leases looked at per pass.
    pub batch_size: u32,
    /// How long a resend with the same key is certain to be deduplicated by the provider.
    pub key_window: KeyWindow,
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

    /// One pass: up to `batch_size` expired leases taken back. Inside the provider's key window a
    /// payment goes back to `pending` and is resent with the same key; past it, the payment becomes
    /// `unknown` and is queued for the poller.
    pub async fn run_once(&self) -> anyhow::Result<SweepCounts> {
        let mut conn = self.pool.acquire().await.context("cannot reach the database")?;
        let counts = leases::sweep(&mut conn, ACTOR, self.config.key_window, self.config.batch_size)
            .await
            .context("cannot sweep expired leases")?;
        for (label, n) in
            [("released", counts.released), ("uncertain", counts.uncertain), ("obsolete", counts.obsolete)]
        {
            metrics::counter!(crate::metrics::LEASES_TAKEN_OVER, "outcome" => label).increment(n);
        }
        Ok(counts)
    }
}
