//! Four-eyes approval: a decision that moves money is proposed by one operator and done only when a
//! second, with the approver role, approves it.
//!
//! Proposals are: settling a dead-lettered payment as succeeded or failed (forced or not), and
//! resending one past the provider's key window (and, when `operators.retries_need_approval` is
//! set, any resend); an operator's refund of a succeeded payment; and settling a dead-lettered
//! refund as succeeded or failed, or resending one past the key window (or any, as for payments).
//! Nobody approves their own proposal. A proposal expires, can be withdrawn by its maker or rejected
//! by an approver, and is checked again when approved: if anything happened to what it stands on
//! (the payment's dead letter, the payment's refunds, the refund) since it was proposed, the
//! approval is refused, saying what changed, and nothing is done. Each step writes its audit row in
//! its own transaction.

use std::fmt;
use std::io::{self, Write};
use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::refund::RefundReason;
use oncepay_domain::status::PaymentStatus;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::{Acquire, PgConnection};
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{self, Actor, Entry, Outcome};
use super::refunds::{self as operator_refunds, OperatorRefund, RefundsSeen};
use super::{Account, Role, Scope};
use crate::dead_letters::actions::{self, BookedCharge, Operator, Resolution, Retry, require_reason};
use crate::dead_letters::queries::{self, Snapshot};
use crate::dead_letters::refunds::{self as dead_refunds, RefundActed, RefundResolution, RefundRetry, RefundSnapshot};
use crate::dead_letters::reports::Resolved;
use crate::operator_error::OperatorError;
use crate::render::{self, Report};

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
    /// Give money back from the succeeded payment: a refund accepted by the merchants' intake,
    /// asked for by the proposer, sent by the worker.
    Refund {
        /// How much, in minor units, as asked; `None`: all that is left.
        amount: Option<i64>,
        /// What that came to when it was proposed (the approval is refused if the payment's refunds
        /// changed since).
        comes_to: i64,
        /// In the payment's currency.
        currency: String,
        /// Why, in the provider's words.
        #[serde(default, with = "reason_name")]
        reason: Option<RefundReason>,
    },
    /// Settle a dead-lettered refund as succeeded with the provider's refund, for its amount.
    RefundSucceeded {
        /// The refund.
        refund_id: RefundId,
        /// The provider's refund.
        provider_refund_id: String,
        /// When the provider made it.
        #[serde(with = "time::serde::rfc3339")]
        refunded_at: OffsetDateTime,
    },
    /// Settle a dead-lettered refund as failed.
    RefundFailed {
        /// The refund.
        refund_id: RefundId,
        /// The provider's failed refund, if any.
        provider_refund_id: Option<String>,
        /// Although the provider reported a succeeded refund for it.
        force: bool,
    },
    /// Send a dead-lettered refund again with its downstream key; `outside_key_window` although the
    /// provider may have forgotten the key.
    RefundRetry {
        /// The refund.
        refund_id: RefundId,
        /// Whether the operators vouch that no earlier send refunded.
        outside_key_window: bool,
    },
}

