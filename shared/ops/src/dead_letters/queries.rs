//! The dead-letter SQL for operators: reading entries and a payment's audit trail, locking an open
//! entry with its payment, and closing it.
//!
//! Operators name an entry by its payment id, which is unique across tenants, so these reads do not
//! filter by tenant. Nothing here decides whether an action is allowed: that is [`super::actions`].

use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::status::PaymentStatus;
use oncepay_store::settlement::Asked;
use sqlx::PgConnection;
use time::OffsetDateTime;
use uuid::Uuid;

use super::ResolutionKind;
use super::reports::{AuditRow, Detail, Entry, EntryList};
use crate::operator_error::OperatorError;

/// `list`: which entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// Only entries awaiting an operator.
    Open,
    /// Every entry, resolved ones too.
    All,
}

/// Lists entries, oldest first: of every tenant, or only of `tenants`.
pub async fn list(
    conn: &mut PgConnection,
    filter: Filter,
    tenants: Option<&[Uuid]>,
) -> Result<EntryList, OperatorError> {
    let entries = entries(conn, None, filter == Filter::All, tenants).await?;
    Ok(EntryList(entries))
}

/// Shows every dead letter of a payment.
pub async fn show(conn: &mut PgConnection, payment_id: PaymentId) -> Result<Detail, OperatorError> {
    let entries = entries(conn, Some(payment_id), true, None).await?;
    let Some(first) = entries.first() else {
        return Err(OperatorError::NotFound(format!("payment {payment_id} has no dead letter")));
    };
    let tenant_id = first.tenant_id;
    let audit_trail = audit_trail(conn, tenant_id, payment_id).await?;
    Ok(Detail { payment_id, tenant_id, entries, audit_trail })
}

