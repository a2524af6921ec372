//! The PostgreSQL `LISTEN/NOTIFY` channels that wake processes instead of polling, and the
//! [`Notifier`] that sends on them after a commit, many wake-ups per notification.
//!
//! A notification is only a hint: listeners always re-read the database, and every loop that waits
//! on one also polls on a timer, so a lost notification (a dropped listener connection, a process that
//! crashed between its commit and its notification) delays work but never loses it. The channel
//! names are repeated as literals in the SQL that sends them; the tests that wait on them keep the two
//! in step.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// New or re-queued outbox rows: wakes the workers. Payload: the tenant ids whose rows the api
/// queued, separated by commas; empty for rows queued by others (the worker then scans the outbox).
pub const OUTBOX_CHANNEL: &str = "oncepay_outbox";

/// Payments changed status: wakes long polls. Payload: the payment ids, separated by commas.
pub const PAYMENT_CHANNEL: &str = "oncepay_payment";

/// The shortest time between two notifications from one [`Notifier`]. An idle notifier sends at
/// once, so a lone commit wakes its listeners without delay. Under load the listeners are busy
/// anyway, and each notification costs PostgreSQL a transaction and a wake-up of every listening
/// backend: a shorter interval cost the api a visible share of its accept rate (see BENCHMARKS.md).
pub const COALESCE: Duration = Duration::from_millis(10);

/// The most bytes one notification's payload may hold (PostgreSQL refuses 8000 and more).
const MAX_PAYLOAD: usize = 7_900;

