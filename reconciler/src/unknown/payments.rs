//! `unknown` payments: the reconciler's side of the `unknown_payments` queue, claiming due payments,
//! and each way a payment leaves `unknown`.
//!
//! Invariant: a payment is `unknown` exactly while it has a row here. Whoever moves it in writes the
//! row in the same transaction (`oncepay_store::unknown_queue`). Every function here that moves it out
//! ([`settle`], [`resend`], [`exhaust`], [`mismatch`]) deletes the row in the same transaction, and
//! only after its compare-and-set won.

use std::time::Duration;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_service::telemetry::{self, TraceContext};
use oncepay_store::payments::Payment;
use oncepay_store::settlement::Asked;
use oncepay_store::transitions::{self, Change, Recorded, Settlement, TransitionError};
use oncepay_store::unknown_queue::Refusal;
use oncepay_store::{StoreError, outbox};
use serde_json::Value;
use sqlx::PgConnection;
use time::OffsetDateTime;

use oncepay_ops::dead_letters::{self, Kind};

use super::{Why, claim_in_shares};

/// A due payment, claimed for one lookup.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// Its owner.
    pub tenant_id: TenantId,
    /// The payment.
    pub payment_id: PaymentId,
    /// What it asked the provider to charge.
    pub asked: Asked,
    /// Lookups already made, inconclusively.
    pub poll_attempts: i32,
    /// How long it has been `unknown`.
    pub age: Duration,
    /// The provider's refusal of its last resend, when an earlier send may have charged: an empty
    /// lookup does not fail the payment (an earlier send may still land), and the refusal goes into
    /// the lookup's evidence.
    pub refusal: Option<Refusal>,
    /// Whether the provider still certainly remembers its downstream key (its first send is younger
    /// than the resend horizon), by the database's clock.
    pub in_key_window: bool,
    /// The trace of the span that made the payment `unknown`, if it has one. The poller's lookup and a
    /// webhook's settlement continue it ([`trace_of`]), so a payment's request, provider call and
    /// resolution are one trace, and a resend continues it in the outbox.
    pub trace: Option<TraceContext>,
}

/// Claims up to `batch_size` due payments, hiding each from other pollers for `lease`. Rows another
/// poller is claiming right now are skipped.
///
/// Each claim statement takes one tenant's payments, oldest due first, so that under Citus it runs
/// on that tenant's shard (SCALING.md). The tenants with due payments are found first, by a read
/// without locks, and share the batch ([`claim_in_shares`]).
///
/// The lease is `next_poll_at` pushed forward, not a lock held, so no transaction stays open across
/// the provider call that follows.
#[tracing::instrument(name = "unknown.claim", skip_all)]
pub async fn claim_due(
    conn: &mut PgConnection,
    batch_size: u32,
    lease: Duration,
    resend_horizon: Duration,
) -> Result<Vec<Claimed>, StoreError> {
    let waiting: Vec<TenantId> = sqlx::query_scalar!(
        r#"SELECT DISTINCT tenant_id AS "tenant_id: TenantId" FROM unknown_payments WHERE next_poll_at <= now()"#
    )
    .fetch_all(&mut *conn)
    .await?;
    claim_in_shares(conn, waiting, batch_size, (lease, resend_horizon), |conn, tenant_id, limit, (lease, horizon)| {
        Box::pin(claim_due_of(conn, tenant_id, limit, lease, horizon))
    })
    .await
}

