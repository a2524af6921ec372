//! Accepting one tenant's concurrent requests together: the requests that reach the store while a
//! write of their tenant is under way in this process wait for it, and are then written in one
//! statement and one commit (`oncepay_store::intake::accept_group`); a lone request is written at
//! once. Sizes and waits are `intake.group_max_requests` and `intake.group_max_wait_us`.
//!
//! Invariants: each request gets the result it would get alone, and only after its group has
//! committed (or failed); a group holds one tenant's requests, so under Citus it stays on that
//! tenant's shard; a group's write runs in a task of its own, so a client that goes away cannot cut
//! short the write other requests wait for. A request that would wait for a write under way reads
//! its key instead, if a connection is free, together with the other requests of its tenant that
//! would wait meanwhile ([`AcceptGroups::accept`] says why and when).

use std::sync::Arc;

use metrics::{Gauge, Histogram};
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::ids::TenantId;
use oncepay_service::group_commit::{GroupCommits, Limits, Queued};
use oncepay_store::StoreError;
use oncepay_store::connections::Connections;
use oncepay_store::intake::{self, ExistingKey, Intake, NewPayment};

use crate::metrics::{INTAKE_GROUP_SIZE, INTAKE_WRITING};

/// PostgreSQL's `lock_not_available`: the `lock_timeout` (`intake.key_lock_wait_ms`) expired while
/// waiting for a concurrent writer of the same key.
pub const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The groups being formed, one per tenant. Shared by the process's HTTP workers.
pub struct AcceptGroups {
    groups: GroupCommits<TenantId, Request, Result<Intake, StoreError>>,
    // The reads of keys handed back while their tenant's write is under way, grouped the same way.
    reads: GroupCommits<TenantId, IdempotencyKey, Result<Read, StoreError>>,
    // Handles taken once: a lookup in the metrics registry per request costs more than the update.
    writing: Gauge,
    group_size: Histogram,
}

impl AcceptGroups {
    /// No groups yet; each will have `limits`.
    pub fn new(limits: Limits) -> Self {
        Self {
            groups: GroupCommits::new(limits),
            reads: GroupCommits::new(Limits { max_wait: None, ..limits }),
            writing: metrics::gauge!(INTAKE_WRITING),
            group_size: metrics::histogram!(INTAKE_GROUP_SIZE),
        }
    }

    /// Accepts `new` together with the requests of its tenant waiting at that moment, or responds to
    /// it from its stored key, read while a write under way would keep it waiting. The read and the
    /// write use `connections`, the calling HTTP worker's own.
    ///
    /// A request that would wait for its tenant's write under way is handed back instead of queued,
    /// and reads its key meanwhile if a connection is free: a stored key (a retry) is replayed from
    /// its row, as the group's statement would replay it, and a key not found waits for the next
    /// write. So a tenant's retries are read beside its writes, not one group at a time. The keys
    /// handed back while a read of their tenant is under way are read together in the next one
    /// (`oncepay_store::intake::stored_many`), as writes are grouped: one statement for many
    /// retries. The group checks for a write and queues the request in one step, so a request never
    /// waits for a write that started after it looked. Once a request whose key was found new waits,
    /// the next write is certain, and later requests join it without a read: a burst of new keys pays
    /// for about one read a group. With every connection in use, a request waits without a read, so
    /// the reads never hold up a write.
    pub async fn accept(self: Arc<Self>, connections: Arc<Connections>, new: NewPayment) -> Result<Intake, StoreError> {
        // Written at once if nothing of its tenant is being written, or queued with a request whose
        // key was found new; otherwise handed back, to be read while that write goes on.
        // While a read of its tenant is under way, a request joins the next read: written alone now,
        // it would cost a statement of its own.
        let new = if self.reads.writing(&new.tenant_id) {
            new
        } else {
            let request = Request { new, found_new: false };
            match Arc::clone(&self).submit_unless_writing(Arc::clone(&connections), request).await {
                Ok(result) => return result,
                Err(handed_back) => handed_back.new,
            }
        };
        let tenant_id = new.tenant_id;
        let read = |keys: Vec<IdempotencyKey>| read(&connections, tenant_id, keys);
        // No result: the task reading the group went away midway; a read changes nothing, so the
        // request simply waits for the write.
        let found_new = match self.reads.submit(tenant_id, new.key.clone(), read).await {
            Some(Ok(Read::Stored(existing))) => return Ok(Intake::Existing(existing)),
            Some(Ok(Read::New)) => true,
            Some(Ok(Read::Skipped)) | None => false,
            Some(Err(error)) => return Err(error),
        };
        self.submit(connections, Request { new, found_new }).await
    }

    /// Queues `request` in its tenant's group, whatever is under way, and waits for its result. The
    /// group is written in a task of its own, which runs to its end even if the caller stops waiting.
    async fn submit(self: Arc<Self>, connections: Arc<Connections>, request: Request) -> Result<Intake, StoreError> {
        let tenant_id = request.new.tenant_id;
        let written = actix_web::rt::spawn(async move {
            let queued = self.groups.queue(tenant_id, request);
            self.written(&connections, queued).await
        })
        .await;
        settled(written)
    }

