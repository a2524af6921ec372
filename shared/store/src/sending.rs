//! Sending payments, the worker's protocol on the outbox: the scan for the tenants that have due
//! rows (`sql/due_tenants.sql`); the claim from one tenant (`sql/claim.sql`): up to a batch of the
//! tenant's due rows leased to one worker under fresh fencing tokens, their payments moved to
//! `processing`, in one statement; and the fenced take and release that end a send
//! (`sql/take.sql`, for one send or many at once; `sql/release.sql`). Refunds are sent by the same
//! protocol ([`crate::refunds::sending`]).
//!
//! A result counts only while the claim's fencing token is still on the row: [`take`] and
//! [`release`] change nothing once it is gone. This module never calls the provider and never
//! decides an outcome. The tests claim with it too, to have a payment claimed as a worker claims it.
//!
//! The statements that end a send are planned each time they run (`persistent(false)`), as the
//! claim's reads of the outbox are (migration 0540). The outbox is a queue, empty one minute and a
//! backlog the next; a prepared statement's plan, kept from when the outbox was empty, read the
//! tenant's whole backlog on every call (BENCHMARKS.md, "Plans made on an empty outbox").

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::{PaymentMethod, ProviderAccount, ProviderCustomer};
use oncepay_provider::ChargeRequest;
use oncepay_service::telemetry::TraceContext;
use sqlx::PgConnection;
use sqlx::types::{Json, Uuid};
use time::OffsetDateTime;

use crate::StoreError;
use crate::settlement::Asked;

/// What to claim, and for whom.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// Whose rows: a claim takes one tenant's rows only.
    pub tenant_id: TenantId,
    /// Most rows to take.
    pub limit: u32,
    /// Written to `outbox.locked_by`.
    pub worker_id: &'a str,
    /// Written to the audit trail: `worker:<id>`.
    pub actor: &'a str,
    /// How long the lease lasts.
    pub lease: Duration,
    /// How long after a payment's first send a resend is still deduplicated by the provider.
    pub resend_horizon: Duration,
}

/// A payment this worker now holds the lease for, with what it needs to send and record it.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The owner.
    pub tenant_id: TenantId,
    /// The payment, now `processing`.
    pub payment_id: PaymentId,
    /// Must still be on the outbox row for a result to be recorded.
    pub fencing_token: i64,
    /// When the lease runs out; until then the row belongs to this worker.
    pub lease_until: OffsetDateTime,
    /// Which claim of the current send cycle this is (1 for the first).
    pub attempt: u32,
    /// Which claim of the payment's whole life this is.
    pub send_attempts: u32,
    /// Whether an earlier send may have reached the provider (its response was lost, or its worker
    /// stopped before recording one), in this send cycle or any before it.
    pub may_be_charged: bool,
    /// Whether the provider still remembers the payment's downstream key (with margin), counting
    /// from its first send.
    pub in_key_window: bool,
    /// What to charge.
    pub amount: Amount,
    /// In which currency.
    pub currency: Currency,
    /// The merchant's customer reference.
    pub customer_id: String,
    /// The merchant's metadata.
    pub metadata: BTreeMap<String, String>,
    /// What the provider is to charge, if the payment names it.
    pub payment_method: Option<PaymentMethod>,
    /// The provider's customer that method belongs to, if the payment names one.
    pub provider_customer: Option<ProviderCustomer>,
    /// The provider account it is charged to, fixed when it was accepted.
    pub provider_account: Option<ProviderAccount>,
    /// The trace of the request that created the payment.
    pub trace: Option<TraceContext>,
    /// When the api accepted the payment.
    pub accepted_at: OffsetDateTime,
}

impl Claimed {
    /// Whether sending now cannot charge twice: either nothing may have reached the provider yet, or
    /// the provider still remembers the key and will return the first result.
    pub fn send_is_safe(&self) -> bool {
        !self.may_be_charged || self.in_key_window
    }

    /// What the payment asked the provider to charge: a charge settles it only if it matches.
    pub fn asked(&self) -> Asked {
        Asked {
            payment_id: self.payment_id,
            account: self.provider_account.clone(),
            amount: self.amount,
            currency: self.currency,
        }
    }

    /// The provider request: always the same downstream key for this payment, in its account.
    pub fn charge_request(&self) -> ChargeRequest {
        let request = ChargeRequest::for_payment(
            self.tenant_id,
            self.payment_id,
            self.amount,
            self.currency,
            self.customer_id.clone(),
            &self.metadata,
        );
        ChargeRequest {
            payment_method: self.payment_method.as_ref().map(|method| method.as_str().to_owned()),
            provider_customer: self.provider_customer.clone(),
            account: self.provider_account.clone(),
            ..request
        }
    }
}

