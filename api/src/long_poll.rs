//! Long polling: wakes `GET /v1/payments/{id}` requests (`Prefer: wait=N`) when their payment
//! changes, by PostgreSQL `LISTEN` rather than by sleeping in a loop.
//!
//! A notification is only a hint: waiters re-read the payment (through
//! [`Rereads`](crate::rereads::Rereads)) and keep waiting if its status did not change. A change is
//! never missed, at worst noticed a reconnection later. Waiters hold no database connection while
//! they wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_service::backoff::Backoff;
use oncepay_store::notify::{self, PAYMENT_CHANNEL};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Waiters by payment id. Each payment with waiters has a counter that every notification bumps.
///
/// Holds at most `max_waiting` waiters, and at most `max_waiting_per_tenant` of one tenant, so one
/// tenant's burst cannot take the waits (or their re-reads) from others.
pub struct PaymentWatch {
    payments: Mutex<HashMap<PaymentId, watch::Sender<u64>>>,
    waiters: Mutex<Waiters>,
    max_waiting: usize,
    max_waiting_per_tenant: usize,
}

/// How many subscriptions are held, in all and by tenant.
#[derive(Default)]
struct Waiters {
    total: usize,
    by_tenant: HashMap<TenantId, usize>,
}

impl PaymentWatch {
    /// A watch that holds at most `max_waiting` subscriptions, `max_waiting_per_tenant` of one tenant.
    pub fn new(max_waiting: usize, max_waiting_per_tenant: usize) -> Self {
        Self { payments: Mutex::default(), waiters: Mutex::default(), max_waiting, max_waiting_per_tenant }
    }

    /// Starts watching `payment_id` for `tenant_id`: every notification from now on marks the
    /// subscription changed. Subscribe *before* reading the payment, so a change committed between
    /// the read and the wait still wakes the waiter. `None` when the process, or the tenant,
    /// already holds its most: the request is then served at once instead of waiting.
    pub fn subscribe(self: &Arc<Self>, tenant_id: TenantId, payment_id: PaymentId) -> Option<Subscription> {
        {
            let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
            let Waiters { total, by_tenant } = &mut *waiters;
            let of_tenant = by_tenant.entry(tenant_id).or_default();
            if *total >= self.max_waiting || *of_tenant >= self.max_waiting_per_tenant {
                if *of_tenant == 0 {
                    by_tenant.remove(&tenant_id);
                }
                return None;
            }
            *total += 1;
            *of_tenant += 1;
        }
        let mut payments = self.payments.lock().unwrap_or_else(PoisonError::into_inner);
        let receiver = match payments.get(&payment_id) {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(0);
                payments.insert(payment_id, sender);
                receiver
            }
        };
        Some(Subscription { watch: Arc::clone(self), tenant_id, payment_id, receiver: Some(receiver), waiting: false })
    }

    /// Wakes the waiters of `payment_id`, if any.
    pub fn notify(&self, payment_id: PaymentId) {
        let payments = self.payments.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = payments.get(&payment_id) {
            sender.send_modify(|version| *version = version.wrapping_add(1));
        }
    }

    /// Wakes every waiter: notifications may have been lost.
    pub fn notify_all(&self) {
        let payments = self.payments.lock().unwrap_or_else(PoisonError::into_inner);
        for sender in payments.values() {
            sender.send_modify(|version| *version = version.wrapping_add(1));
        }
    }

    /// How many payments have waiters.
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.payments.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    fn unsubscribe(&self, tenant_id: TenantId, payment_id: PaymentId) {
        {
            let mut payments = self.payments.lock().unwrap_or_else(PoisonError::into_inner);
            // Checked under the lock: a subscriber that arrived since our receiver was dropped keeps it.
            if payments.get(&payment_id).is_some_and(|sender| sender.receiver_count() == 0) {
                payments.remove(&payment_id);
            }
        }
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        waiters.total = waiters.total.saturating_sub(1);
        if let Some(of_tenant) = waiters.by_tenant.get_mut(&tenant_id) {
            *of_tenant = of_tenant.saturating_sub(1);
            if *of_tenant == 0 {
                waiters.by_tenant.remove(&tenant_id);
            }
        }
    }
}

/// One waiter's interest in one payment; dropping it unsubscribes.
pub struct Subscription {
    watch: Arc<PaymentWatch>,
    tenant_id: TenantId,
    payment_id: PaymentId,
    receiver: Option<watch::Receiver<u64>>,
    /// Counted in the waiting gauge.
    waiting: bool,
}

impl Subscription {
    /// Counts the waiter in `oncepay_api_long_polls_waiting` from now until it is dropped: once it
    /// has read the payment it waits on, so that a change made after the gauge counts it is one
    /// the waiter has not seen yet.
    pub fn waiting(&mut self) {
        if !self.waiting {
            self.waiting = true;
            metrics::gauge!(crate::metrics::LONG_POLLS_WAITING).increment(1);
        }
    }