    /// [`Self::submit`], unless a write of the tenant is under way and no request whose key was found
    /// new waits for the next one (then that next write is certain): the request is then handed
    /// back, boxed since it carries the whole payment.
    async fn submit_unless_writing(
        self: Arc<Self>,
        connections: Arc<Connections>,
        request: Request,
    ) -> Result<Result<Intake, StoreError>, Box<Request>> {
        let tenant_id = request.new.tenant_id;
        let written = actix_web::rt::spawn(async move {
            let found_new = |waiting: &Request| waiting.found_new;
            let queued = self.groups.queue_unless_writing(tenant_id, request, found_new).map_err(Box::new)?;
            Ok(self.written(&connections, queued).await)
        })
        .await;
        match written {
            Ok(Err(handed_back)) => Err(handed_back),
            Ok(Ok(result)) => Ok(settled(Ok(result))),
            Err(stopped) => Ok(settled(Err(stopped))),
        }
    }

    /// The result of a queued request, once its group is written (by this task, if it comes first).
    async fn written(
        &self,
        connections: &Connections,
        queued: Queued<'_, TenantId, Request, Result<Intake, StoreError>>,
    ) -> Option<Result<Intake, StoreError>> {
        // Counted once queued, so that a request handed back is never counted.
        let _counted = Counted::start(&self.writing);
        // Boxed: the write is large, and only the task that writes a group needs room for it.
        let write = |group: Vec<Request>| {
            self.group_size.record(group.len() as f64);
            Box::pin(write(connections, group.into_iter().map(|request| request.new).collect()))
        };
        queued.written(write).await
    }
}

/// A written request's result. If its task or its writer was stopped midway (the runtime is shutting
/// down), whether it was written is unknown, so it fails closed and a retry with its key replays it.
fn settled(
    written: Result<Option<Result<Intake, StoreError>>, actix_web::rt::task::JoinError>,
) -> Result<Intake, StoreError> {
    match written {
        Ok(Some(result)) => result,
        Ok(None) | Err(_) => Err(StoreError::Unavailable(sqlx::Error::WorkerCrashed.into())),
    }
}

/// A request counted in [`INTAKE_WRITING`] until it has its result.
struct Counted<'a>(&'a Gauge);

impl<'a> Counted<'a> {
    fn start(gauge: &'a Gauge) -> Self {
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// What the read of a handed-back request's key found.
#[derive(Clone)]
enum Read {
    /// The key is stored: the request is answered from its row.
    Stored(ExistingKey),
    /// The key is not stored (yet): the request waits for the next write, which is now certain.
    New,
    /// Not read, every connection being in use: the request waits for the next write.
    Skipped,
}

/// Reads `keys` of `tenant_id` in one statement, if a connection is free at once.
async fn read(
    connections: &Connections,
    tenant_id: TenantId,
    keys: Vec<IdempotencyKey>,
) -> Vec<Result<Read, StoreError>> {
    let Some(conn) = connections.try_acquire().await else {
        return keys.iter().map(|_| Ok(Read::Skipped)).collect();
    };
    let stored = match conn {
        Ok(mut conn) => {
            let keys: Vec<&IdempotencyKey> = keys.iter().collect();
            let stored = intake::stored_many(&mut conn, tenant_id, &keys).await;
            if stored.is_ok() {
                conn.release();
            }
            stored
        }
        Err(error) => Err(StoreError::from(error)),
    };
    match stored {
        Ok(stored) => stored.into_iter().map(|key| Ok(key.map_or(Read::New, Read::Stored))).collect(),
        Err(error) => keys.iter().map(|_| Err(error.clone())).collect(),
    }
}

/// A request waiting for its group's write.
struct Request {
    new: NewPayment,
    /// Its key was read while it would have waited, and was not stored: the next write is certain.
    found_new: bool,
}

/// Writes one group on a connection of its own. The connection is reused unless a request failed in
/// a way that leaves it in doubt: a refusal PostgreSQL decided (a lock wait past `lock_timeout`)
/// leaves it idle and healthy.
async fn write(connections: &Connections, group: Vec<NewPayment>) -> Vec<Result<Intake, StoreError>> {
    let mut conn = match connections.acquire().await {
        Ok(conn) => conn,
        Err(error) => {
            let error = StoreError::from(error);
            return group.iter().map(|_| Err(error.clone())).collect();
        }
    };
    let results = intake::accept_group(&mut conn, &group).await;
    let healthy = results.iter().all(|result| match result {
        Ok(_) => true,
        Err(error) => error.sqlstate().as_deref() == Some(LOCK_NOT_AVAILABLE),
    });
    if healthy {
        conn.release();
    }
    results
}