/// `Option<RefundReason>` stored as its name: the domain's reason is only ever written by serde.
mod reason_name {
    use oncepay_domain::refund::RefundReason;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(reason: &Option<RefundReason>, out: S) -> Result<S::Ok, S::Error> {
        reason.map(RefundReason::as_str).serialize(out)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<Option<RefundReason>, D::Error> {
        let name: Option<String> = Option::deserialize(input)?;
        name.map(|name| {
            RefundReason::parse(&name).ok_or_else(|| D::Error::custom(format!("{name:?} is not a refund reason")))
        })
        .transpose()
    }
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
            Self::Refund { amount, comes_to, currency, reason } => {
                match amount {
                    Some(_) => write!(f, "refund {comes_to} {currency}")?,
                    None => write!(f, "refund all that is left, {comes_to} {currency}")?,
                }
                match reason {
                    Some(reason) => write!(f, " ({})", reason.as_str().replace('_', " ")),
                    None => Ok(()),
                }
            }
            Self::RefundSucceeded { refund_id, provider_refund_id, .. } => {
                write!(f, "settle refund {refund_id} as succeeded with the provider's refund {provider_refund_id}")
            }
            Self::RefundFailed { refund_id, provider_refund_id, force } => {
                write!(f, "settle refund {refund_id} as failed")?;
                if let Some(provider_refund_id) = provider_refund_id {
                    write!(f, " with failed refund {provider_refund_id}")?;
                }
                if *force { f.write_str(", although a refund on record says the money went back") } else { Ok(()) }
            }
            Self::RefundRetry { refund_id, outside_key_window } => {
                write!(f, "send refund {refund_id} again")?;
                if *outside_key_window { f.write_str(", past the provider's key window") } else { Ok(()) }
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

    /// Proposes to settle dead-lettered refund `refund_id` with `resolution`.
    pub fn refund_resolution(refund_id: RefundId, resolution: RefundResolution) -> Self {
        match resolution {
            RefundResolution::Succeeded { provider_refund_id, refunded_at } => {
                Self::RefundSucceeded { refund_id, provider_refund_id, refunded_at }
            }
            RefundResolution::Failed { provider_refund_id, force } => {
                Self::RefundFailed { refund_id, provider_refund_id, force }
            }
        }
    }

    /// The action its audit rows are recorded under.
    pub const fn audit_action(&self) -> &'static str {
        match self {
            Self::Retry { .. } => "payment.retry",
            Self::Succeeded { .. } | Self::Failed { .. } => "payment.resolve",
            Self::Refund { .. } => "payment.refund",
            Self::RefundRetry { .. } => "refund.retry",
            Self::RefundSucceeded { .. } | Self::RefundFailed { .. } => "refund.resolve",
        }
    }

    /// What it stands on: what its approval checks again.
    const fn stand(&self) -> Stand {
        match self {
            Self::Retry { .. } | Self::Succeeded { .. } | Self::Failed { .. } => Stand::DeadLetter,
            Self::Refund { .. } => Stand::Refunds,
            Self::RefundSucceeded { refund_id, .. }
            | Self::RefundFailed { refund_id, .. }
            | Self::RefundRetry { refund_id, .. } => Stand::Refund(*refund_id),
        }
    }
}

/// What a proposal stands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stand {
    /// A dead-lettered payment's open dead letter.
    DeadLetter,
    /// A succeeded payment's refunds.
    Refunds,
    /// A dead-lettered refund.
    Refund(RefundId),
}

/// What a proposal stands on, as its proposer saw it: checked again when it is approved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
enum Seen {
    /// A dead-lettered payment and its open dead letter.
    DeadLetter(Snapshot),
    /// A succeeded payment and its refunds.
    Refunds(RefundsSeen),
    /// A dead-lettered refund and its payment.
    Refund(RefundSnapshot),
}

impl Seen {
    /// Reads what `stand` names on payment `payment_id`, locked, if `scope` may see it.
    async fn read(
        conn: &mut PgConnection,
        scope: &Scope,
        payment_id: PaymentId,
        stand: Stand,
    ) -> Result<Self, OperatorError> {
        match stand {
            Stand::DeadLetter => Ok(Self::DeadLetter(queries::snapshot(conn, payment_id).await?)),
            Stand::Refunds => {
                let tenant_id = queries::payment_tenant(conn, scope.to_column().as_deref(), payment_id)
                    .await?
                    .ok_or_else(|| no_payment(payment_id))?;
                Ok(Self::Refunds(operator_refunds::seen(conn, tenant_id, payment_id).await?))
            }
            Stand::Refund(refund_id) => {
                let (tenant_id, of_payment, _) =
                    dead_refunds::locate(conn, scope.to_column().as_deref(), refund_id).await?;
                if of_payment != payment_id {
                    return Err(OperatorError::NotFound(format!("payment {payment_id} has no refund {refund_id}")));
                }
                Ok(Self::Refund(dead_refunds::snapshot(conn, tenant_id, refund_id).await?))
            }
        }
    }

