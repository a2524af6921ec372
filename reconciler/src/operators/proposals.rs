//! Four-eyes approval: a decision that moves money is proposed by one operator and done only when a
//! second, with the approver role, approves it.
//!
//! Proposals are: settling a dead-lettered payment as succeeded or failed (forced or not), and
//! resending one past the provider's key window (and, when `operators.retries_need_approval` is
//! set, any resend). Nobody approves their own proposal. A proposal expires, can be withdrawn by its
//! maker or rejected by an approver, and is checked again when approved: if anything happened to the
//! payment since it was proposed, the approval is refused, saying what changed, and nothing is done.
//! Each step writes its audit row in its own transaction.

use std::fmt;
use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::{Acquire, PgConnection};
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{self, Actor, Entry, Outcome};
use super::{Account, Role, Scope};
use crate::dead_letters::actions::{self, BookedCharge, Operator, Resolution, Retry, require_reason};
use crate::dead_letters::queries::{self, Snapshot};
use crate::dead_letters::reports::Resolved;
use crate::operator_error::OperatorError;
use crate::render;

/// What a proposal will do when approved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Proposed {
    /// Send the payment again with its downstream key; `outside_key_window` although the provider
    /// may have forgotten the key.
    Retry {
        /// Whether the operator vouches that no earlier send charged.
        outside_key_window: bool,
    },
    /// Settle the payment as succeeded with this charge.
    Succeeded {
        /// The provider's charge.
        charge_id: String,
        /// What it charged, in minor units.
        amount: i64,
        /// In this currency.
        currency: String,
        /// When the provider created it.
        #[serde(with = "time::serde::rfc3339")]
        charged_at: OffsetDateTime,
    },
    /// Settle the payment as failed.
    Failed {
        /// The provider's failed charge, if any.
        charge_id: Option<String>,
        /// Although a recorded charge says the payment succeeded.
        force: bool,
    },
}

impl fmt::Display for Proposed {
    /// What it will do, in words: `settle as succeeded with charge ch_1 (1999 EUR)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retry { outside_key_window: false } => f.write_str("send again"),
            Self::Retry { outside_key_window: true } => f.write_str("send again, past the provider's key window"),
            Self::Succeeded { charge_id, amount, currency, .. } => {
                write!(f, "settle as succeeded with charge {charge_id} ({amount} {currency})")
            }
            Self::Failed { charge_id, force } => {
                f.write_str("settle as failed")?;
                if let Some(charge_id) = charge_id {
                    write!(f, " with failed charge {charge_id}")?;
                }
                if *force { f.write_str(", although a charge on record says the money was taken") } else { Ok(()) }
            }
        }
    }
}

impl Proposed {
    /// Proposes to settle with `resolution` (not an acknowledgement, which needs no second operator).
    pub fn resolution(resolution: Resolution) -> Result<Self, OperatorError> {
        match resolution {
            Resolution::Succeeded(charge) => Ok(Self::Succeeded {
                charge_id: charge.charge_id,
                amount: charge.amount.minor_units(),
                currency: charge.currency.as_str().to_owned(),
                charged_at: charge.charged_at,
            }),
            Resolution::Failed { charge_id, force } => Ok(Self::Failed { charge_id, force }),
            Resolution::Acknowledge => {
                Err(OperatorError::Invalid("acknowledging a conflict is done directly, not proposed".into()))
            }
        }
    }

    fn audit_action(&self) -> &'static str {
        match self {
            Self::Retry { .. } => "payment.retry",
            Self::Succeeded { .. } | Self::Failed { .. } => "payment.resolve",
        }
    }
}

/// A proposal as operators see it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProposalView {
    /// Its id.
    pub proposal_id: Uuid,
    /// The payment's tenant.
    pub tenant_id: TenantId,
    /// The payment.
    pub payment_id: PaymentId,
    /// What it will do.
    pub action: Value,
    /// Why, in the proposer's words.
    pub reason: String,
    /// `pending`, `approved`, `rejected`, `withdrawn` or `expired`.
    pub status: String,
    /// Who proposed it.
    pub proposed_by: String,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    pub proposed_at: OffsetDateTime,
    /// When it can no longer be approved.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// Who approved, rejected or withdrew it.
    pub decided_by: Option<String>,
    /// When.
    #[serde(with = "time::serde::rfc3339::option")]
    pub decided_at: Option<OffsetDateTime>,
    /// Why.
    pub decision_note: Option<String>,
}

