//! Sending refunds: the worker's claim of due refunds (lease and fencing token, as for payments),
//! the fenced release of a claim when the send has an outcome, and the sweeper's takeover of a lease
//! whose worker stopped.
//!
//! A claim commits before the provider is called; a result is recorded only while the claim's
//! fencing token is still on the refund's outbox row, so a worker paused past its lease can no
//! longer write anything. A lease taken back inside the provider's key window sends the refund
//! again with the same key; past it the refund becomes `unknown`, for the reconciler.
//!
//! The release is planned each time it runs (`persistent(false)`), as the end of a payment's send
//! is ([`crate::sending`]): a plan kept from when the refund outbox was empty read all of it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use sqlx::types::Json;
use sqlx::{Connection, PgConnection};
use time::OffsetDateTime;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::refund_status::{RefundStatus, RefundTransition};
use oncepay_provider::{KeyWindow, RefundRequest};
use oncepay_service::telemetry::TraceContext;

use super::REFUND_CHANNEL;
use super::settling::{self, AskedRefund, RefundChange};
use crate::StoreError;
use crate::leases::{SweepCounts, TakenBack};
use crate::transitions::{Recorded, TransitionError};

/// A refund this worker now holds the lease for, with what it needs to send and record it.
#[derive(Debug, Clone)]
pub struct ClaimedRefund {
    /// The owner.
    pub tenant_id: TenantId,
    /// The refund, now `processing`.
    pub refund_id: RefundId,
    /// The payment it refunds.
    pub payment_id: PaymentId,
    /// Must still be on the outbox row for a result to be recorded.
    pub fencing_token: i64,
    /// Which claim of the current send cycle this is (1 for the first).
    pub attempt: u32,
    /// Whether an earlier send may have reached the provider.
    pub may_have_moved: bool,
    /// Whether the provider still remembers the refund's downstream key, counting from its first
    /// send.
    pub in_key_window: bool,
    /// How much to give back.
    pub amount: Amount,
    /// In which currency.
    pub currency: Currency,
    /// Why, in the provider's words, if the merchant said.
    pub reason: Option<String>,
    /// The merchant's metadata.
    pub metadata: BTreeMap<String, String>,
    /// The payment's charge at the provider.
    pub charge_id: String,
    /// The account that holds the charge.
    pub account: Option<ProviderAccount>,
    /// The trace of the request that asked for the refund.
    pub trace: Option<TraceContext>,
    /// When the api accepted the refund.
    pub accepted_at: OffsetDateTime,
}

impl ClaimedRefund {
    /// Whether sending now cannot refund twice: nothing may have reached the provider yet, or the
    /// provider still remembers the key and will return the first result.
    pub fn send_is_safe(&self) -> bool {
        !self.may_have_moved || self.in_key_window
    }

    /// What the refund asked the provider for: a refund settles it only if it matches.
    pub fn asked(&self) -> AskedRefund {
        AskedRefund {
            tenant_id: self.tenant_id,
            refund_id: self.refund_id,
            charge_id: self.charge_id.clone(),
            account: self.account.clone(),
            amount: self.amount,
            currency: self.currency,
        }
    }

    /// The provider request: always the same downstream key for this refund, in the charge's
    /// account.
    pub fn refund_request(&self) -> RefundRequest {
        RefundRequest {
            account: self.account.clone(),
            ..RefundRequest::for_refund(
                self.tenant_id,
                self.payment_id,
                self.refund_id,
                self.charge_id.clone(),
                self.amount,
                self.currency,
                self.reason.clone(),
                &self.metadata,
            )
        }
    }
}