    /// The same thing as it is now, locked, for an approval.
    async fn again(&self, conn: &mut PgConnection, payment_id: PaymentId) -> Result<Self, OperatorError> {
        match self {
            Self::DeadLetter(_) => match queries::snapshot(conn, payment_id).await {
                Ok(now) => Ok(Self::DeadLetter(now)),
                Err(OperatorError::NotFound(_)) => Err(OperatorError::Refused(format!(
                    "payment {payment_id} has no open dead letter any more: someone settled or retried it since the \
                     proposal; nothing was done"
                ))),
                Err(other) => Err(other),
            },
            Self::Refunds(seen) => Ok(Self::Refunds(operator_refunds::seen(conn, seen.tenant_id, payment_id).await?)),
            Self::Refund(seen) => Ok(Self::Refund(dead_refunds::snapshot(conn, seen.tenant_id, seen.refund_id).await?)),
        }
    }

    const fn tenant_id(&self) -> TenantId {
        match self {
            Self::DeadLetter(seen) => seen.tenant_id,
            Self::Refunds(seen) => seen.tenant_id,
            Self::Refund(seen) => seen.tenant_id,
        }
    }

    /// Refuses a proposal that what it stands on cannot take now.
    fn refuse_closed(&self, payment_id: PaymentId) -> Result<(), OperatorError> {
        match self {
            Self::DeadLetter(seen) if seen.status.is_terminal() => Err(OperatorError::Refused(format!(
                "payment {payment_id} is {}, and a terminal payment never changes: acknowledge the conflict instead",
                seen.status.as_str()
            ))),
            Self::Refund(seen) => dead_refunds::require_dead_lettered(seen.refund_id, seen.status),
            Self::DeadLetter(_) | Self::Refunds(_) => Ok(()),
        }
    }

    /// Why an approval is refused because of what changed between this and `now`; `None` if
    /// nothing did.
    fn moved(&self, now: &Self, payment_id: PaymentId) -> Option<String> {
        let (subject, changes) = match (self, now) {
            (Self::DeadLetter(seen), Self::DeadLetter(now)) => {
                (format!("payment {payment_id} moved"), changes(seen, now))
            }
            (Self::Refunds(seen), Self::Refunds(now)) => {
                (format!("the refunds of payment {payment_id} changed"), seen.changes(now))
            }
            (Self::Refund(seen), Self::Refund(now)) => (format!("refund {} moved", seen.refund_id), seen.changes(now)),
            _ => (format!("payment {payment_id} changed"), Some("it stands on something else".to_owned())),
        };
        changes.map(|changes| {
            format!(
                "{subject} since it was proposed ({changes}); nothing was done. Read it again, and propose anew if the \
                 decision still holds"
            )
        })
    }

    /// How it is stored in `proposals`.
    fn columns(&self) -> Columns {
        let mut columns = Columns::default();
        match self {
            Self::DeadLetter(seen) => {
                (columns.status, columns.event_count) = (Some(seen.status), seen.event_count);
                columns.dead_letter_id = Some(seen.dead_letter_id);
                columns.evidence_count = Some(seen.evidence_count);
            }
            Self::Refunds(seen) => {
                (columns.status, columns.event_count) = (Some(seen.status), seen.event_count);
                columns.refunds_reserved = Some(seen.refunds_reserved);
                columns.refunded = Some(seen.refunded);
                columns.refund_count = Some(seen.refund_count);
            }
            Self::Refund(seen) => {
                (columns.status, columns.event_count) = (Some(seen.payment_status), seen.payment_event_count);
                columns.refund_id = Some(seen.refund_id.as_uuid());
                columns.refund_event_count = Some(seen.event_count);
            }
        }
        columns
    }