    /// Resolves once a notification for the payment arrived since the subscription began or since
    /// the last call. Cancel-safe.
    pub async fn changed(&mut self) {
        // The receiver is only taken on drop. The sender lives while any receiver does, so
        // `changed` cannot fail; if it ever did, waking the waiter (who re-reads) is the safe
        // choice.
        if let Some(receiver) = self.receiver.as_mut() {
            let _ = receiver.changed().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        drop(self.receiver.take());
        self.watch.unsubscribe(self.tenant_id, self.payment_id);
        if self.waiting {
            metrics::gauge!(crate::metrics::LONG_POLLS_WAITING).decrement(1);
        }
    }
}

/// The process's one listener connection, feeding a [`PaymentWatch`].
///
/// Listens on [`PAYMENT_CHANNEL`], where every status change notifies its payment id: in the
/// transaction that makes the change or, from the worker, soon after its commit together with other
/// ids. Notifications sent while the connection is lost are gone, so every (re)connection wakes
/// every waiter to re-read.
pub struct PaymentListener {
    pool: PgPool,
    watch: Arc<PaymentWatch>,
}

/// How long to wait before reconnecting after the listener failed `n` times in a row.
const RECONNECT: Backoff = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(5) };

impl PaymentListener {
    /// A listener that takes its connection from `pool` (a pool of its own, so it never holds one
    /// of the requests' connections).
    pub fn new(pool: PgPool, watch: Arc<PaymentWatch>) -> Self {
        Self { pool, watch }
    }

    /// Listens until `shutdown`, reconnecting with backoff whenever the connection fails.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            match self.listen(&shutdown, &mut failures).await {
                Ok(()) => break,
                Err(error) => {
                    failures = failures.saturating_add(1);
                    // Changes may have been committed while nobody listened.
                    self.watch.notify_all();
                    let delay = RECONNECT.delay(failures, &mut rand::rng());
                    tracing::warn!(
                        error = %error,
                        failures,
                        delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        "the payment listener lost its connection; reconnecting",
                    );
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = shutdown.cancelled() => break,
                    }
                }
            }
        }
        tracing::debug!("the payment listener stopped");
    }

    /// One connection's life: listen, then dispatch notifications until shutdown or an error.
    async fn listen(&self, shutdown: &CancellationToken, failures: &mut u32) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(PAYMENT_CHANNEL).await?;
        *failures = 0;
        tracing::debug!(channel = PAYMENT_CHANNEL, "listening for payment changes");
        self.watch.notify_all();
        loop {
            let notification = tokio::select! {
                received = listener.try_recv() => received?,
                () = shutdown.cancelled() => return Ok(()),
            };
            match notification {
                Some(notification) => {
                    for parsed in notify::named_ids::<PaymentId>(notification.payload()) {
                        match parsed {
                            Ok(payment_id) => self.watch.notify(payment_id),
                            Err(_) => tracing::warn!(
                                channel = PAYMENT_CHANNEL,
                                "ignoring a part of a notification that names no payment"
                            ),
                        }
                    }
                }
                // The connection was lost and sqlx re-established it: anything sent in between is gone.
                None => {
                    tracing::warn!("the payment listener reconnected; waking every long poll to re-read");
                    self.watch.notify_all();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn watch() -> Arc<PaymentWatch> {
        Arc::new(PaymentWatch::new(100, 100))
    }

    fn subscribe(watch: &Arc<PaymentWatch>, payment_id: PaymentId) -> Subscription {
        watch.subscribe(TenantId::generate(), payment_id).expect("under the bounds")
    }

    /// Whether a wake-up is already pending (no waiting involved).
    fn woken(subscription: &mut Subscription) -> bool {
        subscription.changed().now_or_never().is_some()
    }

    #[test]
    fn a_notification_after_subscribing_wakes_the_waiter_even_if_sent_before_it_waits() {
        let watch = watch();
        let payment = PaymentId::generate();
        let mut subscription = subscribe(&watch, payment);

        watch.notify(payment);

        assert!(woken(&mut subscription));
        assert!(!woken(&mut subscription), "one notification wakes once");
    }

    #[test]
    fn other_payments_notifications_do_not_wake_a_waiter() {
        let watch = watch();
        let mut subscription = subscribe(&watch, PaymentId::generate());

        watch.notify(PaymentId::generate());

        assert!(!woken(&mut subscription));
    }

    #[test]
    fn notify_all_wakes_every_waiter() {
        let watch = watch();
        let mut first = subscribe(&watch, PaymentId::generate());
        let mut second = subscribe(&watch, PaymentId::generate());

        watch.notify_all();

        assert!(woken(&mut first));
        assert!(woken(&mut second));
    }

    #[test]
    fn a_payment_is_forgotten_when_its_last_waiter_leaves() {
        let watch = watch();
        let payment = PaymentId::generate();
        let first = subscribe(&watch, payment);
        let second = subscribe(&watch, payment);

        drop(first);
        assert_eq!(watch.watched(), 1);
        drop(second);
        assert_eq!(watch.watched(), 0);
    }

    #[test]
    fn subscriptions_beyond_a_tenants_bound_or_the_process_bound_are_refused_until_one_leaves() {
        let watch = Arc::new(PaymentWatch::new(3, 2));
        let (busy, quiet) = (TenantId::generate(), TenantId::generate());
        let held: Vec<_> = (0..2).map(|_| watch.subscribe(busy, PaymentId::generate()).unwrap()).collect();

        assert!(watch.subscribe(busy, PaymentId::generate()).is_none(), "the tenant's bound");
        let third = watch.subscribe(quiet, PaymentId::generate()).expect("another tenant still waits");
        assert!(watch.subscribe(quiet, PaymentId::generate()).is_none(), "the process's bound");

        drop(third);
        assert!(watch.subscribe(quiet, PaymentId::generate()).is_some(), "a place was freed");
        drop(held);
        assert!(watch.subscribe(busy, PaymentId::generate()).is_some());
    }
}
