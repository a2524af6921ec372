//! Waking the workers after accepts: one `NOTIFY oncepay_outbox` for every payment accepted since
//! the previous one.
//!
//! The accept statement does not notify (`store::intake::accept_deferring_wakeup`): PostgreSQL holds
//! a cluster-wide lock from just before a notifying transaction commits until its commit record is
//! flushed, so accepts that each notified would commit one at a time, each waiting for its own fsync
//! instead of sharing one (BENCHMARKS.md: it halved the accept rate at 8 connections). Instead,
//! intake calls [`OutboxWake::wake`] once an accept has committed, and one [`OutboxWaker`] per
//! process sends the `NOTIFY` from a connection of its own: at once when it was idle, then at most
//! once per [`COALESCE`], every wake in between folded into the next notification.
//!
//! A notification is only a hint (`oncepay_shared::notify`): workers also poll, so a notification
//! lost to a crash between an accept's commit and the `NOTIFY`, or to an unreachable database,
//! delays that payment by at most the workers' poll interval and loses nothing. This module never
//! writes a table.

use std::sync::Arc;
use std::time::Duration;

use oncepay_shared::notify::OUTBOX_CHANNEL;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The shortest time between two notifications from one process: under load a worker is busy
/// anyway, and an idle one is still woken within this long of an accept.
pub const COALESCE: Duration = Duration::from_millis(2);

/// The handle intake uses to ask for a wake-up; cheap to share.
#[derive(Clone, Default)]
pub struct OutboxWake {
    pending: Arc<Notify>,
}

impl OutboxWake {
    /// Asks for a `NOTIFY` soon. Requests made while one is pending or being sent coalesce.
    pub fn wake(&self) {
        self.pending.notify_one();
    }
}

/// The process's one sender of outbox notifications.
pub struct OutboxWaker {
    pool: PgPool,
    wake: OutboxWake,
}

impl OutboxWaker {
    /// A waker that notifies through `pool` (a pool of its own, so it never takes a connection a
    /// request needs) whenever `wake` asks.
    pub fn new(pool: PgPool, wake: OutboxWake) -> Self {
        Self { pool, wake }
    }

    /// Sends notifications as they are asked for until `shutdown`, then one last one for any accept
    /// not yet announced.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.wake.pending.notified() => {}
            }
            match self.notify().await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("notifying the workers works again");
                }
                Ok(()) => {}
                Err(error) if !failing => {
                    failing = true;
                    tracing::warn!(error = %error, "cannot notify the workers; they will find new payments by polling");
                }
                Err(_) => {}
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(COALESCE) => {}
            }
        }
        // Accepts that committed during the last pause (or the shutdown) are announced too.
        if let Err(error) = self.notify().await {
            tracing::debug!(error = %error, "the last notification to the workers failed");
        }
    }

    async fn notify(&self) -> Result<(), sqlx::Error> {
        sqlx::query!("SELECT pg_notify($1, '')", OUTBOX_CHANNEL).execute(&self.pool).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wakes_requested_while_one_is_pending_coalesce_into_one() {
        let wake = OutboxWake::default();

        wake.wake();
        wake.wake();
        wake.wake();

        // One stored permit: the first wait returns at once, the second has nothing to take.
        tokio::time::timeout(Duration::from_secs(1), wake.pending.notified()).await.unwrap();
        let second = tokio::time::timeout(Duration::ZERO, wake.pending.notified()).await;
        assert!(second.is_err());
    }
}