/// How long a proposal waits, and the key window's horizon its resend is judged by.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long a proposal waits for an approver.
    pub ttl: Duration,
    /// The provider's key window minus the margin, after the payment's first send.
    pub resend_horizon: Duration,
}

/// Proposes `action` on dead-lettered payment `payment_id`, to wait for an approver. Refused while
/// another proposal waits for the same payment, and refused at once when the action's own rules
/// would refuse it now: it is tried, and undone, before it is proposed.
pub async fn propose(
    conn: &mut PgConnection,
    by: &Account,
    source: Option<&str>,
    payment_id: PaymentId,
    action: &Proposed,
    reason: &str,
    limits: Limits,
) -> Result<ProposalView, OperatorError> {
    by.require(Role::Operator, "propose a decision")?;
    let reason = require_reason(reason)?;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let seen = queries::snapshot(&mut tx, payment_id).await?;
    by.see(seen.tenant_id, || not_found(payment_id))?;
    if seen.status.is_terminal() {
        return Err(OperatorError::Refused(format!(
            "payment {payment_id} is {}, and a terminal payment never changes: acknowledge the conflict instead",
            seen.status.as_str()
        )));
    }
    let mut trial = tx.begin().await.context("cannot start a trial")?;
    carry_out(&mut trial, payment_id, action, &by.actor()?, reason, limits.resend_horizon).await?;
    trial.rollback().await.context("cannot undo the trial")?;
    sqlx::query!(
        r#"
        UPDATE proposals
        SET status = 'expired', decided_at = LEAST(expires_at, now()),
            decision_note = CASE WHEN expires_at <= now() THEN NULL
                                 ELSE 'its dead letter was closed before anyone decided' END
        WHERE payment_id = $1 AND status = 'pending' AND (expires_at <= now() OR seen_dead_letter_id <> $2)
        "#,
        payment_id.as_uuid(),
        seen.dead_letter_id,
    )
    .execute(&mut *tx)
    .await
    .context("cannot expire the payment's old proposals")?;
    let proposal_id = Uuid::now_v7();
    let stored = serde_json::to_value(action).context("cannot store the proposal")?;
    let inserted = sqlx::query!(
        r#"
        INSERT INTO proposals (proposal_id, tenant_id, payment_id, action, reason, seen_status, seen_event_count,
                               seen_dead_letter_id, seen_evidence_count, proposed_by, expires_at,
                               proposer_credential_by)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now() + make_interval(secs => $11), $12)
        ON CONFLICT (payment_id) WHERE status = 'pending' DO NOTHING
        RETURNING proposal_id
        "#,
        proposal_id,
        seen.tenant_id.as_uuid(),
        payment_id.as_uuid(),
        stored,
        reason,
        seen.status as _,
        seen.event_count,
        seen.dead_letter_id,
        seen.evidence_count,
        by.operator_id,
        limits.ttl.as_secs_f64(),
        by.made_by,
    )
    .fetch_optional(&mut *tx)
    .await
    .context("cannot store the proposal")?;
    if inserted.is_none() {
        return Err(OperatorError::Refused(format!(
            "another proposal already waits for payment {payment_id}: approve, reject or withdraw it first \
             (GET /v1/proposals?payment_id={payment_id})"
        )));
    }
    let entry = Entry::new(action.audit_action(), Outcome::Proposed)
        .payment(seen.tenant_id, payment_id)
        .proposal(proposal_id)
        .reason(reason)
        .before(json!(seen))
        .detail(stored);
    audit::record(&mut tx, &Actor::of(by, source), &entry).await?;
    let view = read(&mut tx, proposal_id).await?;
    tx.commit().await.context("cannot commit the proposal")?;
    Ok(view)
}

/// What an approval did.
#[derive(Debug, Serialize, Deserialize)]
pub struct Approved {
    /// The proposal, now approved.
    pub proposal: ProposalView,
    /// What was done to the payment.
    pub result: Resolved,
}