    /// Reads it back from its columns (`proposal_id` names it in an error).
    fn of_columns(
        proposal_id: Uuid,
        tenant_id: TenantId,
        payment_id: PaymentId,
        payment: (Amount, Currency),
        columns: Columns,
    ) -> Result<Self, OperatorError> {
        let status = columns.status.context("a stored proposal has no status")?;
        let event_count = columns.event_count;
        let Columns { dead_letter_id, evidence_count, refunds_reserved, refunded, refund_count, refund_id, .. } =
            columns;
        match (dead_letter_id, evidence_count, refunds_reserved, refunded, refund_count, refund_id) {
            (Some(dead_letter_id), Some(evidence_count), None, None, None, None) => {
                Ok(Self::DeadLetter(Snapshot { tenant_id, status, event_count, dead_letter_id, evidence_count }))
            }
            (None, None, Some(refunds_reserved), Some(refunded), Some(refund_count), None) => {
                let (amount, currency) = payment;
                Ok(Self::Refunds(RefundsSeen {
                    tenant_id,
                    status,
                    event_count,
                    amount,
                    currency,
                    refunds_reserved,
                    refunded,
                    refund_count,
                }))
            }
            (None, None, None, None, None, Some(refund_id)) => Ok(Self::Refund(RefundSnapshot {
                tenant_id,
                payment_id,
                payment_status: status,
                payment_event_count: event_count,
                refund_id: RefundId::from_uuid(refund_id),
                // Only a dead-lettered refund is proposed on.
                status: PaymentStatus::DeadLettered,
                event_count: columns
                    .refund_event_count
                    .context("a stored proposal on a refund has no history count")?,
            })),
            _ => Err(OperatorError::Failed(anyhow::anyhow!(
                "proposal {proposal_id} stands on nothing this version knows"
            ))),
        }
    }
}

/// The `seen_*` columns of `proposals` (migrations/0240, 0310): the payment's, then each kind's own.
#[derive(Debug, Clone, Default)]
struct Columns {
    status: Option<PaymentStatus>,
    event_count: i32,
    dead_letter_id: Option<i64>,
    evidence_count: Option<i32>,
    refunds_reserved: Option<i64>,
    refunded: Option<i64>,
    refund_count: Option<i32>,
    refund_id: Option<Uuid>,
    refund_event_count: Option<i32>,
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
    /// How long a proposal waits for an approver; also how long the key of an operator's refund is
    /// kept at least.
    pub ttl: Duration,
    /// The provider's key window minus the margin, after the payment's (or refund's) first send.
    pub resend_horizon: Duration,
}

/// Proposes `action` on payment `payment_id` (its open dead letter, its refunds, or one of its
/// dead-lettered refunds), to wait for an approver. Refused while another proposal waits for the
/// same payment, and refused at once when the action's own rules would refuse it now: it is tried,
/// and undone, before it is proposed.
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
    let seen = Seen::read(&mut tx, &by.scope, payment_id, action.stand()).await?;
    let hidden = || if action.stand() == Stand::DeadLetter { not_found(payment_id) } else { no_payment(payment_id) };
    by.see(seen.tenant_id(), hidden)?;
    seen.refuse_closed(payment_id)?;
    let proposal_id = Uuid::now_v7();
    let stored = serde_json::to_value(action).context("cannot store the proposal")?;
    let operator = by.actor()?;
    let carry = Carry {
        proposal_id,
        seen: &seen,
        payment_id,
        operator: &operator,
        proposer: &operator,
        reason,
        limits,
        action: &stored,
    };
    let mut trial = tx.begin().await.context("cannot start a trial")?;
    let tried = carry_out(&mut trial, &carry, action).await?;
    trial.rollback().await.context("cannot undo the trial")?;
    if let (Proposed::Refund { comes_to, currency, .. }, Effect::Refund(refund)) = (action, &tried)
        && refund.amount.minor_units() != *comes_to
    {
        return Err(OperatorError::Refused(format!(
            "payment {payment_id} has {} {currency} left to refund now, not {comes_to} {currency}: its refunds changed \
             while the proposal was being made. Read it again",
            refund.amount
        )));
    }
    let columns = seen.columns();
    // A proposal on a dead letter that is no longer the payment's open one cannot be approved any
    // more: it makes way, as one past its expiry does.
    sqlx::query!(
        r#"
        UPDATE proposals
        SET status = 'expired', decided_at = LEAST(expires_at, now()),
            decision_note = CASE WHEN expires_at <= now() THEN NULL
                                 ELSE 'its dead letter was closed before anyone decided' END
        WHERE payment_id = $1 AND status = 'pending'
          AND (expires_at <= now() OR (seen_dead_letter_id IS NOT NULL AND seen_dead_letter_id IS DISTINCT FROM $2))
        "#,
        payment_id.as_uuid(),
        columns.dead_letter_id,
    )
    .execute(&mut *tx)
    .await
    .context("cannot expire the payment's old proposals")?;
    let inserted = sqlx::query!(
        r#"
        INSERT INTO proposals (proposal_id, tenant_id, payment_id, action, reason, seen_status, seen_event_count,
                               seen_dead_letter_id, seen_evidence_count, seen_refunds_reserved, seen_refunded,
                               seen_refund_count, refund_id, seen_refund_event_count, proposed_by, expires_at,
                               proposer_credential_by)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                now() + make_interval(secs => $16), $17)
        ON CONFLICT (payment_id) WHERE status = 'pending' DO NOTHING
        RETURNING proposal_id
        "#,
        proposal_id,
        seen.tenant_id().as_uuid(),
        payment_id.as_uuid(),
        stored,
        reason,
        columns.status as Option<PaymentStatus>,
        columns.event_count,
        columns.dead_letter_id,
        columns.evidence_count,
        columns.refunds_reserved,
        columns.refunded,
        columns.refund_count,
        columns.refund_id,
        columns.refund_event_count,
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
        .payment(seen.tenant_id(), payment_id)
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
    /// What was done to the payment or the refund.
    pub result: Effect,
}

