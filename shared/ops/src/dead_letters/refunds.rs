//! Refunds that wait for an operator, and what an operator may do with them. This module owns the
//! rules and the refusals, as [`super::actions`] does for payments. Two kinds wait:
//!
//! - `unresolved`: refunds automation gave up on (`dead_lettered`). Such a refund has no dead-letter
//!   row: its status is the entry, and its history (`refund_events`) holds the evidence. An operator
//!   sends it again, or settles it as succeeded or failed.
//! - `conflict`: a final refund that a provider's report contradicts (failed after it succeeded,
//!   succeeded after it failed). The refund keeps its final status, so it needs a row: an open
//!   `refund_dead_letters` entry, with every contradicting report as evidence
//!   ([`record_conflict`]). An operator puts the money right at the provider and acknowledges it
//!   ([`acknowledge`]).
//!
//! Each action runs in one transaction that locks the refund and checks it again, and moves it
//! through `oncepay_store::refunds::settling`, so that its history, its payment's money and its
//! ledger entry stay right. No transaction is open while the provider is asked about a refund.

use std::io::{self, Write};
use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency, format_amount};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::refund_status::{RefundStatus, RefundTransition};
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::{PaymentProvider, Refund as ProviderRefund, RefundLookup, RefundState};
use oncepay_store::refunds::settling::{self, AskedRefund, Finding, RefundChange, RefundSettlement};
use oncepay_store::transitions::Recorded;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::{Acquire, PgConnection};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use uuid::Uuid;

use super::Kind;
use super::actions::{Operator, require_reason};
use crate::operator_error::OperatorError;
use crate::render::{self, Report, Table};

/// The most dead-lettered refunds a list shows.
const LIST_ROWS: i64 = 500;

/// A refund that waits for an operator, as listed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadRefund {
    /// Why it waits: `unresolved` (automation gave up on it: `dead_lettered`) or `conflict` (a
    /// provider's report contradicts it, final as it is).
    pub kind: Kind,
    /// The refund.
    pub refund_id: RefundId,
    /// The payment it gives money back from.
    pub payment_id: PaymentId,
    /// Their tenant.
    pub tenant_id: TenantId,
    /// The tenant's name.
    pub tenant: Option<String>,
    /// How much it gives back.
    pub amount: Amount,
    /// In the payment's currency.
    pub currency: Currency,
    /// Its status: `dead_lettered`, or the final status a conflict contradicts.
    pub refund_status: RefundStatus,
    /// Who asked for it: `api` or `operator:<name>`.
    pub requested_by: String,
    /// The provider's refund, if one was named.
    pub provider_refund_id: Option<String>,
    /// Why it waits.
    pub reason: String,
    /// What was gathered: the last lookup of a dead-lettered refund; every contradicting report of a
    /// conflict.
    pub evidence: Option<Value>,
    /// How many times a worker sent it.
    pub send_attempts: i32,
    /// When it was first sent.
    #[serde(with = "time::serde::rfc3339::option")]
    pub first_sent_at: Option<OffsetDateTime>,
    /// Since when it waits: when it was dead-lettered, or when the conflict was opened.
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
}

/// `refunds dead-letters`: the refunds that wait for an operator, oldest first.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeadRefundList(pub Vec<DeadRefund>);

impl Report for DeadRefundList {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut table = Table::new(&[
            "REFUND",
            "PAYMENT",
            "TENANT",
            "KIND",
            "STATUS",
            "AMOUNT",
            "SENDS",
            "SINCE",
            "REQUESTED BY",
            "WHY",
        ]);
        for r in &self.0 {
            table.row(vec![
                r.refund_id.to_string(),
                r.payment_id.to_string(),
                r.tenant.clone().unwrap_or_else(|| r.tenant_id.to_string()),
                r.kind.as_str().to_owned(),
                r.refund_status.as_str().to_owned(),
                format_amount(r.amount.minor_units(), r.currency.as_str()),
                r.send_attempts.to_string(),
                render::timestamp(r.since),
                r.requested_by.clone(),
                r.reason.clone(),
            ]);
        }
        table.write(out, "no refund waits for an operator")
    }

    fn json(&self) -> Value {
        render::to_json(&self.0)
    }
}