/// Approves proposal `proposal_id` and does what it proposes, in one transaction.
pub async fn approve(
    conn: &mut PgConnection,
    by: &Account,
    source: Option<&str>,
    proposal_id: Uuid,
    note: &str,
    resend_horizon: Duration,
) -> Result<Approved, OperatorError> {
    by.require(Role::Approver, "approve a proposal")?;
    let note = require_reason(note)?;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let pending = lock_pending(&mut tx, by, proposal_id).await?;
    if pending.proposed_by_id == by.operator_id {
        return Err(OperatorError::Forbidden(format!(
            "proposal {proposal_id} is yours: a second operator must approve it (nobody approves their own)"
        )));
    }
    // Whoever made a credential can act with it: the two sides must not be one person's.
    if by.made_by == pending.proposed_by_id || pending.proposer_credential_by == Some(by.operator_id) {
        return Err(OperatorError::Forbidden(format!(
            "proposal {proposal_id} cannot be approved with this credential: one of you issued the other's token \
             or set their password, so one person could stand behind both sides. Approve with a token you issued \
             yourself, or after signing in at the OpenID provider"
        )));
    }
    let payment_id = pending.view.payment_id;
    let now = match queries::snapshot(&mut tx, payment_id).await {
        Ok(now) => now,
        Err(OperatorError::NotFound(_)) => {
            return Err(OperatorError::Refused(format!(
                "payment {payment_id} has no open dead letter any more: someone settled or retried it since the \
                 proposal; nothing was done"
            )));
        }
        Err(other) => return Err(other),
    };
    if let Some(changes) = changes(&pending.seen, &now) {
        return Err(OperatorError::Refused(format!(
            "payment {payment_id} moved since it was proposed ({changes}); nothing was done. Read it again, and \
             propose anew if the decision still holds"
        )));
    }
    let proposed: Proposed = serde_json::from_value(pending.view.action.clone())
        .with_context(|| format!("cannot read proposal {proposal_id}"))?;
    let operator = Operator::parse(&pending.view.proposed_by)?.approved_by(&by.name);
    let result = carry_out(&mut tx, payment_id, &proposed, &operator, &pending.view.reason, resend_horizon).await?;
    decide(&mut tx, proposal_id, "approved", by, note).await?;
    let entry = Entry::new("proposal.approve", Outcome::Done)
        .payment(now.tenant_id, payment_id)
        .proposal(proposal_id)
        .reason(note)
        .before(json!(now))
        .after(json!(result))
        .detail(pending.view.action.clone());
    audit::record(&mut tx, &Actor::of(by, source), &entry).await?;
    let proposal = read(&mut tx, proposal_id).await?;
    tx.commit().await.context("cannot commit the approval")?;
    Ok(Approved { proposal, result })
}

/// Does what `proposed` says to dead-lettered payment `payment_id`, as `operator`, in the caller's
/// transaction; the action's own rules refuse what does not fit the payment now.
async fn carry_out(
    conn: &mut PgConnection,
    payment_id: PaymentId,
    proposed: &Proposed,
    operator: &Operator,
    reason: &str,
    resend_horizon: Duration,
) -> Result<Resolved, OperatorError> {
    match proposed {
        Proposed::Retry { outside_key_window } => {
            let retry = Retry { payment_id, operator, reason, resend_horizon, outside_key_window: *outside_key_window };
            actions::retry(conn, &retry).await
        }
        Proposed::Succeeded { charge_id, amount, currency, charged_at } => {
            let charge = BookedCharge {
                charge_id: charge_id.clone(),
                amount: Amount::new(*amount).context("a stored proposal has a bad amount")?,
                currency: Currency::parse(currency).context("a stored proposal has a bad currency")?,
                charged_at: *charged_at,
            };
            actions::resolve(conn, payment_id, &Resolution::Succeeded(charge), operator, reason).await
        }
        Proposed::Failed { charge_id, force } => {
            let decision = Resolution::Failed { charge_id: charge_id.clone(), force: *force };
            actions::resolve(conn, payment_id, &decision, operator, reason).await
        }
    }
}

/// Rejects (an approver, on someone else's proposal) or withdraws (its maker) a pending proposal.
pub async fn close(
    conn: &mut PgConnection,
    by: &Account,
    source: Option<&str>,
    proposal_id: Uuid,
    how: Closing,
    note: &str,
) -> Result<ProposalView, OperatorError> {
    let note = require_reason(note)?;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let pending = lock_pending(&mut tx, by, proposal_id).await?;
    let own = pending.proposed_by_id == by.operator_id;
    match how {
        Closing::Withdraw if !own => {
            return Err(OperatorError::Forbidden(format!(
                "only {} can withdraw proposal {proposal_id}; an approver can reject it",
                pending.view.proposed_by
            )));
        }
        Closing::Reject if own => {
            return Err(OperatorError::Forbidden(format!("proposal {proposal_id} is yours: withdraw it instead")));
        }
        Closing::Reject => by.require(Role::Approver, "reject a proposal")?,
        Closing::Withdraw => {}
    }
    decide(&mut tx, proposal_id, how.status(), by, note).await?;
    let entry = Entry::new(how.audit_action(), Outcome::Done)
        .payment(pending.view.tenant_id, pending.view.payment_id)
        .proposal(proposal_id)
        .reason(note)
        .detail(pending.view.action.clone());
    audit::record(&mut tx, &Actor::of(by, source), &entry).await?;
    let view = read(&mut tx, proposal_id).await?;
    tx.commit().await.context("cannot commit the decision")?;
    Ok(view)
}