/// Leases up to `request.limit` of one tenant's due rows to this worker (lease, fencing token) and
/// moves their payments to `processing`, in one statement. The claim must commit before the
/// provider is called (the drainer runs it outside a transaction), so no transaction is open across
/// that call.
#[tracing::instrument(name = "worker.claim", skip_all, fields(tenant.id = %request.tenant_id, limit = request.limit, claimed))]
pub async fn claim(conn: &mut PgConnection, request: &ClaimRequest<'_>) -> Result<Vec<Claimed>, StoreError> {
    let rows = sqlx::query_file!(
        "sql/claim.sql",
        i64::from(request.limit),
        request.worker_id,
        request.lease.as_secs_f64(),
        request.actor,
        request.resend_horizon.as_secs_f64(),
        request.tenant_id.as_uuid(),
    )
    .fetch_all(conn)
    .await?;
    tracing::Span::current().record("claimed", rows.len());
    Ok(rows
        .into_iter()
        .map(|row| Claimed {
            tenant_id: row.tenant_id,
            payment_id: row.payment_id,
            fencing_token: row.fencing_token,
            lease_until: row.locked_until,
            attempt: row.attempts.unsigned_abs(),
            send_attempts: row.send_attempts.unsigned_abs(),
            may_be_charged: row.may_be_charged,
            in_key_window: row.in_key_window,
            amount: row.amount,
            currency: row.currency,
            customer_id: row.customer_id,
            metadata: row.metadata.0,
            payment_method: row.payment_method,
            provider_customer: row.provider_customer,
            provider_account: row.provider_account,
            trace: row.traceparent.map(|traceparent| TraceContext { traceparent, tracestate: row.tracestate }),
            accepted_at: row.accepted_at,
        })
        .collect())
}

/// The tenants with due rows that no one holds (`sql/due_tenants.sql`).
pub async fn due_tenants(conn: &mut PgConnection) -> Result<Vec<TenantId>, StoreError> {
    Ok(sqlx::query_file_scalar!("sql/due_tenants.sql").fetch_all(conn).await?)
}

/// Ends the send: deletes the row if `claimed`'s token is still on it. `false`: the lease was taken
/// over, and nothing may be recorded.
pub async fn take(conn: &mut PgConnection, claimed: &Claimed) -> Result<bool, StoreError> {
    Ok(!take_all(conn, &[claimed]).await?.is_empty())
}

/// Ends many sends at once: deletes each row whose claim's token is still on it, and returns the
/// payments whose rows it deleted. Any payment not returned lost its lease: nothing may be recorded
/// for it. One statement per tenant among them, so that each names its shard under Citus
/// (SCALING.md).
pub async fn take_all(conn: &mut PgConnection, claimed: &[&Claimed]) -> Result<HashSet<PaymentId>, StoreError> {
    let mut tenants: Vec<TenantId> = claimed.iter().map(|c| c.tenant_id).collect();
    tenants.sort_unstable();
    tenants.dedup();
    let mut taken = HashSet::with_capacity(claimed.len());
    for tenant_id in tenants {
        let ours = claimed.iter().filter(|c| c.tenant_id == tenant_id);
        let payment_ids: Vec<Uuid> = ours.clone().map(|c| c.payment_id.as_uuid()).collect();
        let tokens: Vec<i64> = ours.map(|c| c.fencing_token).collect();
        let rows = sqlx::query_file_scalar!("sql/take.sql", tenant_id.as_uuid(), &payment_ids, &tokens)
            .persistent(false)
            .fetch_all(&mut *conn)
            .await?;
        taken.extend(rows.into_iter().map(PaymentId::from_uuid));
    }
    Ok(taken)
}

/// Frees the row for a retry after `delay` if `claimed`'s token is still on it. `false`: the lease
/// was taken over, and nothing may be recorded.
pub async fn release(conn: &mut PgConnection, claimed: &Claimed, delay: Duration) -> Result<bool, StoreError> {
    let released = sqlx::query_file!(
        "sql/release.sql",
        claimed.tenant_id.as_uuid(),
        claimed.payment_id.as_uuid(),
        claimed.fencing_token,
        delay.as_secs_f64()
    )
    .persistent(false)
    .execute(conn)
    .await?;
    Ok(released.rows_affected() == 1)
}

/// Deletes the row of a payment that no longer needs sending, whatever its lease. Only for a caller
/// that already holds the row (it took or released it in the same transaction).
pub async fn discard(conn: &mut PgConnection, claimed: &Claimed) -> Result<(), StoreError> {
    sqlx::query!(
        "DELETE FROM outbox WHERE tenant_id = $1 AND payment_id = $2",
        claimed.tenant_id.as_uuid(),
        claimed.payment_id.as_uuid()
    )
    .persistent(false)
    .execute(conn)
    .await?;
    Ok(())
}