/// The refunds that wait for an operator, of every tenant or only of `tenants`, and only of
/// `payment_id` when given: the dead-lettered ones and the open conflicts, oldest first, at most
/// [`LIST_ROWS`].
pub async fn list(
    conn: &mut PgConnection,
    tenants: Option<&[Uuid]>,
    payment_id: Option<PaymentId>,
) -> Result<Vec<DeadRefund>, OperatorError> {
    let rows = sqlx::query!(
        r#"
        SELECT kind AS "kind!", refund_id AS "refund_id!: RefundId", payment_id AS "payment_id!: PaymentId",
               tenant_id AS "tenant_id!: TenantId", tenant, amount AS "amount!: Amount",
               currency AS "currency!: Currency", status AS "status!: RefundStatus", requested_by AS "requested_by!",
               provider_refund_id, reason AS "reason!", evidence, send_attempts AS "send_attempts!",
               first_sent_at, since AS "since!"
        FROM (
            SELECT 'unresolved' AS kind, r.refund_id, r.payment_id, r.tenant_id, t.name AS tenant, r.amount,
                   r.currency, r.status, r.requested_by, r.provider_refund_id,
                   COALESCE(e.reason, 'dead-lettered') AS reason, e.detail AS evidence, r.send_attempts,
                   r.first_sent_at, r.updated_at AS since
            FROM refunds r
            LEFT JOIN tenants t ON t.tenant_id = r.tenant_id
            LEFT JOIN LATERAL (
                SELECT reason, detail FROM refund_events
                WHERE tenant_id = r.tenant_id AND refund_id = r.refund_id AND to_status = 'dead_lettered'
                ORDER BY seq DESC LIMIT 1
            ) e ON true
            WHERE r.status = 'dead_lettered'
              AND ($1::uuid[] IS NULL OR r.tenant_id = ANY ($1))
              AND ($2::uuid IS NULL OR r.payment_id = $2)
            UNION ALL
            SELECT 'conflict', r.refund_id, r.payment_id, r.tenant_id, t.name, r.amount, r.currency, r.status,
                   r.requested_by, r.provider_refund_id, d.reason, d.evidence, r.send_attempts, r.first_sent_at,
                   d.created_at
            FROM refund_dead_letters d
            JOIN refunds r ON r.tenant_id = d.tenant_id AND r.refund_id = d.refund_id
            LEFT JOIN tenants t ON t.tenant_id = d.tenant_id
            WHERE d.resolved_at IS NULL
              AND ($1::uuid[] IS NULL OR d.tenant_id = ANY ($1))
              AND ($2::uuid IS NULL OR r.payment_id = $2)
        ) waiting
        ORDER BY since, refund_id
        LIMIT $3
        "#,
        tenants,
        payment_id.map(|p| p.as_uuid()),
        LIST_ROWS,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the refunds that wait for an operator")?;
    let mut waiting = Vec::with_capacity(rows.len());
    for row in rows {
        let kind = row.kind.parse().with_context(|| format!("cannot read the entry of refund {}", row.refund_id))?;
        waiting.push(DeadRefund {
            kind,
            refund_id: row.refund_id,
            payment_id: row.payment_id,
            tenant_id: row.tenant_id,
            tenant: row.tenant,
            amount: row.amount,
            currency: row.currency,
            refund_status: row.status,
            requested_by: row.requested_by,
            provider_refund_id: row.provider_refund_id,
            reason: row.reason,
            evidence: row.evidence,
            send_attempts: row.send_attempts,
            first_sent_at: row.first_sent_at,
            since: row.since,
        });
    }
    Ok(waiting)
}

/// Opens a conflict on a final refund that a provider's report contradicts, or adds `evidence` (a
/// JSON array) to its open one, in the caller's transaction. The refund keeps its status. Counts
/// new entries in `oncepay_reconciler_dead_letters_total{kind="refund_conflict"}`.
pub async fn record_conflict(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    reason: &str,
    evidence: Value,
) -> Result<(), oncepay_store::StoreError> {
    // A partial unique index allows one open entry per refund; a later contradiction adds to it.
    let opened = sqlx::query_scalar!(
        r#"
        INSERT INTO refund_dead_letters (tenant_id, refund_id, kind, reason, evidence)
        VALUES ($1, $2, 'conflict', $3, $4)
        ON CONFLICT (tenant_id, refund_id) WHERE resolved_at IS NULL DO UPDATE
        SET evidence = refund_dead_letters.evidence || EXCLUDED.evidence
        RETURNING xmax = 0 AS "opened!"
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
        reason,
        evidence,
    )
    .fetch_one(conn)
    .await?;
    if opened {
        metrics::counter!(super::DEAD_LETTERS, "kind" => super::REFUND_CONFLICT).increment(1);
        tracing::warn!(refund.id = %refund_id, reason, "a final refund is contradicted: a conflict for an operator");
    }
    Ok(())
}

/// A refund as an operator saw it: enough to tell later whether anything happened to it since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefundSnapshot {
    /// Its tenant.
    pub tenant_id: TenantId,
    /// The payment it gives money back from.
    pub payment_id: PaymentId,
    /// The payment's status.
    pub payment_status: PaymentStatus,
    /// How many rows the payment's history has.
    pub payment_event_count: i32,
    /// The refund.
    pub refund_id: RefundId,
    /// Its status.
    pub status: RefundStatus,
    /// How many rows its history has.
    pub event_count: i32,
}