/// How a proposal is closed without being done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// By an approver who says no.
    Reject,
    /// By its maker.
    Withdraw,
}

impl Closing {
    const fn status(self) -> &'static str {
        match self {
            Self::Reject => "rejected",
            Self::Withdraw => "withdrawn",
        }
    }

    const fn audit_action(self) -> &'static str {
        match self {
            Self::Reject => "proposal.reject",
            Self::Withdraw => "proposal.withdraw",
        }
    }
}

/// The proposals `scope` may see, newest first (at most 500): all, or only those of `payment_id`,
/// or only those with `status` (`expired` is a pending proposal past its expiry).
pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    payment_id: Option<PaymentId>,
    status: Option<&str>,
) -> Result<Vec<ProposalView>, OperatorError> {
    select(conn, scope, payment_id, None, status).await
}

async fn read(conn: &mut PgConnection, proposal_id: Uuid) -> Result<ProposalView, OperatorError> {
    let found = select(conn, &Scope::Every, None, Some(proposal_id), None).await?;
    found.into_iter().next().ok_or_else(|| proposal_not_found(proposal_id))
}

async fn select(
    conn: &mut PgConnection,
    scope: &Scope,
    payment_id: Option<PaymentId>,
    proposal_id: Option<Uuid>,
    status: Option<&str>,
) -> Result<Vec<ProposalView>, OperatorError> {
    let tenants = scope.to_column();
    let rows = sqlx::query_as!(
        ProposalView,
        r#"
        SELECT p.proposal_id, p.tenant_id AS "tenant_id: TenantId", p.payment_id AS "payment_id: PaymentId",
               p.action, p.reason, s.status AS "status!", m.name AS proposed_by, p.proposed_at, p.expires_at,
               d.name AS "decided_by?", p.decided_at, p.decision_note
        FROM proposals p
        CROSS JOIN LATERAL (
            SELECT CASE WHEN p.status = 'pending' AND p.expires_at <= now() THEN 'expired' ELSE p.status::text END
                AS status
        ) s
        JOIN operators m ON m.operator_id = p.proposed_by
        LEFT JOIN operators d ON d.operator_id = p.decided_by
        WHERE ($1::uuid[] IS NULL OR p.tenant_id = ANY ($1))
          AND ($2::uuid IS NULL OR p.payment_id = $2)
          AND ($3::uuid IS NULL OR p.proposal_id = $3)
          AND ($4::text IS NULL OR s.status = $4)
        ORDER BY p.proposed_at DESC
        LIMIT 500
        "#,
        tenants.as_deref(),
        payment_id.map(|p| p.as_uuid()),
        proposal_id,
        status,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the proposals")?;
    Ok(rows)
}

/// A pending, unexpired proposal the operator may see, locked.
struct Pending {
    view: ProposalView,
    proposed_by_id: Uuid,
    /// Who made the credential the proposal was made with.
    proposer_credential_by: Option<Uuid>,
    seen: Snapshot,
}

async fn lock_pending(conn: &mut PgConnection, by: &Account, proposal_id: Uuid) -> Result<Pending, OperatorError> {
    let row = sqlx::query!(
        r#"
        SELECT proposed_by, proposer_credential_by, seen_status AS "seen_status: oncepay_domain::status::PaymentStatus",
               seen_event_count, seen_dead_letter_id, seen_evidence_count
        FROM proposals WHERE proposal_id = $1
        FOR UPDATE
        "#,
        proposal_id,
    )
    .fetch_optional(&mut *conn)
    .await
    .context("cannot read the proposal")?
    .ok_or_else(|| proposal_not_found(proposal_id))?;
    let view = read(conn, proposal_id).await?;
    by.see(view.tenant_id, || proposal_not_found(proposal_id))?;
    match view.status.as_str() {
        "pending" => {}
        "expired" => {
            return Err(OperatorError::Refused(format!(
                "proposal {proposal_id} expired at {} without an approval; nothing was done",
                render::timestamp(view.expires_at)
            )));
        }
        other => {
            let by = view.decided_by.as_deref().unwrap_or("nobody");
            return Err(OperatorError::Refused(format!("proposal {proposal_id} was already {other} by {by}")));
        }
    }
    let seen = Snapshot {
        tenant_id: view.tenant_id,
        status: row.seen_status,
        event_count: row.seen_event_count,
        dead_letter_id: row.seen_dead_letter_id,
        evidence_count: row.seen_evidence_count,
    };
    Ok(Pending { view, proposed_by_id: row.proposed_by, proposer_credential_by: row.proposer_credential_by, seen })
}

async fn decide(
    conn: &mut PgConnection,
    proposal_id: Uuid,
    status: &str,
    by: &Account,
    note: &str,
) -> Result<(), OperatorError> {
    sqlx::query!(
        r#"
        UPDATE proposals SET status = $2::text::proposal_status, decided_by = $3, decided_at = now(), decision_note = $4
        WHERE proposal_id = $1 AND status = 'pending'
        "#,
        proposal_id,
        status,
        by.operator_id,
        note,
    )
    .execute(conn)
    .await
    .context("cannot record the decision")?;
    Ok(())
}

/// What is different between what the proposer saw and now, in words; `None` if nothing.
fn changes(seen: &Snapshot, now: &Snapshot) -> Option<String> {
    let mut changes = Vec::new();
    if seen.status != now.status {
        changes.push(format!("it was {} and is now {}", seen.status.as_str(), now.status.as_str()));
    }
    if seen.dead_letter_id != now.dead_letter_id {
        changes.push(format!("its dead letter {} was closed and {} opened", seen.dead_letter_id, now.dead_letter_id));
    }
    if now.event_count > seen.event_count {
        changes.push(format!("its history has {} more", rows(now.event_count - seen.event_count)));
    }
    if now.evidence_count > seen.evidence_count && seen.dead_letter_id == now.dead_letter_id {
        changes.push(format!("{} of evidence arrived", pieces(now.evidence_count - seen.evidence_count)));
    }
    (!changes.is_empty()).then(|| changes.join("; "))
}

fn rows(n: i32) -> String {
    if n == 1 { "1 row".to_owned() } else { format!("{n} rows") }
}

fn pieces(n: i32) -> String {
    if n == 1 { "1 new piece".to_owned() } else { format!("{n} new pieces") }
}

fn not_found(payment_id: PaymentId) -> OperatorError {
    OperatorError::NotFound(format!("payment {payment_id} has no open dead letter"))
}

fn proposal_not_found(proposal_id: Uuid) -> OperatorError {
    OperatorError::NotFound(format!("there is no proposal {proposal_id}"))
}

#[cfg(test)]
mod tests {
    use oncepay_domain::status::PaymentStatus;

    use super::*;

    fn seen() -> Snapshot {
        Snapshot {
            tenant_id: TenantId::generate(),
            status: PaymentStatus::DeadLettered,
            event_count: 5,
            dead_letter_id: 7,
            evidence_count: 2,
        }
    }

    #[test]
    fn nothing_changed_is_no_change_and_each_change_is_named() {
        let before = seen();
        assert_eq!(changes(&before, &before.clone()), None);
        let evidence = Snapshot { evidence_count: 3, ..before.clone() };
        assert_eq!(changes(&before, &evidence).unwrap(), "1 new piece of evidence arrived");
        let moved = Snapshot { status: PaymentStatus::Succeeded, event_count: 6, ..before.clone() };
        assert_eq!(
            changes(&before, &moved).unwrap(),
            "it was dead_lettered and is now succeeded; its history has 1 row more"
        );
    }

    #[test]
    fn a_proposed_action_is_stored_as_tagged_json_and_read_back() {
        let failed = Proposed::Failed { charge_id: None, force: true };
        let stored = serde_json::to_value(&failed).unwrap();
        assert_eq!(stored, json!({"kind": "failed", "charge_id": null, "force": true}));
        assert_eq!(serde_json::from_value::<Proposed>(stored).unwrap(), failed);
        assert!(Proposed::resolution(Resolution::Acknowledge).is_err());
    }
}
