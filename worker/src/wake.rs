//! Waking the drainer when rows are queued: `LISTEN` on the outbox channel, forwarded to a
//! [`Notify`] the drainer waits on, with the tenants the notifications named.
//!
//! The api names the tenants whose payments it accepted; a notification without names (a row
//! queued again by the reconciler or an operator, or one the listener may have missed) asks for a
//! scan of the outbox instead. A notification is only a hint that something may be due: the
//! drainer always re-reads the outbox and also scans on a timer, so a notification lost while the
//! listening connection was down only delays work. This module never reads or writes a table.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncepay_domain::ids::TenantId;
use oncepay_store::notify::{OUTBOX_CHANNEL, named_ids};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// What the notifications since the last [`Wake::take`] asked for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Woken {
    /// The tenants they named.
    pub tenants: Vec<TenantId>,
    /// Whether one named no one (or could not be read), so the whole outbox should be scanned.
    pub scan: bool,
}

impl Woken {
    fn add(&mut self, payload: &str) {
        if payload.is_empty() {
            self.scan = true;
            return;
        }
        for id in named_ids::<TenantId>(payload) {
            match id {
                Ok(tenant) => self.tenants.push(tenant),
                Err(_) => self.scan = true,
            }
        }
    }
}

/// A background listener; stops when dropped.
pub struct Wake {
    notify: Arc<Notify>,
    woken: Arc<Mutex<Woken>>,
    task: JoinHandle<()>,
}

impl Wake {
    /// Starts listening on one connection of `pool` (held for as long as this lives), reconnecting
    /// after `retry` when that fails.
    pub fn spawn(pool: PgPool, retry: Duration) -> Self {
        let notify = Arc::new(Notify::new());
        let woken = Arc::new(Mutex::new(Woken::default()));
        let task = tokio::spawn(listen(pool, notify.clone(), woken.clone(), retry));
        Self { notify, woken, task }
    }

    /// Resolves at the next notification, or at once if one arrived since the last call. A burst of
    /// notifications leaves one stored wake-up.
    pub async fn notified(&self) {
        self.notify.notified().await;
    }

    /// What the notifications asked for since the last call.
    pub fn take(&self) -> Woken {
        std::mem::take(&mut *self.woken.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn listen(pool: PgPool, notify: Arc<Notify>, woken: Arc<Mutex<Woken>>, retry: Duration) {
    let wake = |payload: &str| {
        woken.lock().unwrap_or_else(PoisonError::into_inner).add(payload);
        notify.notify_one();
    };
    loop {
        match subscribe(&pool).await {
            Ok(mut listener) => {
                // Rows queued while nobody was listening: scan once.
                wake("");
                loop {
                    match listener.recv().await {
                        Ok(notification) => wake(notification.payload()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_tenants_are_kept_and_an_empty_or_unreadable_payload_asks_for_a_scan() {
        let (a, b) = (TenantId::generate(), TenantId::generate());
        let mut woken = Woken::default();

        woken.add(&format!("{a},{b}"));
        assert_eq!(woken, Woken { tenants: vec![a, b], scan: false });

        woken.add("");
        assert!(woken.scan);

        let mut garbled = Woken::default();
        garbled.add("not-a-tenant");
        assert_eq!(garbled, Woken { tenants: vec![], scan: true });
    }
}