impl RefundSnapshot {
    /// What is different between this and `now`, in words; `None` if nothing.
    pub fn changes(&self, now: &Self) -> Option<String> {
        let mut changes = Vec::new();
        if self.status != now.status {
            changes.push(format!("it was {} and is now {}", self.status.as_str(), now.status.as_str()));
        }
        if now.event_count > self.event_count {
            let more = now.event_count - self.event_count;
            changes.push(format!("its history has {more} more {}", if more == 1 { "row" } else { "rows" }));
        }
        (!changes.is_empty()).then(|| changes.join("; "))
    }
}

/// Refund `refund_id` of `tenant_id` with its payment, the refund locked until the caller's
/// transaction ends.
pub async fn snapshot(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
) -> Result<RefundSnapshot, OperatorError> {
    let row = sqlx::query_as!(
        RefundSnapshot,
        r#"
        SELECT r.tenant_id AS "tenant_id: TenantId", r.payment_id AS "payment_id: PaymentId",
               p.status AS "payment_status: PaymentStatus", p.event_count AS payment_event_count,
               r.refund_id AS "refund_id: RefundId", r.status AS "status: RefundStatus", r.event_count
        FROM refunds r
        JOIN payments p ON p.tenant_id = $1 AND p.payment_id = r.payment_id
        WHERE r.tenant_id = $1 AND r.refund_id = $2
        FOR UPDATE OF r
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the refund")?;
    row.ok_or_else(|| no_refund(refund_id))
}

/// Where refund `refund_id` is: its tenant, its payment and its status, if one of `tenants` (every
/// tenant: `None`) has it. Locks nothing.
pub async fn locate(
    conn: &mut PgConnection,
    tenants: Option<&[Uuid]>,
    refund_id: RefundId,
) -> Result<(TenantId, PaymentId, RefundStatus), OperatorError> {
    // The tenants are listed first, so that the refund is found by its primary key in each.
    let row = sqlx::query!(
        r#"
        SELECT tenant_id AS "tenant_id: TenantId", payment_id AS "payment_id: PaymentId",
               status AS "status: RefundStatus"
        FROM refunds
        WHERE tenant_id IN (SELECT tenant_id FROM tenants WHERE $1::uuid[] IS NULL OR tenant_id = ANY ($1))
          AND refund_id = $2
        "#,
        tenants,
        refund_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the refund")?
    .ok_or_else(|| no_refund(refund_id))?;
    Ok((row.tenant_id, row.payment_id, row.status))
}

fn no_refund(refund_id: RefundId) -> OperatorError {
    OperatorError::NotFound(format!("there is no refund {refund_id}"))
}

/// Refuses unless the refund is dead-lettered: automation settles every other one itself.
pub fn require_dead_lettered(refund_id: RefundId, status: RefundStatus) -> Result<(), OperatorError> {
    if status == RefundStatus::DeadLettered {
        return Ok(());
    }
    Err(OperatorError::Refused(format!(
        "refund {refund_id} is {}: an operator settles or resends only a refund automation gave up on \
         (dead_lettered)",
        status.as_str()
    )))
}

/// A dead-lettered refund, locked for the rest of the transaction, with what its actions need.
struct Locked {
    tenant_id: TenantId,
    refund_id: RefundId,
    payment_id: PaymentId,
    status: RefundStatus,
    amount: Amount,
    currency: Currency,
    /// Whether it was first sent less than the resend horizon ago.
    in_key_window: bool,
    first_sent_at: Option<OffsetDateTime>,
    /// The provider account its payment was charged in (`None`: oncepay's own).
    account: Option<ProviderAccount>,
}

async fn lock(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    resend_horizon: Duration,
) -> Result<Locked, OperatorError> {
    let row = sqlx::query!(
        r#"
        SELECT r.payment_id AS "payment_id: PaymentId", r.status AS "status: RefundStatus",
               r.amount AS "amount: Amount", r.currency AS "currency: Currency", r.first_sent_at,
               p.provider_account AS "account: ProviderAccount",
               COALESCE(now() - r.first_sent_at < make_interval(secs => $3), true) AS "in_key_window!"
        FROM refunds r JOIN payments p ON p.tenant_id = $1 AND p.payment_id = r.payment_id
        WHERE r.tenant_id = $1 AND r.refund_id = $2
        FOR UPDATE OF r
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
        resend_horizon.as_secs_f64(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the refund")?
    .ok_or_else(|| no_refund(refund_id))?;
    require_dead_lettered(refund_id, row.status)?;
    Ok(Locked {
        tenant_id,
        refund_id,
        payment_id: row.payment_id,
        status: row.status,
        amount: row.amount,
        currency: row.currency,
        in_key_window: row.in_key_window,
        first_sent_at: row.first_sent_at,
        account: row.account,
    })
}

/// The provider's refunds in the refund's history (what lookups and webhooks reported), oldest
/// first.
async fn recorded_refunds(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
) -> Result<Vec<ProviderRefund>, OperatorError> {
    let details = sqlx::query_scalar!(
        r#"
        SELECT detail AS "detail!" FROM refund_events
        WHERE tenant_id = $1 AND refund_id = $2 AND detail IS NOT NULL
        ORDER BY seq
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
    )
    .fetch_all(conn)
    .await
    .context("cannot read the refund's history")?;
    Ok(details.iter().flat_map(reported_in).collect())
}

/// The provider's refunds one piece of evidence reports: its `refund`, and each of its `refunds`.
fn reported_in(detail: &Value) -> Vec<ProviderRefund> {
    let one = detail.get("refund").into_iter();
    let many = detail.get("refunds").and_then(Value::as_array).into_iter().flatten();
    one.chain(many).filter_map(|item| serde_json::from_value(item.clone()).ok()).collect()
}

/// A succeeded refund the provider reported for the locked refund, if any: money went back. A
/// refund held by another provider account than the payment's is not this refund's.
async fn succeeded_refund_on_record(conn: &mut PgConnection, locked: &Locked) -> Result<Option<String>, OperatorError> {
    let recorded = recorded_refunds(conn, locked.tenant_id, locked.refund_id).await?;
    let account = locked.account.as_ref().map(ProviderAccount::as_str);
    Ok(recorded
        .into_iter()
        .find(|r| r.status == RefundState::Succeeded && r.account.as_deref() == account)
        .map(|r| r.id))
}

/// What an operator's action did to a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundDone {
    /// An operator's refund was accepted, to be sent by the worker.
    Accepted,
    /// The refund was settled as succeeded.
    Succeeded,
    /// The refund was settled as failed.
    Failed,
    /// The refund was queued to be sent again.
    Retried,
    /// A conflict on the final refund was closed; the refund stays as it is.
    Acknowledged,
}

impl RefundDone {
    /// The name in the JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Retried => "retried",
            Self::Acknowledged => "acknowledged",
        }
    }
}

/// What an operator's action on a refund did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RefundActed {
    /// The refund.
    pub refund_id: RefundId,
    /// Its payment.
    pub payment_id: PaymentId,
    /// What was done.
    pub done: RefundDone,
    /// Who (`operator:<name>`, and who approved it).
    pub by: String,
    /// Why.
    pub note: String,
    /// The refund's status afterwards.
    pub refund_status: RefundStatus,
    /// How much it gives back.
    pub amount: Amount,
    /// In the payment's currency.
    pub currency: Currency,
}