/// Approves proposal `proposal_id` and does what it proposes, in one transaction.
pub async fn approve(
    conn: &mut PgConnection,
    by: &Account,
    source: Option<&str>,
    proposal_id: Uuid,
    note: &str,
    limits: Limits,
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
    let now = pending.seen.again(&mut tx, payment_id).await?;
    if let Some(moved) = pending.seen.moved(&now, payment_id) {
        return Err(OperatorError::Refused(moved));
    }
    let proposed: Proposed = serde_json::from_value(pending.view.action.clone())
        .with_context(|| format!("cannot read proposal {proposal_id}"))?;
    let proposer = Operator::parse(&pending.view.proposed_by)?;
    let operator = proposer.approved_by(&by.name);
    let carry = Carry {
        proposal_id,
        seen: &now,
        payment_id,
        operator: &operator,
        proposer: &proposer,
        reason: &pending.view.reason,
        limits,
        action: &pending.view.action,
    };
    let result = carry_out(&mut tx, &carry, &proposed).await?;
    decide(&mut tx, proposal_id, "approved", by, note).await?;
    let entry = Entry::new("proposal.approve", Outcome::Done)
        .payment(now.tenant_id(), payment_id)
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

/// What carrying out a proposal needs besides the action.
struct Carry<'a> {
    /// The proposal: an operator's refund is made under its key.
    proposal_id: Uuid,
    /// What it stands on, as it is now (locked).
    seen: &'a Seen,
    /// The payment.
    payment_id: PaymentId,
    /// Who does it: the proposer, with the approver once approved.
    operator: &'a Operator,
    /// Who proposed it.
    proposer: &'a Operator,
    /// The proposer's reason.
    reason: &'a str,
    limits: Limits,
    /// The action as stored.
    action: &'a Value,
}

