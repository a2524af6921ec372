//! Taking outbox leases back from workers that stopped: the sweeper's half of the outbox protocol.
//!
//! [`sweep`] takes back a worker's lease (`locked_by`, `locked_until`, `fencing_token`) that expired
//! while its payment was `processing`: inside the provider's key window the payment goes back to
//! `pending` and is resent with the same key; past it the payment becomes `unknown`, for the
//! reconciler. Either way the fencing token is gone, so the stalled worker can no longer record
//! anything. This module never calls the provider and never touches a lease that has not expired.

use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use time::OffsetDateTime;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_provider::KeyWindow;
use oncepay_service::telemetry::TraceContext;

use crate::transitions::{self, Change, Recorded, TransitionError};
use crate::{StoreError, unknown_queue};

/// What one sweep did, of payments' leases ([`sweep`]) or of refunds' (`refunds::sending::sweep`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepCounts {
    /// Expired leases inside the key window: back to `pending`, rows due now.
    pub released: u64,
    /// Expired leases past the key window: `unknown`, for the reconciler.
    pub uncertain: u64,
    /// Expired leases on payments or refunds that had already moved on (e.g. a webhook settled them
    /// while the worker was gone): the rows were dropped, or released if still `pending`.
    pub obsolete: u64,
    /// Candidates a worker or another sweeper was handling at that moment, or that moved between
    /// reading and locking them: left alone, to be looked at again by a later sweep if still expired.
    pub skipped: u64,
}

impl SweepCounts {
    /// How many rows this sweep changed.
    pub fn changed(&self) -> u64 {
        self.released + self.uncertain + self.obsolete
    }

    /// Counts one lease taken back.
    pub(crate) fn count(&mut self, taken: TakenBack) {
        match taken {
            TakenBack::Released => self.released += 1,
            TakenBack::Uncertain => self.uncertain += 1,
            TakenBack::Obsolete => self.obsolete += 1,
            TakenBack::Skipped => self.skipped += 1,
        }
    }
}

/// What taking back one expired lease did: one of [`SweepCounts`]' counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TakenBack {
    Released,
    Uncertain,
    Obsolete,
    Skipped,
}