impl Report for RefundActed {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "refund {} of payment {} ({} {}): {} by {}; the refund is now {}",
            self.refund_id,
            self.payment_id,
            self.amount,
            self.currency,
            self.done.as_str(),
            self.by,
            self.refund_status.as_str()
        )
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

impl RefundActed {
    fn of(locked: &Locked, done: RefundDone, operator: &Operator, note: &str, refund_status: RefundStatus) -> Self {
        Self {
            refund_id: locked.refund_id,
            payment_id: locked.payment_id,
            done,
            by: operator.actor().to_owned(),
            note: note.to_owned(),
            refund_status,
            amount: locked.amount,
            currency: locked.currency,
        }
    }
}

/// What [`retry`] needs to know.
#[derive(Debug, Clone)]
pub struct RefundRetry<'a> {
    /// The refund's tenant (the caller checked that the operator may see it).
    pub tenant_id: TenantId,
    /// The dead-lettered refund.
    pub refund_id: RefundId,
    /// Who.
    pub operator: &'a Operator,
    /// Why.
    pub reason: &'a str,
    /// The provider's key window minus the margin, after the refund's first send.
    pub resend_horizon: Duration,
    /// Resend even though the provider may have forgotten the key.
    pub outside_key_window: bool,
}

/// `dead_lettered → pending` and back into the refund outbox, sent again with the same downstream
/// key. Refused past the provider's key window unless `outside_key_window`: the provider would no
/// longer recognise the key, so if an earlier send refunded, the resend would refund twice. Refused
/// there anyway while the provider reported a succeeded refund for it.
pub async fn retry(conn: &mut PgConnection, retry: &RefundRetry<'_>) -> Result<RefundActed, OperatorError> {
    let reason = require_reason(retry.reason)?;
    let refund_id = retry.refund_id;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let locked = lock(&mut tx, retry.tenant_id, refund_id, retry.resend_horizon).await?;
    if !locked.in_key_window && !retry.outside_key_window {
        let sent = locked.first_sent_at.map_or_else(|| "?".to_owned(), render::timestamp);
        return Err(OperatorError::Refused(format!(
            "refund {refund_id} was first sent at {sent}, and the provider may have forgotten its key since: if that \
             send refunded, a resend would refund again. Check its history (`refunds show {refund_id}`), then pass \
             --outside-key-window to resend anyway"
        )));
    }
    if !locked.in_key_window
        && let Some(refunded) = succeeded_refund_on_record(&mut tx, &locked).await?
    {
        return Err(OperatorError::Refused(format!(
            "the provider reported refund {refunded} of refund {refund_id} as succeeded, and past the provider's key \
             window a resend would refund again. Resolve it `--as succeeded --provider-refund-id {refunded}`"
        )));
    }
    let change = RefundChange {
        tenant_id: locked.tenant_id,
        refund_id,
        from: RefundStatus::DeadLettered,
        transition: RefundTransition::OperatorRetry,
        actor: retry.operator.actor(),
        reason,
        detail: Some(json!({ "outside_key_window": !locked.in_key_window })),
    };
    let applied =
        settling::apply(&mut tx, &change, None, OffsetDateTime::now_utc()).await.context("cannot move the refund")?;
    moved(&applied, refund_id)?;
    if !locked.in_key_window {
        // The operators vouch that no earlier send refunded: without this the worker would refuse
        // the resend past the key window. The audit rows record that they did.
        sqlx::query!(
            "UPDATE refunds SET may_have_moved = false WHERE tenant_id = $1 AND refund_id = $2",
            locked.tenant_id.as_uuid(),
            refund_id.as_uuid(),
        )
        .execute(&mut *tx)
        .await
        .context("cannot record the operators' word")?;
    }
    tx.commit().await.context("cannot commit the retry")?;
    Ok(RefundActed::of(&locked, RefundDone::Retried, retry.operator, reason, RefundStatus::Pending))
}