/// Does what `proposed` says, as `carry.operator`, in the caller's transaction; the action's own
/// rules refuse what does not fit the payment or the refund now.
async fn carry_out(conn: &mut PgConnection, carry: &Carry<'_>, proposed: &Proposed) -> Result<Effect, OperatorError> {
    let (payment_id, operator, reason) = (carry.payment_id, carry.operator, carry.reason);
    let tenant_id = carry.seen.tenant_id();
    let resend_horizon = carry.limits.resend_horizon;
    match proposed {
        Proposed::Retry { outside_key_window } => {
            let retry = Retry { payment_id, operator, reason, resend_horizon, outside_key_window: *outside_key_window };
            actions::retry(conn, &retry).await.map(Effect::Payment)
        }
        Proposed::Succeeded { charge_id, amount, currency, charged_at } => {
            let charge = BookedCharge {
                charge_id: charge_id.clone(),
                amount: Amount::new(*amount).context("a stored proposal has a bad amount")?,
                currency: Currency::parse(currency).context("a stored proposal has a bad currency")?,
                charged_at: *charged_at,
            };
            actions::resolve(conn, payment_id, &Resolution::Succeeded(charge), operator, reason)
                .await
                .map(Effect::Payment)
        }
        Proposed::Failed { charge_id, force } => {
            let decision = Resolution::Failed { charge_id: charge_id.clone(), force: *force };
            actions::resolve(conn, payment_id, &decision, operator, reason).await.map(Effect::Payment)
        }
        Proposed::Refund { amount, reason: refund_reason, .. } => {
            let refund = OperatorRefund {
                proposal_id: carry.proposal_id,
                tenant_id,
                payment_id,
                amount: *amount,
                reason: *refund_reason,
                action: carry.action,
                requested_by: carry.proposer,
                operator,
                note: reason,
                retention: carry.limits.ttl,
            };
            operator_refunds::refund(conn, &refund).await.map(Effect::Refund)
        }
        Proposed::RefundSucceeded { refund_id, provider_refund_id, refunded_at } => {
            let decision = RefundResolution::Succeeded {
                provider_refund_id: provider_refund_id.clone(),
                refunded_at: *refunded_at,
            };
            dead_refunds::resolve(conn, tenant_id, *refund_id, &decision, operator, reason).await.map(Effect::Refund)
        }
        Proposed::RefundFailed { refund_id, provider_refund_id, force } => {
            let decision = RefundResolution::Failed { provider_refund_id: provider_refund_id.clone(), force: *force };
            dead_refunds::resolve(conn, tenant_id, *refund_id, &decision, operator, reason).await.map(Effect::Refund)
        }
        Proposed::RefundRetry { refund_id, outside_key_window } => {
            let retry = RefundRetry {
                tenant_id,
                refund_id: *refund_id,
                operator,
                reason,
                resend_horizon,
                outside_key_window: *outside_key_window,
            };
            dead_refunds::retry(conn, &retry).await.map(Effect::Refund)
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
    seen: Seen,
}

async fn lock_pending(conn: &mut PgConnection, by: &Account, proposal_id: Uuid) -> Result<Pending, OperatorError> {
    let row = sqlx::query!(
        r#"
        SELECT proposed_by, proposer_credential_by, seen_status AS "seen_status: PaymentStatus", seen_event_count,
               seen_dead_letter_id, seen_evidence_count, seen_refunds_reserved, seen_refunded, seen_refund_count,
               refund_id, seen_refund_event_count
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
    let columns = Columns {
        status: Some(row.seen_status),
        event_count: row.seen_event_count,
        dead_letter_id: row.seen_dead_letter_id,
        evidence_count: row.seen_evidence_count,
        refunds_reserved: row.seen_refunds_reserved,
        refunded: row.seen_refunded,
        refund_count: row.seen_refund_count,
        refund_id: row.refund_id,
        refund_event_count: row.seen_refund_event_count,
    };
    // What the payment charged never changes: it is read now, not stored with the proposal.
    let charged = sqlx::query!(
        r#"
        SELECT amount AS "amount: Amount", currency AS "currency: Currency" FROM payments
        WHERE tenant_id = $1 AND payment_id = $2
        "#,
        view.tenant_id.as_uuid(),
        view.payment_id.as_uuid(),
    )
    .fetch_one(&mut *conn)
    .await
    .context("cannot read the proposal's payment")?;
    let money = (charged.amount, charged.currency);
    let seen = Seen::of_columns(proposal_id, view.tenant_id, view.payment_id, money, columns)?;
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

fn no_payment(payment_id: PaymentId) -> OperatorError {
    OperatorError::NotFound(format!("there is no payment {payment_id}"))
}

fn proposal_not_found(proposal_id: Uuid) -> OperatorError {
    OperatorError::NotFound(format!("there is no proposal {proposal_id}"))
}

/// What carrying out an action did.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Effect {
    /// A dead letter was closed: the payment settled, or queued to be sent again.
    Payment(Resolved),
    /// A refund was accepted, settled, or queued to be sent again.
    Refund(RefundActed),
}

impl Report for Effect {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        match self {
            Self::Payment(resolved) => resolved.human(out),
            Self::Refund(acted) => acted.human(out),
        }
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn a_proposed_refund_is_stored_with_its_reasons_name_and_read_back() {
        let refund = Proposed::Refund {
            amount: Some(500),
            comes_to: 500,
            currency: "EUR".into(),
            reason: Some(RefundReason::RequestedByCustomer),
        };
        let stored = serde_json::to_value(&refund).unwrap();
        assert_eq!(
            stored,
            json!({"kind": "refund", "amount": 500, "comes_to": 500, "currency": "EUR", "reason": "requested_by_customer"})
        );
        assert_eq!(serde_json::from_value::<Proposed>(stored).unwrap(), refund);
        let unknown_reason =
            json!({"kind": "refund", "amount": null, "comes_to": 1, "currency": "EUR", "reason": "whim"});
        assert!(serde_json::from_value::<Proposed>(unknown_reason).is_err());
        let retry = Proposed::RefundRetry { refund_id: RefundId::generate(), outside_key_window: false };
        let stored = serde_json::to_value(&retry).unwrap();
        assert_eq!(stored["kind"], "refund_retry", "the kind the migration's check knows");
        assert_eq!(serde_json::from_value::<Proposed>(stored).unwrap(), retry);
    }

    #[test]
    fn refund_proposals_read_in_words() {
        let refund_id = RefundId::generate();
        let words = |proposed: Proposed| proposed.to_string();
        let refund = |amount, reason| Proposed::Refund { amount, comes_to: 1999, currency: "EUR".into(), reason };

        assert_eq!(words(refund(Some(1999), None)), "refund 1999 EUR");
        assert_eq!(
            words(refund(None, Some(RefundReason::RequestedByCustomer))),
            "refund all that is left, 1999 EUR (requested by customer)"
        );
        assert_eq!(
            words(Proposed::RefundSucceeded {
                refund_id,
                provider_refund_id: "re_1".into(),
                refunded_at: OffsetDateTime::UNIX_EPOCH
            }),
            format!("settle refund {refund_id} as succeeded with the provider's refund re_1")
        );
        assert_eq!(
            words(Proposed::RefundFailed { refund_id, provider_refund_id: None, force: true }),
            format!("settle refund {refund_id} as failed, although a refund on record says the money went back")
        );
        assert_eq!(
            words(Proposed::RefundRetry { refund_id, outside_key_window: true }),
            format!("send refund {refund_id} again, past the provider's key window")
        );
    }

    #[test]
    fn what_a_proposal_stands_on_is_stored_whole_and_read_back() {
        let payment_id = PaymentId::generate();
        let tenant_id = TenantId::generate();
        let money = (Amount::new(1999).unwrap(), Currency::parse("EUR").unwrap());
        let refunds = Seen::Refunds(RefundsSeen {
            tenant_id,
            status: PaymentStatus::Succeeded,
            event_count: 4,
            amount: money.0,
            currency: money.1,
            refunds_reserved: 500,
            refunded: 0,
            refund_count: 1,
        });
        let refund = Seen::Refund(RefundSnapshot {
            tenant_id,
            payment_id,
            payment_status: PaymentStatus::Succeeded,
            payment_event_count: 4,
            refund_id: RefundId::generate(),
            status: PaymentStatus::DeadLettered,
            event_count: 6,
        });
        let dead_letter = Seen::DeadLetter(Snapshot { tenant_id, ..seen() });

        for stood in [refunds, refund, dead_letter] {
            let read = Seen::of_columns(Uuid::nil(), tenant_id, payment_id, money, stood.columns()).unwrap();
            assert_eq!(read, stood);
            assert_eq!(stood.moved(&read, payment_id), None);
        }
        let muddled = Columns { refund_count: Some(1), ..Seen::DeadLetter(seen()).columns() };
        assert!(Seen::of_columns(Uuid::nil(), tenant_id, payment_id, money, muddled).is_err());
    }
}