/// Leases up to `limit` of one tenant's due refunds to `worker_id` and moves them to `processing`,
/// in one call (`claim_refunds`, migration 0340) that must commit before the provider is called.
#[tracing::instrument(name = "worker.claim_refunds", skip_all, fields(tenant.id = %tenant_id, claimed))]
pub async fn claim(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    limit: u32,
    worker_id: &str,
    lease: Duration,
    key_window: KeyWindow,
) -> Result<Vec<ClaimedRefund>, StoreError> {
    let actor = format!("worker:{worker_id}");
    let rows = sqlx::query!(
        r#"
        SELECT tenant_id AS "tenant_id!: TenantId", refund_id AS "refund_id!: RefundId",
               payment_id AS "payment_id!: PaymentId", fencing_token AS "fencing_token!", attempts AS "attempts!",
               may_have_moved AS "may_have_moved!", in_key_window AS "in_key_window!",
               amount AS "amount!: Amount", currency AS "currency!: Currency", reason,
               metadata AS "metadata!: Json<BTreeMap<String, String>>", charge_id AS "charge_id!",
               account AS "account: ProviderAccount", traceparent, tracestate,
               accepted_at AS "accepted_at!"
        FROM claim_refunds($1, $2, $3, $4, $5, $6)
        "#,
        tenant_id.as_uuid(),
        i64::from(limit),
        worker_id,
        lease.as_secs_f64(),
        actor,
        key_window.resend_horizon().as_secs_f64(),
    )
    .fetch_all(&mut *conn)
    .await?;
    tracing::Span::current().record("claimed", rows.len());
    // The claim moved the refunds to `processing`: their long polls learn it at commit.
    let claimed: Vec<uuid::Uuid> = rows.iter().map(|row| row.refund_id.as_uuid()).collect();
    if !claimed.is_empty() {
        sqlx::query!("SELECT pg_notify($1, id::text) FROM unnest($2::uuid[]) AS id", REFUND_CHANNEL, &claimed)
            .execute(conn)
            .await?;
    }
    Ok(rows
        .into_iter()
        .map(|row| ClaimedRefund {
            tenant_id: row.tenant_id,
            refund_id: row.refund_id,
            payment_id: row.payment_id,
            fencing_token: row.fencing_token,
            attempt: row.attempts.unsigned_abs(),
            may_have_moved: row.may_have_moved,
            in_key_window: row.in_key_window,
            amount: row.amount,
            currency: row.currency,
            reason: row.reason,
            metadata: row.metadata.0,
            charge_id: row.charge_id,
            account: row.account,
            trace: row.traceparent.map(|traceparent| TraceContext { traceparent, tracestate: row.tracestate }),
            accepted_at: row.accepted_at,
        })
        .collect())
}

/// The tenants that have refunds due now, oldest first.
pub async fn tenants_due(conn: &mut PgConnection, limit: u32) -> Result<Vec<TenantId>, StoreError> {
    Ok(sqlx::query_scalar!(
        r#"
        SELECT tenant_id AS "tenant_id: TenantId"
        FROM refund_outbox
        WHERE locked_until IS NULL AND available_at <= now()
        GROUP BY tenant_id
        ORDER BY min(available_at)
        LIMIT $1
        "#,
        i64::from(limit),
    )
    .fetch_all(conn)
    .await?)
}

/// What ending a claim did to the refund's outbox row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The send is over: the row is gone.
    Done,
    /// The refund will be sent again at this instant: the row stays, unleased.
    RetryAt(OffsetDateTime),
}

/// Ends `claimed`'s lease: deletes the outbox row, or unleases it for a later retry. Returns false,
/// writing nothing, when the fencing token is no longer on the row (the sweeper took the lease
/// back): the caller must then record nothing.
pub async fn release(conn: &mut PgConnection, claimed: &ClaimedRefund, release: Release) -> Result<bool, StoreError> {
    let rows = match release {
        Release::Done => sqlx::query!(
            "DELETE FROM refund_outbox WHERE tenant_id = $1 AND refund_id = $2 AND fencing_token = $3",
            claimed.tenant_id.as_uuid(),
            claimed.refund_id.as_uuid(),
            claimed.fencing_token,
        )
        .persistent(false)
        .execute(conn)
        .await?
        .rows_affected(),
        Release::RetryAt(at) => sqlx::query!(
            r#"
            UPDATE refund_outbox SET locked_by = NULL, locked_until = NULL, available_at = $4
            WHERE tenant_id = $1 AND refund_id = $2 AND fencing_token = $3
            "#,
            claimed.tenant_id.as_uuid(),
            claimed.refund_id.as_uuid(),
            claimed.fencing_token,
            at,
        )
        .persistent(false)
        .execute(conn)
        .await?
        .rows_affected(),
    };
    Ok(rows == 1)
}

