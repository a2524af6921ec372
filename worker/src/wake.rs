//! Waking the drainer when rows are queued: `LISTEN` on the outbox channel, forwarded to a
//! [`Notify`] the drainer waits on.
//!
//! A notification is only a hint that something may be due: the drainer always re-reads the outbox
//! and also polls on a timer, so a notification lost while the listening connection was down only
//! delays work. This module never reads or writes a table.

use std::sync::Arc;
use std::time::Duration;

use oncepay_store::notify::OUTBOX_CHANNEL;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// A background listener; stops when dropped.
pub struct Wake {
    notify: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Wake {
    /// Starts listening on one connection of `pool` (held for as long as this lives), reconnecting
    /// after `retry` when that fails.
    pub fn spawn(pool: PgPool, retry: Duration) -> Self {
        let notify = Arc::new(Notify::new());
        let task = tokio::spawn(listen(pool, notify.clone(), retry));
        Self { notify, task }
    }

    /// Resolves at the next notification, or at once if one arrived since the last call. A burst of
    /// notifications leaves one stored wake-up.
    pub async fn notified(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn listen(pool: PgPool, notify: Arc<Notify>, retry: Duration) {
    loop {
        match subscribe(&pool).await {
            Ok(mut listener) => {
                // Rows queued while nobody was listening: look once.
                notify.notify_one();
                loop {
                    match listener.recv().await {
                        Ok(_) => notify.notify_one(),
                        Err(error) => {
                            tracing::warn!(error = %error, "lost the outbox listener; polling until it is back");
                            break;
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(error = %error, "cannot listen for queued payments; polling until it works");
            }
        }
        tokio::time::sleep(retry).await;
    }
}

async fn subscribe(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(OUTBOX_CHANNEL).await?;
    Ok(listener)
}