/// [`claim_due`] for one tenant.
async fn claim_due_of(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    limit: u32,
    lease: Duration,
    resend_horizon: Duration,
) -> Result<Vec<Claimed>, StoreError> {
    let rows = sqlx::query!(
        r#"
        WITH due AS (
            SELECT tenant_id, payment_id FROM unknown_payments
            WHERE tenant_id = $4 AND next_poll_at <= now()
            ORDER BY next_poll_at
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ), claimed AS (
            UPDATE unknown_payments u
            SET next_poll_at = now() + make_interval(secs => $2)
            FROM due JOIN payments p USING (tenant_id, payment_id)
            -- Joined on the tenant too: Citus needs the join on its distribution column.
            WHERE u.tenant_id = $4 AND u.tenant_id = due.tenant_id AND u.payment_id = due.payment_id
            RETURNING u.tenant_id, u.payment_id, p.amount, p.currency, p.provider_account, u.poll_attempts,
                      u.traceparent, u.tracestate, u.since, p.first_sent_at, u.refused_code, u.refused_message
        )
        -- The ages are read here, not in RETURNING: Citus refuses now() there.
        SELECT tenant_id AS "tenant_id!: TenantId", payment_id AS "payment_id!: PaymentId",
               amount AS "amount!: Amount", currency AS "currency!: Currency",
               provider_account AS "provider_account: ProviderAccount",
               poll_attempts AS "poll_attempts!", traceparent, tracestate, refused_code, refused_message,
               extract(epoch FROM now() - since)::float8 AS "age_secs!",
               -- Never sent cannot happen for an unknown payment; if it did, no resend is safe.
               -- (No COALESCE: Citus refuses one around now().)
               (first_sent_at IS NOT NULL AND now() - first_sent_at < make_interval(secs => $3)) AS "in_key_window!"
        FROM claimed
        "#,
        i64::from(limit),
        lease.as_secs_f64(),
        resend_horizon.as_secs_f64(),
        tenant_id.as_uuid(),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| Claimed {
            tenant_id: row.tenant_id,
            payment_id: row.payment_id,
            asked: Asked {
                payment_id: row.payment_id,
                account: row.provider_account,
                amount: row.amount,
                currency: row.currency,
            },
            poll_attempts: row.poll_attempts,
            age: Duration::from_secs_f64(row.age_secs.max(0.0)),
            in_key_window: row.in_key_window,
            trace: row.traceparent.map(|traceparent| TraceContext { traceparent, tracestate: row.tracestate }),
            refusal: row.refused_code.zip(row.refused_message).map(|(code, message)| Refusal { code, message }),
        })
        .collect())
}

/// The trace an `unknown` payment's resolution continues: `None` if the payment is not queued (not
/// `unknown`) or has no trace.
pub async fn trace_of(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Option<TraceContext>, StoreError> {
    let row = sqlx::query!(
        r#"
        SELECT traceparent AS "traceparent!", tracestate FROM unknown_payments
        WHERE tenant_id = $1 AND payment_id = $2 AND traceparent IS NOT NULL
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|row| TraceContext { traceparent: row.traceparent, tracestate: row.tracestate }))
}

/// The change that takes the payment out of `unknown` by `transition`, with `evidence` in its audit
/// row.
fn change<'a>(
    tenant_id: TenantId,
    payment_id: PaymentId,
    transition: Transition,
    why: Why<'a>,
    evidence: Value,
) -> Change<'a> {
    Change {
        tenant_id,
        payment_id,
        from: PaymentStatus::Unknown,
        transition,
        actor: why.actor,
        reason: why.reason,
        detail: Some(evidence),
    }
}

/// Settles an `unknown` payment from the provider's evidence: the terminal change (ledger entry,
/// stored response, audit row) and the removal of its queue row, in the caller's transaction.
pub async fn settle(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    transition: Transition,
    settlement: &Settlement,
    why: Why<'_>,
    evidence: Value,
) -> Result<Recorded<Payment>, TransitionError> {
    let change = change(tenant_id, payment_id, transition, why, evidence);
    let recorded = transitions::settle(&mut *conn, &change, settlement).await?;
    if matches!(recorded, Recorded::Moved(_)) {
        remove(conn, tenant_id, payment_id).await?;
    }
    Ok(recorded)
}

