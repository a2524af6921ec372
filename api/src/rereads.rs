//! Re-reads for woken long polls, coalesced: the payments in one statement per tenant, each refund
//! once however many waiters asked for it.
//!
//! Waiters queue what they wait on with [`Rereads::read`] or [`Rereads::read_refund`]; one task, on
//! a connection of its own, reads everything queued since its last statements and hands each waiter
//! its payment or refund. A payment or refund many waiters asked for is read once.

use std::collections::HashMap;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_service::telemetry;
use oncepay_store::payments::Payment;
use oncepay_store::refunds::{self, Refund};
use oncepay_store::{StoreError, payments};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// The most re-reads served in one batch.
const MAX_BATCH: usize = 1000;

/// One waiter's request: what to read, and where to send it.
enum Request {
    Payment { tenant_id: TenantId, payment_id: PaymentId, reply: oneshot::Sender<Payment> },
    Refund { tenant_id: TenantId, refund_id: RefundId, reply: oneshot::Sender<Refund> },
}

/// Queues re-reads for the [`Rereader`]. Cheap to clone.
///
/// One notification can wake many long polls at once: the waiters of a busy payment, or every
/// waiter when the listener reconnects. Rather than each re-reading its own payment or refund, they
/// queue it here.
#[derive(Clone)]
pub struct Rereads {
    requests: mpsc::Sender<Request>,
}

impl Rereads {
    /// The queue, and the task that serves it. `capacity` is the most waiters the process holds.
    pub fn new(pool: PgPool, capacity: usize) -> (Self, Rereader) {
        let (requests, queue) = mpsc::channel(capacity.max(1));
        (Self { requests }, Rereader { pool, queue })
    }

    /// How many re-reads are waiting to be served.
    pub fn queued(&self) -> usize {
        self.requests.max_capacity() - self.requests.capacity()
    }

    /// The payment as it stands, read together with every other payment queued meanwhile; `None`
    /// if the read failed, the payment is gone or the process is stopping.
    pub async fn read(&self, tenant_id: TenantId, payment_id: PaymentId) -> Option<Payment> {
        let (reply, payment) = oneshot::channel();
        self.requests.send(Request::Payment { tenant_id, payment_id, reply }).await.ok()?;
        payment.await.ok()
    }

    /// The refund as it stands, read once for every waiter that queued it meanwhile; `None` if the
    /// read failed, the refund is gone or the process is stopping.
    pub async fn read_refund(&self, tenant_id: TenantId, refund_id: RefundId) -> Option<Refund> {
        let (reply, refund) = oneshot::channel();
        self.requests.send(Request::Refund { tenant_id, refund_id, reply }).await.ok()?;
        refund.await.ok()
    }
}

/// The task that reads queued payments in batches.
pub struct Rereader {
    pool: PgPool,
    queue: mpsc::Receiver<Request>,
}

impl Rereader {
    /// Serves re-reads until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                served = self.run_once() => if served.is_none() { break },
                () = shutdown.cancelled() => break,
            }
        }
        tracing::debug!("the long polls' re-reader stopped");
    }

    /// Waits for a re-read, then serves every one queued by then (up to a bound): one statement
    /// per tenant for payments, one per refund. Returns how many statements it ran; `None` once no
    /// [`Rereads`] is left.
    pub async fn run_once(&mut self) -> Option<usize> {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        if self.queue.recv_many(&mut batch, MAX_BATCH).await == 0 {
            return None;
        }
        let mut by_tenant: HashMap<TenantId, HashMap<PaymentId, Vec<oneshot::Sender<Payment>>>> = HashMap::new();
        let mut refunds: HashMap<(TenantId, RefundId), Vec<oneshot::Sender<Refund>>> = HashMap::new();
        for request in batch {
            match request {
                Request::Payment { tenant_id, payment_id, reply } => {
                    by_tenant.entry(tenant_id).or_default().entry(payment_id).or_default().push(reply);
                }
                Request::Refund { tenant_id, refund_id, reply } => {
                    refunds.entry((tenant_id, refund_id)).or_default().push(reply);
                }
            }
        }
        let statements = by_tenant.len() + refunds.len();
        // One statement per tenant, so each stays on its tenant's shard.
        for (tenant_id, mut waiting) in by_tenant {
            let payment_ids: Vec<PaymentId> = waiting.keys().copied().collect();
            match self.read(tenant_id, &payment_ids).await {
                Ok(found) => {
                    for payment in found {
                        for reply in waiting.remove(&payment.payment_id).unwrap_or_default() {
                            let _ = reply.send(payment.clone());
                        }
                    }
                }
                // Its waiters keep waiting: a re-read is only a check after a hint, and each waiter
                // reads for itself once its wait is over.
                Err(error) => tracing::warn!(
                    error = %telemetry::error_chain(&error),
                    payments = payment_ids.len(),
                    "cannot re-read payments for long polls; they keep waiting",
                ),
            }
        }
        // The store reads refunds one at a time; a refund's waiters still share its read.
        for ((tenant_id, refund_id), waiting) in refunds {
            match self.read_refund(tenant_id, refund_id).await {
                Ok(Some(refund)) => {
                    for reply in waiting {
                        let _ = reply.send(refund.clone());
                    }
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(
                    error = %telemetry::error_chain(&error),
                    "cannot re-read a refund for long polls; its waiters keep waiting",
                ),
            }
        }
        Some(statements)
    }

    async fn read(&self, tenant_id: TenantId, payment_ids: &[PaymentId]) -> Result<Vec<Payment>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        payments::fetch_many(&mut conn, tenant_id, payment_ids).await
    }

    async fn read_refund(&self, tenant_id: TenantId, refund_id: RefundId) -> Result<Option<Refund>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        refunds::find(&mut conn, tenant_id, refund_id).await
    }
}