/// Takes back up to `batch_size` expired leases, oldest first, each in its own transaction on
/// `conn`. `actor` is written to the audit trail (`sweeper`, or `sweeper:<id>`).
///
/// Returns after one batch; the caller loops while [`SweepCounts::changed`] is non-zero. An error
/// leaves the rows handled before it committed and the rest untouched.
#[tracing::instrument(name = "store.sweep_leases", skip_all, fields(batch_size))]
pub async fn sweep(
    conn: &mut PgConnection,
    actor: &str,
    key_window: KeyWindow,
    batch_size: u32,
) -> Result<SweepCounts, TransitionError> {
    let candidates = sqlx::query!(
        r#"
        SELECT tenant_id AS "tenant_id: TenantId", payment_id AS "payment_id: PaymentId" FROM outbox
        WHERE locked_until < now()
        ORDER BY locked_until
        LIMIT $1
        "#,
        i64::from(batch_size),
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(StoreError::from)?;

    let mut counts = SweepCounts::default();
    for candidate in candidates {
        counts.count(take_back(conn, actor, key_window, candidate.tenant_id, candidate.payment_id).await?);
    }
    Ok(counts)
}

#[tracing::instrument(name = "store.take_back_lease", skip_all, fields(payment.id = %payment_id))]
async fn take_back(
    conn: &mut PgConnection,
    actor: &str,
    key_window: KeyWindow,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<TakenBack, TransitionError> {
    // One short transaction per row, so any number of sweepers and workers can run at once.
    let mut tx = conn.begin().await.map_err(StoreError::from)?;
    let Some(lease) = lock_expired(&mut tx, key_window, tenant_id, payment_id).await? else {
        return Ok(TakenBack::Skipped);
    };
    let status = lease.status;
    let expired = Expired {
        actor,
        tenant_id,
        payment_id,
        evidence: json!({
            "source": actor,
            "locked_by": lease.locked_by,
            "locked_until": rfc3339(lease.locked_until),
            "fencing_token": lease.fencing_token,
            "attempt": lease.attempts,
            "first_sent_at": lease.first_sent_at.map(rfc3339),
            "key_window_secs": key_window.window.as_secs(),
            "safety_margin_secs": key_window.safety_margin.as_secs(),
        }),
        lease,
    };
    let taken = match (status, expired.lease.in_key_window) {
        (PaymentStatus::Processing, true) => resend(&mut tx, &expired).await?,
        (PaymentStatus::Processing, false) => hand_over(&mut tx, &expired).await?,
        (_, _) => drop_obsolete(&mut tx, &expired).await?,
    };
    if taken == TakenBack::Skipped {
        tx.rollback().await.map_err(StoreError::from)?;
        return Ok(TakenBack::Skipped);
    }
    tx.commit().await.map_err(StoreError::from)?;
    if taken == TakenBack::Released || status == PaymentStatus::Pending {
        wake_workers(conn, tenant_id).await;
    }
    if taken == TakenBack::Obsolete {
        tracing::info!(payment.status = status.as_str(), "dropped the expired lease of a payment that moved on");
    } else {
        let resend = taken == TakenBack::Released;
        tracing::info!(worker.id = %expired.lease.locked_by, resend, "took back an expired lease");
    }
    Ok(taken)
}

/// An expired lease, locked, and what its payment is.
struct ExpiredLease {
    locked_by: String,
    locked_until: OffsetDateTime,
    fencing_token: i64,
    attempts: i32,
    traceparent: Option<String>,
    tracestate: Option<String>,
    status: PaymentStatus,
    first_sent_at: Option<OffsetDateTime>,
    in_key_window: bool,
}

/// One lease being taken back, with the evidence its audit row and queue row carry.
struct Expired<'a> {
    actor: &'a str,
    tenant_id: TenantId,
    payment_id: PaymentId,
    lease: ExpiredLease,
    evidence: Value,
}

/// Locks the outbox row if its lease is still expired; `None` if it is not, or is locked right now.
///
/// The expiry is checked again under the lock: the worker may have recorded its result, or another
/// sweeper taken the row, since the candidates were read. A row locked right now is being recorded by
/// its worker (or handled by another sweeper), which settles it either way. Only the outbox row is
/// locked here; its payment is locked later, by the transition, the same order as the worker's claim
/// and record, so they cannot deadlock.
///
/// `in_key_window` counts from the payment's first send, against the key window minus its margin.
async fn lock_expired(
    conn: &mut PgConnection,
    key_window: KeyWindow,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Option<ExpiredLease>, StoreError> {
    let lease = sqlx::query_as!(
        ExpiredLease,
        r#"
        SELECT o.locked_by AS "locked_by!", o.locked_until AS "locked_until!",
               o.fencing_token AS "fencing_token!", o.attempts, o.traceparent, o.tracestate,
               p.status AS "status: PaymentStatus", p.first_sent_at,
               -- Never sent: no window has started, a resend is a first send.
               COALESCE(now() - p.first_sent_at < make_interval(secs => $3), true) AS "in_key_window!"
        FROM outbox o JOIN payments p USING (tenant_id, payment_id)
        WHERE o.tenant_id = $1 AND o.payment_id = $2 AND o.locked_until < now()
        FOR UPDATE OF o SKIP LOCKED
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
        key_window.resend_horizon().as_secs_f64(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(lease)
}

/// Inside the key window: the next claim resends with the same key, and the provider returns the
/// first result instead of charging again. The transition marks the payment `may_be_charged` for
/// good, so no later send goes out past the key window.
async fn resend(tx: &mut PgConnection, expired: &Expired<'_>) -> Result<TakenBack, TransitionError> {
    release(tx, expired.tenant_id, expired.payment_id).await?;
    let reason = "the worker's lease expired inside the provider's key window; resending with the same key";
    let moved = expire(tx, expired, Transition::LeaseExpiredResend, reason).await?;
    Ok(if moved { TakenBack::Released } else { TakenBack::Skipped })
}

/// Past the key window a resend could charge twice: the payment becomes `unknown` and is queued for
/// the reconciler, with its trace from the outbox row, so the reconciler's resolution joins it.
async fn hand_over(tx: &mut PgConnection, expired: &Expired<'_>) -> Result<TakenBack, TransitionError> {
    delete(tx, expired.tenant_id, expired.payment_id).await?;
    let reason = "the worker's lease expired past the provider's key window; a resend could charge twice";
    if !expire(tx, expired, Transition::LeaseExpiredUncertain, reason).await? {
        return Ok(TakenBack::Skipped);
    }
    let lease = &expired.lease;
    let trace =
        lease.traceparent.clone().map(|traceparent| TraceContext { traceparent, tracestate: lease.tracestate.clone() });
    let (tenant_id, payment_id) = (expired.tenant_id, expired.payment_id);
    let reason = "lease_expired_past_key_window";
    unknown_queue::enqueue(tx, tenant_id, payment_id, reason, expired.evidence.clone(), trace.as_ref(), None).await?;
    Ok(TakenBack::Uncertain)
}

/// The payment moved on while its worker was gone (only a webhook or a poll can do that to a
/// `processing` payment). The lease protects nothing any more; a pending payment still needs its row,
/// anything else must not have one.
async fn drop_obsolete(tx: &mut PgConnection, expired: &Expired<'_>) -> Result<TakenBack, TransitionError> {
    if expired.lease.status == PaymentStatus::Pending {
        release(tx, expired.tenant_id, expired.payment_id).await?;
    } else {
        delete(tx, expired.tenant_id, expired.payment_id).await?;
    }
    Ok(TakenBack::Obsolete)
}

/// Moves the `processing` payment by `transition`, with the lease as evidence; false if it moved
/// between the read and the update, which leaves it to the next sweep, which will see where it went.
async fn expire(
    tx: &mut PgConnection,
    expired: &Expired<'_>,
    transition: Transition,
    reason: &str,
) -> Result<bool, TransitionError> {
    let change = Change {
        tenant_id: expired.tenant_id,
        payment_id: expired.payment_id,
        from: PaymentStatus::Processing,
        transition,
        actor: expired.actor,
        reason,
        detail: Some(expired.evidence.clone()),
    };
    Ok(matches!(transitions::apply(tx, &change).await?, Recorded::Moved(_)))
}

/// Frees the row for the next claim, due now, and counts the takeover in `lease_expirations`. The
/// token goes with the lease, so the worker that held it can no longer record anything.
async fn release(conn: &mut PgConnection, tenant_id: TenantId, payment_id: PaymentId) -> Result<(), StoreError> {
    sqlx::query!(
        r#"
        UPDATE outbox
        SET locked_by = NULL, locked_until = NULL, fencing_token = NULL, available_at = now(),
            lease_expirations = lease_expirations + 1
        WHERE tenant_id = $1 AND payment_id = $2
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Wakes the workers for a row [`release`] freed, once its transaction has committed: a statement of
/// its own, outside the transaction. Inside it, under Citus, the `NOTIFY` would keep a transaction
/// that spans nodes from committing (Citus cannot prepare one that has notified), and would run on
/// the worker node that holds the row, where no worker listens. A wake-up that fails is only logged:
/// the row is already free, and the workers find it at their next poll.
async fn wake_workers(conn: &mut PgConnection, tenant_id: TenantId) {
    let woken = sqlx::query!("SELECT pg_notify('oncepay_outbox', $1)", tenant_id.to_string()).execute(conn).await;
    if let Err(error) = woken {
        tracing::warn!(error = %error, "could not wake the workers; they will find the freed row at their next poll");
    }
}

async fn delete(conn: &mut PgConnection, tenant_id: TenantId, payment_id: PaymentId) -> Result<(), StoreError> {
    sqlx::query!(
        "DELETE FROM outbox WHERE tenant_id = $1 AND payment_id = $2",
        tenant_id.as_uuid(),
        payment_id.as_uuid()
    )
    .execute(conn)
    .await?;
    Ok(())
}

fn rfc3339(at: OffsetDateTime) -> Option<String> {
    at.format(&time::format_description::well_known::Rfc3339).ok()
}