/// The provider provably has no charge and still remembers the key: back to `pending` and into the
/// outbox, so a worker resends with the same downstream key, continuing the current span's trace.
pub async fn resend(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    why: Why<'_>,
    evidence: Value,
) -> Result<Recorded<PaymentStatus>, TransitionError> {
    let change = change(tenant_id, payment_id, Transition::ProviderHasNoCharge, why, evidence);
    let recorded = transitions::apply(&mut *conn, &change).await?;
    if matches!(recorded, Recorded::Moved(_)) {
        remove(&mut *conn, tenant_id, payment_id).await?;
        let trace = telemetry::trace_context_of(&tracing::Span::current());
        outbox::enqueue_in_trace(conn, tenant_id, payment_id, OffsetDateTime::now_utc(), trace.as_ref()).await?;
    }
    Ok(recorded)
}

/// Gives up: `unknown → dead_lettered`, and an `unresolved` dead letter carrying every piece of
/// evidence gathered (the queue row's and `evidence`, the last one).
pub async fn exhaust(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    why: Why<'_>,
    evidence: Value,
) -> Result<Recorded<PaymentStatus>, TransitionError> {
    dead_letter(conn, tenant_id, payment_id, Transition::Exhausted, Kind::Unresolved, why, evidence).await
}

/// The provider reported a charge that is not what the payment asked for: `unknown →
/// dead_lettered`, and a `conflict` dead letter carrying every piece of evidence gathered. Never a
/// success: only an operator may decide what that charge means.
pub async fn mismatch(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    why: Why<'_>,
    evidence: Value,
) -> Result<Recorded<PaymentStatus>, TransitionError> {
    dead_letter(conn, tenant_id, payment_id, Transition::ChargeMismatch, Kind::Conflict, why, evidence).await
}

async fn dead_letter(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    transition: Transition,
    kind: Kind,
    why: Why<'_>,
    evidence: Value,
) -> Result<Recorded<PaymentStatus>, TransitionError> {
    let change = change(tenant_id, payment_id, transition, why, evidence.clone());
    let recorded = transitions::apply(&mut *conn, &change).await?;
    if matches!(recorded, Recorded::Moved(_)) {
        let gathered = remove(&mut *conn, tenant_id, payment_id).await?;
        let (mut trail, attempts) = gathered.map_or_else(|| (Vec::new(), 0), |g| (g.evidence, g.poll_attempts));
        trail.push(evidence);
        let attempts = attempts.saturating_add(1);
        dead_letters::record(conn, tenant_id, payment_id, kind, why.reason, Value::Array(trail), attempts).await?;
    }
    Ok(recorded)
}

/// Records an inconclusive lookup: the evidence, one more attempt toward dead-lettering, and when to
/// look again (`None`: when already planned). False, writing nothing, when the payment is no
/// longer `unknown`.
pub async fn note_inconclusive(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    evidence: Value,
    next_poll_in: Option<Duration>,
) -> Result<bool, StoreError> {
    let counted = sqlx::query!(
        r#"
        UPDATE unknown_payments u
        SET evidence = u.evidence || jsonb_build_array($3::jsonb),
            poll_attempts = u.poll_attempts + 1,
            next_poll_at = COALESCE(planned.at, u.next_poll_at)
        -- The time is computed apart: Citus refuses now() inside a COALESCE in an UPDATE.
        FROM (SELECT now() + make_interval(secs => $4) AS at) planned
        WHERE u.tenant_id = $1 AND u.payment_id = $2
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
        evidence,
        next_poll_in.map(|wait| wait.as_secs_f64()),
    )
    .execute(conn)
    .await?;
    Ok(counted.rows_affected() == 1)
}

/// What the queue row had gathered when it was removed.
struct Gathered {
    evidence: Vec<Value>,
    poll_attempts: i32,
}

/// Deletes the payment's queue row. Callers move the payment row first: the payment row, then its
/// queue row, is the lock order the worker and the sweeper use too.
async fn remove(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Option<Gathered>, StoreError> {
    let row = sqlx::query!(
        r#"
        DELETE FROM unknown_payments WHERE tenant_id = $1 AND payment_id = $2
        RETURNING evidence, poll_attempts
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|row| Gathered {
        evidence: match row.evidence {
            Value::Array(items) => items,
            other => vec![other],
        },
        poll_attempts: row.poll_attempts,
    }))
}