/// Every dead letter of a payment of `tenant_id`, none for a payment automation settled, and its
/// audit trail.
pub async fn detail(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Detail, OperatorError> {
    let entries = entries(conn, Some(payment_id), true, Some(&[tenant_id.as_uuid()])).await?;
    let audit_trail = audit_trail(conn, tenant_id, payment_id).await?;
    Ok(Detail { payment_id, tenant_id, entries, audit_trail })
}

/// The tenant of payment `payment_id`, if one of `tenants` (every tenant: `None`) has it. Locks
/// nothing.
pub async fn payment_tenant(
    conn: &mut PgConnection,
    tenants: Option<&[Uuid]>,
    payment_id: PaymentId,
) -> Result<Option<TenantId>, OperatorError> {
    // The tenants are listed first, so that the payment is found by its primary key in each.
    let tenant_id = sqlx::query_scalar!(
        r#"
        SELECT tenant_id AS "tenant_id: TenantId" FROM payments
        WHERE tenant_id IN (SELECT tenant_id FROM tenants WHERE $1::uuid[] IS NULL OR tenant_id = ANY ($1))
          AND payment_id = $2
        "#,
        tenants,
        payment_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the payment")?;
    Ok(tenant_id)
}

async fn entries(
    conn: &mut PgConnection,
    payment_id: Option<PaymentId>,
    all: bool,
    tenants: Option<&[Uuid]>,
) -> Result<Vec<Entry>, OperatorError> {
    let rows = sqlx::query!(
        r#"
        SELECT d.dead_letter_id, d.payment_id AS "payment_id: PaymentId", d.tenant_id AS "tenant_id: TenantId",
               t.name AS "tenant?", d.kind, d.reason, d.attempts,
               p.status AS "payment_status: PaymentStatus", p.amount AS "amount: Amount",
               p.currency AS "currency: Currency", d.created_at,
               extract(epoch FROM COALESCE(d.resolved_at, now()) - d.created_at)::bigint AS "age_secs!",
               d.resolved_at, d.resolved_by, d.resolution, d.resolution_note, d.evidence
        FROM dead_letters d
        JOIN payments p USING (tenant_id, payment_id)
        LEFT JOIN tenants t USING (tenant_id)
        WHERE ($1::uuid IS NULL OR d.payment_id = $1) AND ($2 OR d.resolved_at IS NULL)
          AND ($3::uuid[] IS NULL OR d.tenant_id = ANY ($3))
        ORDER BY d.created_at, d.dead_letter_id
        "#,
        payment_id.map(|p| p.as_uuid()),
        all,
        tenants,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the dead letters")?;
    let mut entries = Vec::with_capacity(rows.len());
    for r in rows {
        let unreadable = || format!("cannot read dead letter {}", r.dead_letter_id);
        let kind = r.kind.parse().with_context(unreadable)?;
        let resolution = r.resolution.as_deref().map(str::parse).transpose().with_context(unreadable)?;
        entries.push(Entry {
            dead_letter_id: r.dead_letter_id,
            payment_id: r.payment_id,
            tenant_id: r.tenant_id,
            tenant: r.tenant,
            kind,
            reason: r.reason,
            attempts: r.attempts,
            payment_status: r.payment_status,
            amount: r.amount,
            currency: r.currency,
            created_at: r.created_at,
            age_secs: r.age_secs,
            resolved_at: r.resolved_at,
            resolved_by: r.resolved_by,
            resolution,
            resolution_note: r.resolution_note,
            evidence: r.evidence,
        });
    }
    Ok(entries)
}

async fn audit_trail(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Vec<AuditRow>, OperatorError> {
    let trail = sqlx::query_as!(
        AuditRow,
        r#"
        SELECT from_status AS "from_status: PaymentStatus", to_status AS "to_status: PaymentStatus",
               actor, reason, detail, created_at
        FROM payment_events WHERE tenant_id = $1 AND payment_id = $2
        ORDER BY seq
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_all(conn)
    .await
    .context("cannot read the payment's audit trail")?;
    Ok(trail)
}

fn no_open_entry(payment_id: PaymentId) -> OperatorError {
    OperatorError::NotFound(format!("payment {payment_id} has no open dead letter"))
}

/// The tenant of a payment with an open entry, and what the payment asked for. Locks nothing.
pub(crate) async fn open_payment(
    conn: &mut PgConnection,
    payment_id: PaymentId,
) -> Result<(TenantId, Asked), OperatorError> {
    let payment = sqlx::query!(
        r#"
        SELECT d.tenant_id AS "tenant_id: TenantId", p.amount AS "amount: Amount", p.currency AS "currency: Currency",
               p.provider_account AS "provider_account: ProviderAccount"
        FROM dead_letters d JOIN payments p USING (tenant_id, payment_id)
        WHERE d.payment_id = $1 AND d.resolved_at IS NULL
        "#,
        payment_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the dead letter")?
    .ok_or_else(|| no_open_entry(payment_id))?;
    let asked =
        Asked { payment_id, account: payment.provider_account, amount: payment.amount, currency: payment.currency };
    Ok((payment.tenant_id, asked))
}

/// The tenant of the payment's open entry, read without a lock, for the locking read that follows to
/// name: Citus locks rows only in a statement of one tenant's shards.
async fn tenant_of_open_entry(conn: &mut PgConnection, payment_id: PaymentId) -> Result<TenantId, OperatorError> {
    sqlx::query_scalar!(
        r#"SELECT tenant_id AS "tenant_id: TenantId" FROM dead_letters WHERE payment_id = $1 AND resolved_at IS NULL"#,
        payment_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the dead letter")?
    .ok_or_else(|| no_open_entry(payment_id))
}

/// The open entry and its payment, locked for the rest of the transaction.
pub(super) struct Locked {
    pub(super) dead_letter_id: i64,
    pub(super) tenant_id: TenantId,
    pub(super) status: PaymentStatus,
    pub(super) asked: Asked,
    /// Whether the payment was first sent less than the resend horizon ago (or never sent).
    pub(super) in_key_window: bool,
    pub(super) first_sent_at: Option<OffsetDateTime>,
}

/// Locks the payment's open entry and the payment itself, until the caller's transaction ends.
pub(super) async fn lock_open(
    conn: &mut PgConnection,
    payment_id: PaymentId,
    resend_horizon: Duration,
) -> Result<Locked, OperatorError> {
    let tenant_id = tenant_of_open_entry(conn, payment_id).await?;
    // The entry may have been resolved since it was read: then this finds nothing.
    let row = sqlx::query!(
        r#"
        SELECT d.dead_letter_id, d.tenant_id AS "tenant_id: TenantId", p.status AS "status: PaymentStatus",
               p.first_sent_at,
               p.amount AS "amount: Amount", p.currency AS "currency: Currency",
               p.provider_account AS "provider_account: ProviderAccount",
               COALESCE(now() - p.first_sent_at < make_interval(secs => $2), true) AS "in_key_window!"
        FROM dead_letters d JOIN payments p ON p.tenant_id = $3 AND p.payment_id = d.payment_id
        WHERE d.tenant_id = $3 AND d.payment_id = $1 AND d.resolved_at IS NULL
        FOR UPDATE OF d, p
        "#,
        payment_id.as_uuid(),
        resend_horizon.as_secs_f64(),
        tenant_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the dead letter")?;
    let row = row.ok_or_else(|| no_open_entry(payment_id))?;
    Ok(Locked {
        dead_letter_id: row.dead_letter_id,
        tenant_id: row.tenant_id,
        status: row.status,
        asked: Asked { payment_id, account: row.provider_account, amount: row.amount, currency: row.currency },
        in_key_window: row.in_key_window,
        first_sent_at: row.first_sent_at,
    })
}

/// A succeeded charge that a signed webhook or a lookup recorded for the locked payment, if any: in
/// the evidence of any of its dead letters, the closed ones too. Only a charge held by the payment's
/// provider account counts (a charge's `account` is left out for oncepay's own): one of another
/// account is another merchant's, whatever it names, and may have been recorded by a version that
/// did not tell them apart.
pub(super) async fn succeeded_charge_on_record(
    conn: &mut PgConnection,
    locked: &Locked,
) -> Result<Option<String>, OperatorError> {
    let charge_id = sqlx::query_scalar!(
        r#"
        (SELECT charge->>'id' AS "charge_id!" FROM webhook_events
         WHERE tenant_id = $1 AND payment_id = $2 AND charge->>'status' = 'succeeded'
           AND charge->>'account' IS NOT DISTINCT FROM $3)
        UNION ALL
        (SELECT item->'charge'->>'id' FROM dead_letters d, jsonb_array_elements(d.evidence) AS item
         WHERE d.tenant_id = $1 AND d.payment_id = $2 AND item->'charge'->>'status' = 'succeeded'
           AND item->'charge'->>'account' IS NOT DISTINCT FROM $3)
        LIMIT 1
        "#,
        locked.tenant_id.as_uuid(),
        locked.asked.payment_id.as_uuid(),
        locked.asked.account.as_ref().map(ProviderAccount::as_str),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the evidence")?;
    Ok(charge_id)
}

/// Clears the locked payment's `may_be_charged`, so that the worker sends it again.
pub(super) async fn clear_may_be_charged(conn: &mut PgConnection, locked: &Locked) -> Result<(), OperatorError> {
    sqlx::query!(
        "UPDATE payments SET may_be_charged = false WHERE tenant_id = $1 AND payment_id = $2",
        locked.tenant_id.as_uuid(),
        locked.asked.payment_id.as_uuid(),
    )
    .execute(conn)
    .await
    .context("cannot record the operator's word")?;
    Ok(())
}

/// Closes the locked entry: who closed it (`operator:<name>`), how, and why.
pub(super) async fn close(
    conn: &mut PgConnection,
    locked: &Locked,
    resolved_by: &str,
    resolution: ResolutionKind,
    note: &str,
) -> Result<(), OperatorError> {
    sqlx::query!(
        r#"
        UPDATE dead_letters
        SET resolved_at = now(), resolved_by = $3, resolution = $4, resolution_note = $5
        WHERE tenant_id = $1 AND dead_letter_id = $2 AND resolved_at IS NULL
        "#,
        locked.tenant_id.as_uuid(),
        locked.dead_letter_id,
        resolved_by,
        resolution.as_str(),
        note,
    )
    .execute(conn)
    .await
    .context("cannot close the dead letter")?;
    Ok(())
}

/// A payment with an open entry, as an operator saw it: enough to tell later whether anything
/// happened to it since.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Snapshot {
    /// Its tenant.
    pub tenant_id: TenantId,
    /// Its status.
    pub status: PaymentStatus,
    /// How many rows its history has.
    pub event_count: i32,
    /// Its open entry.
    pub dead_letter_id: i64,
    /// How many pieces of evidence the entry holds.
    pub evidence_count: i32,
}

/// The payment's open entry and the payment, locked until the caller's transaction ends.
pub async fn snapshot(conn: &mut PgConnection, payment_id: PaymentId) -> Result<Snapshot, OperatorError> {
    let tenant_id = tenant_of_open_entry(conn, payment_id).await?;
    let row = sqlx::query_as!(
        Snapshot,
        r#"
        SELECT d.tenant_id AS "tenant_id: TenantId", p.status AS "status: PaymentStatus", p.event_count,
               d.dead_letter_id, jsonb_array_length(d.evidence) AS "evidence_count!"
        FROM dead_letters d JOIN payments p ON p.tenant_id = $2 AND p.payment_id = d.payment_id
        WHERE d.tenant_id = $2 AND d.payment_id = $1 AND d.resolved_at IS NULL
        FOR UPDATE OF d, p
        "#,
        payment_id.as_uuid(),
        tenant_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the dead letter")?;
    row.ok_or_else(|| no_open_entry(payment_id))
}