/// Takes back up to `batch_size` expired refund leases, oldest first, each in its own transaction.
#[tracing::instrument(name = "store.sweep_refund_leases", skip_all)]
pub async fn sweep(
    conn: &mut PgConnection,
    actor: &str,
    key_window: KeyWindow,
    batch_size: u32,
) -> Result<SweepCounts, TransitionError> {
    let expired = sqlx::query!(
        r#"
        SELECT tenant_id AS "tenant_id: TenantId", refund_id AS "refund_id: RefundId"
        FROM refund_outbox
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
    for lease in expired {
        counts.count(take_back(conn, actor, key_window, lease.tenant_id, lease.refund_id).await?);
    }
    Ok(counts)
}

/// Takes back the lease of one refund, in a transaction of its own: drops its outbox row and moves
/// a `processing` refund on. Skipped if the lease is no longer expired, or is locked right now.
async fn take_back(
    conn: &mut PgConnection,
    actor: &str,
    key_window: KeyWindow,
    tenant_id: TenantId,
    refund_id: RefundId,
) -> Result<TakenBack, TransitionError> {
    let mut tx = conn.begin().await.map_err(StoreError::from)?;
    // Lock the row and read it again: a worker may have finished, or another sweeper taken it.
    let row = sqlx::query!(
        r#"
        SELECT r.status AS "status: RefundStatus", o.fencing_token,
               r.first_sent_at > now() - make_interval(secs => $3) AS "in_key_window!"
        FROM refund_outbox o JOIN refunds r USING (tenant_id, refund_id)
        WHERE o.tenant_id = $1 AND o.refund_id = $2 AND o.locked_until < now()
        FOR UPDATE OF o SKIP LOCKED
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
        key_window.resend_horizon().as_secs_f64(),
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    let Some(row) = row else { return Ok(TakenBack::Skipped) };
    sqlx::query!(
        "DELETE FROM refund_outbox WHERE tenant_id = $1 AND refund_id = $2",
        tenant_id.as_uuid(),
        refund_id.as_uuid()
    )
    .execute(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    let taken = if row.status == RefundStatus::Processing {
        let (transition, reason) = expiry(row.in_key_window);
        let detail = Some(json!({"fencing_token": row.fencing_token}));
        let from = RefundStatus::Processing;
        let change = RefundChange { tenant_id, refund_id, from, transition, actor, reason, detail };
        match settling::apply(&mut tx, &change, None, OffsetDateTime::now_utc()).await? {
            Recorded::Moved(RefundStatus::Pending) => TakenBack::Released,
            Recorded::Moved(_) => TakenBack::Uncertain,
            Recorded::LostRace => TakenBack::Obsolete,
        }
    } else {
        TakenBack::Obsolete
    };
    tx.commit().await.map_err(StoreError::from)?;
    Ok(taken)
}

/// How a `processing` refund's expired lease is taken back, and why: to `pending` inside the key
/// window, where a resend with the same key is safe; to `unknown` past it.
const fn expiry(in_key_window: bool) -> (RefundTransition, &'static str) {
    if in_key_window {
        (
            RefundTransition::LeaseExpiredResend,
            "the worker's lease expired inside the key window: resend with the same key",
        )
    } else {
        (
            RefundTransition::LeaseExpiredUncertain,
            "the worker's lease expired past the key window: the provider may have refunded",
        )
    }
}