/// Closes the open conflict on refund `refund_id` as acknowledged, by `operator` for `reason`: the
/// refund keeps its final status, and no money moves. Refused when the refund has no open conflict.
pub async fn acknowledge(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    operator: &Operator,
    reason: &str,
) -> Result<RefundActed, OperatorError> {
    let reason = require_reason(reason)?;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let open = sqlx::query!(
        r#"
        SELECT d.dead_letter_id, r.payment_id AS "payment_id: PaymentId", r.status AS "status: RefundStatus",
               r.amount AS "amount: Amount", r.currency AS "currency: Currency"
        FROM refund_dead_letters d JOIN refunds r ON r.tenant_id = $1 AND r.refund_id = d.refund_id
        WHERE d.tenant_id = $1 AND d.refund_id = $2 AND d.resolved_at IS NULL
        FOR UPDATE OF d, r
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
    )
    .fetch_optional(&mut *tx)
    .await
    .context("cannot read the refund's conflict")?
    .ok_or_else(|| {
        OperatorError::Refused(format!(
            "refund {refund_id} has no open conflict to acknowledge: a refund automation gave up on is sent again or \
             settled (`refunds retry`, `refunds resolve --as succeeded|failed`)"
        ))
    })?;
    sqlx::query!(
        r#"
        UPDATE refund_dead_letters
        SET resolved_at = now(), resolved_by = $3, resolution = 'acknowledged', resolution_note = $4
        WHERE tenant_id = $1 AND dead_letter_id = $2 AND resolved_at IS NULL
        "#,
        tenant_id.as_uuid(),
        open.dead_letter_id,
        operator.actor(),
        reason,
    )
    .execute(&mut *tx)
    .await
    .context("cannot close the refund's conflict")?;
    tx.commit().await.context("cannot commit the acknowledgement")?;
    Ok(RefundActed {
        refund_id,
        payment_id: open.payment_id,
        done: RefundDone::Acknowledged,
        by: operator.actor().to_owned(),
        note: reason.to_owned(),
        refund_status: open.status,
        amount: open.amount,
        currency: open.currency,
    })
}