/// The ids a payload names: payment ids on [`PAYMENT_CHANNEL`], tenant ids on [`OUTBOX_CHANNEL`];
/// `Err` for a part that is not one.
pub fn named_ids<'a, T: FromStr + 'a>(payload: &'a str) -> impl Iterator<Item = Result<T, T::Err>> + 'a {
    payload.split(',').map(str::parse)
}

/// The handle that asks a [`Notifier`] for a notification; cheap to clone.
#[derive(Clone, Default)]
pub struct Wakeups {
    inner: Arc<Pending>,
}

#[derive(Default)]
struct Pending {
    payloads: Mutex<Vec<String>>,
    requested: AtomicBool,
    signal: Notify,
}

impl Wakeups {
    /// Asks for a notification naming `id`: a payment on the payment channel, a tenant on the
    /// outbox channel. Ids asked for while one is pending or being sent travel together, each once.
    pub fn announce(&self, id: impl fmt::Display) {
        self.inner.payloads.lock().unwrap_or_else(PoisonError::into_inner).push(id.to_string());
        self.inner.requested.store(true, Ordering::Release);
        self.inner.signal.notify_one();
    }

    async fn requested(&self) {
        self.inner.signal.notified().await;
    }

    /// What was asked for since the last call, each id once, in the order first asked for: `None`
    /// when nothing was.
    fn take(&self) -> Option<Vec<String>> {
        let mut payloads = self.inner.payloads.lock().unwrap_or_else(PoisonError::into_inner);
        let mut ids = self.inner.requested.swap(false, Ordering::AcqRel).then(|| std::mem::take(&mut *payloads))?;
        let mut seen = HashSet::new();
        ids.retain(|id| seen.insert(id.clone()));
        Some(ids)
    }
}

/// A process's one sender of notifications on one channel.
///
/// Hot paths (the api's accepts, the worker's recordings) commit without notifying and ask this
/// instead. PostgreSQL holds a cluster-wide lock from just before a notifying transaction commits
/// until its commit record is flushed, so transactions that each notify commit one at a time, each
/// waiting for its own fsync instead of sharing one (see BENCHMARKS.md). Rare writers (the
/// reconciler, operators) still notify inside their transaction.
pub struct Notifier {
    pool: PgPool,
    channel: &'static str,
    wakeups: Wakeups,
}

impl Notifier {
    /// A notifier on `channel` that sends through `pool` (a pool of its own, so it never takes a
    /// connection a request needs) whatever `wakeups` asks for.
    pub fn new(pool: PgPool, channel: &'static str, wakeups: Wakeups) -> Self {
        Self { pool, channel, wakeups }
    }

    /// Sends notifications as they are asked for until `shutdown`, then one last one for anything
    /// not yet announced. Sends at once when idle, then at most once per [`COALESCE`], folding every
    /// wake-up asked for in between into the next notification.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.wakeups.requested() => {}
            }
            match self.flush().await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!(channel = self.channel, "notifying works again");
                }
                Ok(()) => {}
                Err(error) if !failing => {
                    failing = true;
                    tracing::warn!(channel = self.channel, error = %error, "cannot notify; listeners will find the changes by polling");
                }
                Err(_) => {}
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(COALESCE) => {}
            }
        }
        // Commits made during the last pause (or the shutdown) are announced too.
        if let Err(error) = self.flush().await {
            tracing::debug!(channel = self.channel, error = %error, "the last notification failed");
        }
    }

    /// Sends, now, everything asked for since the last notification, in one statement: one
    /// notification per payload that fits, or a single empty one when nothing named a payload.
    /// Sends nothing when nothing was asked for.
    pub async fn flush(&self) -> Result<(), sqlx::Error> {
        let Some(parts) = self.wakeups.take() else { return Ok(()) };
        let payloads = batch(parts);
        sqlx::query!("SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload", self.channel, &payloads)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// `parts` joined by commas into as few payloads as fit; one empty payload when there are none.
fn batch(parts: Vec<String>) -> Vec<String> {
    let mut payloads = Vec::new();
    let mut current = String::new();
    for part in parts {
        if !current.is_empty() && current.len() + 1 + part.len() > MAX_PAYLOAD {
            payloads.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push(',');
        }
        current.push_str(&part);
    }
    payloads.push(current);
    payloads
}

#[cfg(test)]
mod tests {
    use oncepay_domain::ids::{PaymentId, TenantId};

    use super::*;

    #[tokio::test]
    async fn wakeups_asked_for_while_one_is_pending_coalesce_into_one() {
        let wakeups = Wakeups::default();

        wakeups.announce(PaymentId::generate());
        wakeups.announce(PaymentId::generate());

        // One stored permit: the first wait returns at once, the second has nothing to take.
        tokio::time::timeout(Duration::from_secs(1), wakeups.requested()).await.unwrap();
        let second = tokio::time::timeout(Duration::ZERO, wakeups.requested()).await;
        assert!(second.is_err());
        assert_eq!(wakeups.take().map(|ids| ids.len()), Some(2));
        assert_eq!(wakeups.take(), None, "nothing was asked for since");
    }

    #[test]
    fn announced_ids_travel_in_payloads_postgres_accepts_and_parse_back() {
        let ids: Vec<PaymentId> = (0..500).map(|_| PaymentId::generate()).collect();

        let payloads = batch(ids.iter().map(ToString::to_string).collect());

        assert_eq!(payloads.len(), 3, "{} ids of 36 bytes and a comma in 7,900-byte payloads", ids.len());
        assert!(payloads.iter().all(|payload| payload.len() <= MAX_PAYLOAD));
        let parsed: Vec<PaymentId> =
            payloads.iter().flat_map(|p| named_ids::<PaymentId>(p)).map(Result::unwrap).collect();
        assert_eq!(parsed, ids);
    }

    #[test]
    fn an_id_announced_many_times_travels_once_and_no_announcement_is_none() {
        let wakeups = Wakeups::default();
        assert_eq!(wakeups.take(), None);
        let (busy, other) = (TenantId::generate(), TenantId::generate());

        for _ in 0..100 {
            wakeups.announce(busy);
        }
        wakeups.announce(other);

        assert_eq!(wakeups.take().map(batch), Some(vec![format!("{busy},{other}")]));
    }

    #[test]
    fn a_single_id_payload_is_what_in_transaction_notifications_send() {
        let id = PaymentId::generate();

        let parsed: Vec<_> = named_ids::<PaymentId>(&id.to_string()).collect();

        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].as_ref().ok(), Some(&id));
    }
}
