//! `unknown` refunds: claiming those due for a lookup, counting an inconclusive lookup with its
//! evidence, and each way a refund leaves `unknown`.
//!
//! A refund is due while it is `unknown` and its `next_lookup_at` has passed; it becomes due at once
//! when it becomes `unknown` (`settling::apply`). Every function here that moves a refund out of
//! `unknown` is a compare-and-set from `unknown` through `oncepay_store::refunds::settling`: when it
//! loses, someone else (a webhook, an operator) moved the refund first, and nothing was written.

use std::time::Duration;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::refund_status::{RefundStatus, RefundTransition};
use oncepay_service::telemetry::TraceContext;
use oncepay_store::StoreError;
use oncepay_store::refunds::Refund;
use oncepay_store::refunds::settling::{self, AskedRefund, RefundChange, RefundSettlement};
use oncepay_store::transitions::{Recorded, TransitionError};
use serde_json::Value;
use sqlx::PgConnection;
use time::OffsetDateTime;

use super::{Why, claim_in_shares};

/// A due refund, claimed for one lookup.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The payment it gives money back from.
    pub payment_id: PaymentId,
    /// What it asked the provider for: its owner and id, the charge, the account and the money.
    pub asked: AskedRefund,
    /// Lookups already made, inconclusively.
    pub lookups: i32,
    /// How long it has been `unknown`.
    pub age: Duration,
    /// Whether the provider still certainly remembers its downstream key (its first send is younger
    /// than the resend horizon), by the database's clock.
    pub in_key_window: bool,
    /// The trace of the request that asked for it, which its lookup continues.
    pub trace: Option<TraceContext>,
}

impl Claimed {
    /// The refund's owner.
    pub const fn tenant_id(&self) -> TenantId {
        self.asked.tenant_id
    }

    /// The refund.
    pub const fn refund_id(&self) -> RefundId {
        self.asked.refund_id
    }
}

/// Claims up to `batch_size` due refunds, hiding each from other pollers for `lease`; rows another
/// poller is claiming right now are skipped. As for payments ([`super::payments::claim_due`]), each
/// claim statement takes one tenant's refunds, and the tenants with due refunds share the batch.
///
/// The lease is `next_lookup_at` pushed forward, not a lock held, so no transaction stays open
/// across the provider call that follows.
#[tracing::instrument(name = "unknown_refunds.claim", skip_all)]
pub async fn claim_due(
    conn: &mut PgConnection,
    batch_size: u32,
    lease: Duration,
    resend_horizon: Duration,
) -> Result<Vec<Claimed>, StoreError> {
    let waiting: Vec<TenantId> = sqlx::query_scalar!(
        r#"
        SELECT DISTINCT tenant_id AS "tenant_id: TenantId" FROM refunds
        WHERE status = 'unknown' AND next_lookup_at <= now()
        "#
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
            SELECT tenant_id, refund_id FROM refunds
            WHERE tenant_id = $4 AND status = 'unknown' AND next_lookup_at <= now()
            ORDER BY next_lookup_at
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ), claimed AS (
            UPDATE refunds r
            SET next_lookup_at = now() + make_interval(secs => $2)
            FROM due
            -- Joined on the tenant too: Citus needs the join on its distribution column.
            WHERE r.tenant_id = $4 AND r.tenant_id = due.tenant_id AND r.refund_id = due.refund_id
              AND r.status = 'unknown'
            RETURNING r.tenant_id, r.refund_id, r.payment_id, r.amount, r.currency, r.lookups, r.updated_at,
                      r.first_sent_at, r.traceparent, r.tracestate
        )
        -- The ages are read here, not in RETURNING: Citus refuses now() there. A refund's
        -- `updated_at` is when it became `unknown`: only a status change moves it.
        SELECT c.tenant_id AS "tenant_id!: TenantId", c.refund_id AS "refund_id!: RefundId",
               c.payment_id AS "payment_id!: PaymentId", c.amount AS "amount!: Amount",
               c.currency AS "currency!: Currency", c.lookups AS "lookups!", c.traceparent, c.tracestate,
               -- A refunded payment has succeeded, so it has its charge (`succeeded_has_charge`).
               p.provider_charge_id AS "charge_id!", p.provider_account AS "account: ProviderAccount",
               extract(epoch FROM now() - c.updated_at)::float8 AS "age_secs!",
               -- Never sent cannot happen for an unknown refund; if it did, no resend is safe.
               (c.first_sent_at IS NOT NULL AND now() - c.first_sent_at < make_interval(secs => $3)) AS "in_key_window!"
        FROM claimed c
        JOIN payments p ON p.tenant_id = $4 AND p.tenant_id = c.tenant_id AND p.payment_id = c.payment_id
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
            payment_id: row.payment_id,
            asked: AskedRefund {
                tenant_id: row.tenant_id,
                refund_id: row.refund_id,
                charge_id: row.charge_id,
                account: row.account,
                amount: row.amount,
                currency: row.currency,
            },
            lookups: row.lookups,
            age: Duration::from_secs_f64(row.age_secs.max(0.0)),
            in_key_window: row.in_key_window,
            trace: row.traceparent.map(|traceparent| TraceContext { traceparent, tracestate: row.tracestate }),
        })
        .collect())
}