fn moved<T>(recorded: &Recorded<T>, refund_id: RefundId) -> Result<(), OperatorError> {
    match recorded {
        Recorded::Moved(_) => Ok(()),
        // The refund is locked: nothing else can have moved it.
        Recorded::LostRace => Err(OperatorError::Refused(format!("refund {refund_id} changed underneath; try again"))),
    }
}

/// What an operator decides a dead-lettered refund's outcome was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundResolution {
    /// The money went back with the provider's refund `provider_refund_id`, for the refund's
    /// amount, at `refunded_at`.
    Succeeded {
        /// The provider's refund.
        provider_refund_id: String,
        /// When the provider made it.
        refunded_at: OffsetDateTime,
    },
    /// No money went back.
    Failed {
        /// The provider's failed refund, if it made one.
        provider_refund_id: Option<String>,
        /// Although the provider reported a succeeded refund for it (the operator reversed it,
        /// say); the reason must say why.
        force: bool,
    },
}

/// Settles a dead-lettered refund as the operators decided: as succeeded, booking it in the ledger
/// and as refunded on its payment; or as failed, giving its reservation back to the payment.
pub async fn resolve(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    decision: &RefundResolution,
    operator: &Operator,
    reason: &str,
) -> Result<RefundActed, OperatorError> {
    let reason = require_reason(reason)?;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let locked = lock(&mut tx, tenant_id, refund_id, Duration::ZERO).await?;
    let (transition, settlement, detail) = match decision {
        RefundResolution::Succeeded { provider_refund_id, refunded_at } => {
            refuse_booked_elsewhere(&mut tx, &locked, provider_refund_id).await?;
            let settlement = RefundSettlement::Succeeded {
                provider_refund_id: provider_refund_id.clone(),
                refunded_at: *refunded_at,
            };
            (RefundTransition::OperatorSucceeded, settlement, None)
        }
        RefundResolution::Failed { provider_refund_id, force } => {
            if !force && let Some(refunded) = succeeded_refund_on_record(&mut tx, &locked).await? {
                return Err(OperatorError::Refused(format!(
                    "the provider reported refund {refunded} of refund {refund_id} as succeeded; settling it as failed \
                     would give its money back to the payment to refund again. Resolve it `--as succeeded \
                     --provider-refund-id {refunded}`, or, if that refund was reversed, pass --force and say so in \
                     --reason"
                )));
            }
            let settlement = RefundSettlement::Failed {
                code: "resolved_by_operator".to_owned(),
                message: reason.to_owned(),
                provider_refund_id: provider_refund_id.clone(),
            };
            (RefundTransition::OperatorFailed, settlement, force.then(|| json!({ "forced": true })))
        }
    };
    let change = RefundChange {
        tenant_id: locked.tenant_id,
        refund_id,
        from: locked.status,
        transition,
        actor: operator.actor(),
        reason,
        detail,
    };
    let settled = settling::settle(&mut tx, &change, &settlement).await.context("cannot settle the refund")?;
    moved(&settled, refund_id)?;
    tx.commit().await.context("cannot commit the resolution")?;
    let (done, status) = match decision {
        RefundResolution::Succeeded { .. } => (RefundDone::Succeeded, RefundStatus::Succeeded),
        RefundResolution::Failed { .. } => (RefundDone::Failed, RefundStatus::Failed),
    };
    Ok(RefundActed::of(&locked, done, operator, reason, status))
}

/// Refuses a provider refund that the ledger already books for another refund: one provider refund
/// is never booked twice (the ledger's unique index says so too).
async fn refuse_booked_elsewhere(
    conn: &mut PgConnection,
    locked: &Locked,
    provider_refund_id: &str,
) -> Result<(), OperatorError> {
    let booked = sqlx::query_scalar!(
        r#"
        SELECT refund_id AS "refund_id: RefundId" FROM refund_ledger_entries
        WHERE tenant_id = $1 AND provider_refund_id = $2
        "#,
        locked.tenant_id.as_uuid(),
        provider_refund_id,
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the refund ledger")?;
    match booked {
        Some(other) if other != locked.refund_id => Err(OperatorError::Refused(format!(
            "the provider's refund {provider_refund_id} is already booked for refund {other}; one provider refund is \
             never booked twice"
        ))),
        _ => Ok(()),
    }
}

/// A resolution as the operator asked for it, before the provider's refund it names is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskedRefundResolution {
    /// Settle as failed.
    Failed {
        /// The provider's failed refund, if any.
        provider_refund_id: Option<String>,
        /// Although the provider reported a succeeded refund for it.
        force: bool,
    },
    /// Settle as succeeded with the provider's refund `provider_refund_id`: what it gave back and
    /// when are given, or else looked up.
    Succeeded {
        /// The provider's refund (required).
        provider_refund_id: Option<String>,
        /// What it gave back, in minor units, when the provider no longer lists it.
        amount: Option<Amount>,
        /// In this currency (with `amount`).
        currency: Option<Currency>,
        /// When the provider made it, RFC 3339 (with `amount`).
        refunded_at: Option<String>,
    },
}

/// What the refund asked the provider for, read without a lock.
async fn asked(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
) -> Result<AskedRefund, OperatorError> {
    let row = sqlx::query!(
        r#"
        SELECT r.amount AS "amount: Amount", r.currency AS "currency: Currency",
               p.provider_charge_id AS "charge_id!", p.provider_account AS "account: ProviderAccount"
        FROM refunds r JOIN payments p ON p.tenant_id = r.tenant_id AND p.payment_id = r.payment_id
        WHERE r.tenant_id = $1 AND r.refund_id = $2
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the refund")?
    .ok_or_else(|| no_refund(refund_id))?;
    Ok(AskedRefund {
        tenant_id,
        refund_id,
        charge_id: row.charge_id,
        account: row.account,
        amount: row.amount,
        currency: row.currency,
    })
}

/// The resolution an operator asked for: a success's provider refund is taken as given when its
/// amount, currency and time are (and they must be the refund's), and otherwise found with
/// [`find_refund`] from the provider that `provider` builds (only then).
pub async fn resolution<P: PaymentProvider>(
    conn: &mut PgConnection,
    provider: impl FnOnce() -> Result<P, OperatorError>,
    tenant_id: TenantId,
    refund_id: RefundId,
    asked_for: AskedRefundResolution,
) -> Result<RefundResolution, OperatorError> {
    match asked_for {
        AskedRefundResolution::Failed { provider_refund_id, force } => {
            Ok(RefundResolution::Failed { provider_refund_id, force })
        }
        AskedRefundResolution::Succeeded { provider_refund_id: None, .. } => Err(OperatorError::Invalid(
            "a resolution as succeeded needs the provider's refund id (provider_refund_id)".into(),
        )),
        AskedRefundResolution::Succeeded { provider_refund_id: Some(id), amount, currency, refunded_at } => {
            match (amount, currency, refunded_at) {
                (Some(amount), Some(currency), Some(refunded_at)) => {
                    let refund = asked(conn, tenant_id, refund_id).await?;
                    given(&refund, id, amount, currency, &refunded_at)
                }
                (None, None, None) => find_refund(conn, &provider()?, tenant_id, refund_id, &id).await,
                _ => Err(OperatorError::Invalid(
                    "give the provider refund's amount, currency and time together, or none of them to look it up"
                        .into(),
                )),
            }
        }
    }
}

/// A provider refund as the operator read it from the provider's records: it must be for the
/// refund's money.
fn given(
    refund: &AskedRefund,
    provider_refund_id: String,
    amount: Amount,
    currency: Currency,
    refunded_at: &str,
) -> Result<RefundResolution, OperatorError> {
    let refunded_at = OffsetDateTime::parse(refunded_at, &Rfc3339)
        .map_err(|_| OperatorError::Invalid(format!("refunded_at {refunded_at:?} is not an RFC 3339 time")))?;
    if amount != refund.amount || currency != refund.currency {
        return Err(OperatorError::Refused(format!(
            "refund {} gives back {}, and the provider's refund {provider_refund_id} for {} is not it: a provider \
             refund that is not what the refund asked for is never booked as its success",
            refund.refund_id,
            format_amount(refund.amount.minor_units(), refund.currency.as_str()),
            format_amount(amount.minor_units(), currency.as_str())
        )));
    }
    Ok(RefundResolution::Succeeded { provider_refund_id, refunded_at })
}

/// Finds the provider's refund `provider_refund_id` of a refund, for a resolution as succeeded that
/// did not give its amount, currency and time: among the provider's refunds in the refund's history,
/// else among those the provider holds for its key. It settles the refund only if it is what the
/// refund asked for (`settling::judge`). No transaction is open meanwhile.
pub async fn find_refund<P: PaymentProvider>(
    conn: &mut PgConnection,
    provider: &P,
    tenant_id: TenantId,
    refund_id: RefundId,
    provider_refund_id: &str,
) -> Result<RefundResolution, OperatorError> {
    let refund = asked(conn, tenant_id, refund_id).await?;
    let recorded = recorded_refunds(conn, tenant_id, refund_id).await?;
    let found = match recorded.into_iter().rev().find(|r| r.id == provider_refund_id) {
        Some(found) => found,
        None => {
            let lookup = RefundLookup {
                key: refund_id.downstream_key(),
                charge_id: refund.charge_id.clone(),
                account: refund.account.clone(),
            };
            let listed = provider.find_refunds(&lookup).await.map_err(|error| {
                let context = format!("cannot ask the provider about refund {provider_refund_id}");
                OperatorError::Failed(anyhow::Error::new(error).context(context))
            })?;
            listed.into_iter().find(|r| r.id == provider_refund_id).ok_or_else(|| {
                OperatorError::Refused(format!(
                    "neither the refund's history nor the provider's lookup by key names a refund \
                     {provider_refund_id} for refund {refund_id}; give its amount, currency and refunded_at from the \
                     provider's records"
                ))
            })?
        }
    };
    match settling::judge(&refund, &found) {
        Finding::Settles(RefundSettlement::Succeeded { provider_refund_id, refunded_at }) => {
            Ok(RefundResolution::Succeeded { provider_refund_id, refunded_at })
        }
        Finding::Settles(RefundSettlement::Failed { .. }) => Err(OperatorError::Refused(format!(
            "the provider reports refund {provider_refund_id} as failed: no money went back with it"
        ))),
        Finding::Unfinished => Err(OperatorError::Refused(format!(
            "the provider has not finished refund {provider_refund_id}: settle it once it has"
        ))),
        Finding::NotAsAsked(why) => Err(OperatorError::Refused(format!(
            "{why} A provider refund that is not what refund {refund_id} asked for is never booked as its success"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use oncepay_provider::fixtures;

    use super::*;

    #[test]
    fn the_provider_refunds_in_a_piece_of_evidence_are_read_and_anything_else_is_skipped() {
        let refund_id = RefundId::generate();
        let one = fixtures::refund(refund_id, "re_1", "ch_1", RefundState::Succeeded, 100);
        let two = fixtures::refund(refund_id, "re_2", "ch_1", RefundState::Failed, 100);
        let single = json!({"source": "webhook", "refund": one});
        let several = json!({"source": "poll", "refunds": [one, {"not": "a refund"}, two]});
        let neither = json!({"source": "poll", "result": "lookup failed"});

        let ids = |detail: &Value| reported_in(detail).into_iter().map(|r| r.id).collect::<Vec<_>>();

        assert_eq!(ids(&single), ["re_1"]);
        assert_eq!(ids(&several), ["re_1", "re_2"]);
        assert!(ids(&neither).is_empty());
    }

    #[test]
    fn a_refund_that_moved_or_grew_its_history_is_a_change_named_in_words() {
        let seen = RefundSnapshot {
            tenant_id: TenantId::generate(),
            payment_id: PaymentId::generate(),
            payment_status: PaymentStatus::Succeeded,
            payment_event_count: 4,
            refund_id: RefundId::generate(),
            status: RefundStatus::DeadLettered,
            event_count: 5,
        };
        let resent = RefundSnapshot { status: RefundStatus::Pending, event_count: 6, ..seen.clone() };

        assert_eq!(seen.changes(&seen.clone()), None);
        assert_eq!(
            seen.changes(&resent).unwrap(),
            "it was dead_lettered and is now pending; its history has 1 more row"
        );
    }

    #[test]
    fn a_provider_refund_given_by_hand_must_be_for_the_refunds_money() {
        let refund = AskedRefund {
            tenant_id: TenantId::generate(),
            refund_id: RefundId::generate(),
            charge_id: "ch_1".into(),
            account: None,
            amount: Amount::new(500).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
        };
        let at = "2026-01-10T12:00:00Z";

        let (eur, usd) = (Currency::parse("EUR").unwrap(), Currency::parse("USD").unwrap());
        let amount = |minor_units| Amount::new(minor_units).unwrap();

        let right = given(&refund, "re_1".into(), amount(500), eur, at).unwrap();
        let other_money = given(&refund, "re_1".into(), amount(400), eur, at).unwrap_err();
        let other_currency = given(&refund, "re_1".into(), amount(500), usd, at).unwrap_err();
        let bad_time = given(&refund, "re_1".into(), amount(500), eur, "yesterday").unwrap_err();

        assert!(
            matches!(right, RefundResolution::Succeeded { ref provider_refund_id, .. } if provider_refund_id == "re_1")
        );
        assert!(
            matches!(other_money, OperatorError::Refused(ref why) if why.contains("for 4.00 EUR")),
            "{other_money}"
        );
        assert!(
            matches!(other_currency, OperatorError::Refused(ref why) if why.contains("for 5.00 USD")),
            "{other_currency}"
        );
        assert!(matches!(bad_time, OperatorError::Invalid(_)), "{bad_time}");
    }
}