/// Counts an inconclusive lookup of an `unknown` refund, keeps its `evidence`, and plans the next
/// lookup `next_lookup_in` from now. False, writing nothing, when the refund is no longer `unknown`.
pub async fn note_inconclusive(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    evidence: Value,
    next_lookup_in: Duration,
) -> Result<bool, StoreError> {
    let counted = sqlx::query!(
        r#"
        UPDATE refunds
        SET lookups = lookups + 1, next_lookup_at = now() + make_interval(secs => $3),
            lookup_evidence = lookup_evidence || jsonb_build_array($4::jsonb)
        WHERE tenant_id = $1 AND refund_id = $2 AND status = 'unknown'
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
        next_lookup_in.as_secs_f64(),
        evidence,
    )
    .execute(conn)
    .await?;
    Ok(counted.rows_affected() == 1)
}

/// `unknown → dead_lettered` by `transition`, with `evidence` in the audit row and the evidence of
/// the refund's inconclusive lookups since it became `unknown` as its `earlier_lookups`.
async fn dead_letter(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    transition: RefundTransition,
    why: Why<'_>,
    mut evidence: Value,
) -> Result<Recorded<RefundStatus>, TransitionError> {
    let earlier = sqlx::query_scalar!(
        "SELECT lookup_evidence FROM refunds WHERE tenant_id = $1 AND refund_id = $2 AND status = 'unknown'",
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    if let (Some(fields), Some(earlier)) = (evidence.as_object_mut(), earlier)
        && earlier.as_array().is_some_and(|lookups| !lookups.is_empty())
    {
        fields.insert("earlier_lookups".to_owned(), earlier);
    }
    let change = change(tenant_id, refund_id, transition, why, evidence);
    settling::apply(conn, &change, None, OffsetDateTime::now_utc()).await
}

/// The change that takes a refund out of `unknown` by `transition`, with `evidence` in its audit row.
fn change<'a>(
    tenant_id: TenantId,
    refund_id: RefundId,
    transition: RefundTransition,
    why: Why<'a>,
    evidence: Value,
) -> RefundChange<'a> {
    RefundChange {
        tenant_id,
        refund_id,
        from: RefundStatus::Unknown,
        transition,
        actor: why.actor,
        reason: why.reason,
        detail: Some(evidence),
    }
}

/// The transition a settlement takes a refund by: [`RefundTransition::Refunded`] when the money went back.
pub const fn transition_of(settlement: &RefundSettlement) -> RefundTransition {
    match settlement {
        RefundSettlement::Succeeded { .. } => RefundTransition::Refunded,
        RefundSettlement::Failed { .. } => RefundTransition::Refused,
    }
}

/// Settles an `unknown` refund: the terminal change with its money, ledger entry, stored response
/// and audit row, in the caller's transaction.
pub async fn settle(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    settlement: &RefundSettlement,
    why: Why<'_>,
    evidence: Value,
) -> Result<Recorded<Refund>, TransitionError> {
    let change = change(tenant_id, refund_id, transition_of(settlement), why, evidence);
    settling::settle(conn, &change, settlement).await
}

/// The provider provably made no refund under the key and still remembers it: back to `pending`
/// and into the refund outbox, so a worker sends it again with the same downstream key.
pub async fn resend(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    why: Why<'_>,
    evidence: Value,
) -> Result<Recorded<RefundStatus>, TransitionError> {
    let change = change(tenant_id, refund_id, RefundTransition::ProviderHasNoRefund, why, evidence);
    settling::apply(conn, &change, None, OffsetDateTime::now_utc()).await
}

/// Gives up: `unknown → dead_lettered`, with the last evidence and every earlier lookup's in the
/// audit row, for an operator.
pub async fn exhaust(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    why: Why<'_>,
    evidence: Value,
) -> Result<Recorded<RefundStatus>, TransitionError> {
    dead_letter(conn, tenant_id, refund_id, RefundTransition::Exhausted, why, evidence).await
}

/// The provider reported a refund under this refund's key that is not what it asked for:
/// `unknown → dead_lettered`, with the provider's refunds and every earlier lookup's evidence in the
/// audit row. Never a settlement: only an operator may decide what such a refund means.
pub async fn mismatch(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    why: Why<'_>,
    evidence: Value,
) -> Result<Recorded<RefundStatus>, TransitionError> {
    dead_letter(conn, tenant_id, refund_id, RefundTransition::RefundMismatch, why, evidence).await
}
