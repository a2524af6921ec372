//! Four-eyes approval: a decision that moves money is proposed by one operator and done only when a
//! second, with the approver role, approves it.
//!
//! Proposals are: settling a dead-lettered payment as succeeded or failed (forced or not), and
//! resending one past the provider's key window (and, when `operators.retries_need_approval` is
//! set, any resend); an operator's refund of a succeeded payment; settling a dead-lettered refund as
//! succeeded or failed, or resending one past the key window (or any, as for payments); and, since a
//! merchant's API key charges and refunds, creating a tenant with its first key, issuing a tenant
//! another key, and pointing a tenant at a provider account. A key is made only once its proposal is
//! approved, when its proposer collects it ([`collect_key`]), and is shown that once.
//!
//! Nobody approves their own proposal, nor one whose proposer's credential shares a maker with
//! theirs. A proposal expires, can be withdrawn by its maker or rejected by an approver, and is
//! checked again when approved: if anything happened to what it stands on (the payment's dead letter,
//! the payment's refunds, the refund, the tenant's provider account) since it was proposed, the
//! approval is refused, saying what changed, and nothing is done. Each step writes its audit row in
//! its own transaction.

use std::fmt;
use std::io::{self, Write};
use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency, format_amount};
use oncepay_domain::refund::RefundReason;
use oncepay_domain::refund_status::RefundStatus;
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
use crate::tenants::{IssuedKey, TenantView};

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
        amount: Amount,
        /// In this currency.
        currency: Currency,
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
        amount: Option<Amount>,
        /// What that came to when it was proposed, in minor units (the approval is refused if the
        /// payment's refunds changed since). Not an [`Amount`]: nothing may be left.
        comes_to: i64,
        /// In the payment's currency.
        currency: Currency,
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
    /// Create the proposal's tenant; its first API key waits for the proposer to collect.
    TenantCreate {
        /// Its name.
        name: String,
        /// Its own requests-per-second limit, if any.
        rate_limit: Option<i32>,
        /// The provider account its payments are charged to in connect mode, if any.
        provider_account: Option<String>,
    },
    /// Charge the tenant's new payments to this provider account.
    TenantConnect {
        /// The account (`acct_…`).
        account: String,
    },
    /// Issue the tenant another API key, for the proposer to collect.
    KeyIssue,
    /// Let this broker user publish the tenant's payments (its messages' `user_id`).
    BrokerUser {
        /// The broker's user name.
        user: String,
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
    /// What it will do, in words: `settle as succeeded with charge ch_1 (19.99 EUR)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retry { outside_key_window: false } => f.write_str("send again"),
            Self::Retry { outside_key_window: true } => f.write_str("send again, past the provider's key window"),
            Self::Succeeded { charge_id, amount, currency, .. } => {
                let money = format_amount(amount.minor_units(), currency.as_str());
                write!(f, "settle as succeeded with charge {charge_id} ({money})")
            }
            Self::Failed { charge_id, force } => {
                f.write_str("settle as failed")?;
                if let Some(charge_id) = charge_id {
                    write!(f, " with failed charge {charge_id}")?;
                }
                if *force { f.write_str(", although a charge on record says the money was taken") } else { Ok(()) }
            }
            Self::Refund { amount, comes_to, currency, reason } => {
                let money = format_amount(*comes_to, currency.as_str());
                match amount {
                    Some(_) => write!(f, "refund {money}")?,
                    None => write!(f, "refund all that is left, {money}")?,
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
            Self::TenantCreate { name, rate_limit, provider_account } => {
                write!(f, "create tenant {name} with its first API key")?;
                if let Some(limit) = rate_limit {
                    write!(f, ", limited to {limit} requests a second")?;
                }
                match provider_account {
                    Some(account) => write!(f, ", charged to provider account {account}"),
                    None => Ok(()),
                }
            }
            Self::TenantConnect { account } => {
                write!(f, "charge the tenant's new payments to provider account {account}")
            }
            Self::KeyIssue => f.write_str("issue the tenant another API key"),
            Self::BrokerUser { user } => write!(f, "let broker user {user} publish the tenant's payments"),
        }
    }
}

impl Proposed {
    /// Proposes to settle with `resolution` (not an acknowledgement, which needs no second operator).
    pub fn resolution(resolution: Resolution) -> Result<Self, OperatorError> {
        match resolution {
            Resolution::Succeeded(charge) => Ok(Self::Succeeded {
                charge_id: charge.charge_id,
                amount: charge.amount,
                currency: charge.currency,
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
            Self::TenantCreate { .. } => "tenant.create",
            Self::TenantConnect { .. } => "tenant.connect",
            Self::KeyIssue => "key.issue",
            Self::BrokerUser { .. } => "broker_user.map",
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
            Self::TenantCreate { .. } => Stand::NewTenant,
            Self::TenantConnect { .. } | Self::KeyIssue | Self::BrokerUser { .. } => Stand::Tenant,
        }
    }

    /// Whether its approval makes an API key for the proposer to collect.
    pub const fn issues_a_key(&self) -> bool {
        matches!(self, Self::TenantCreate { .. } | Self::KeyIssue)
    }

    /// Refuses an operator who may not propose it: what moves a payment's money takes the operator
    /// role; what gives a tenant a key or an account, an admin; a new tenant, an admin of every
    /// tenant.
    fn may_be_proposed_by(&self, by: &Account) -> Result<(), OperatorError> {
        match self {
            Self::TenantCreate { .. } => {
                by.require(Role::Admin, "create a tenant")?;
                if by.scope != Scope::Every {
                    return Err(OperatorError::Forbidden("only an admin of every tenant creates tenants".into()));
                }
                Ok(())
            }
            Self::TenantConnect { .. } => by.require(Role::Admin, "change a tenant's provider account"),
            Self::KeyIssue => by.require(Role::Admin, "issue an API key"),
            Self::BrokerUser { .. } => by.require(Role::Admin, "let a broker user publish a tenant's payments"),
            _ => by.require(Role::Operator, "propose a decision"),
        }
    }
}

/// Where a proposal stands (the `proposal_status` type). Only a decision moves it from `pending`;
/// a pending proposal past its expiry reads as `expired` before anyone stores that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "proposal_status", rename_all = "snake_case")]
pub enum ProposalStatus {
    /// Waiting for a second person.
    Pending,
    /// Approved, and carried out in the same transaction.
    Approved,
    /// Refused by an approver.
    Rejected,
    /// Taken back by its maker.
    Withdrawn,
    /// Nobody decided in time, or what it was about changed.
    Expired,
}

impl ProposalStatus {
    /// The stored name, e.g. `pending`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Withdrawn => "withdrawn",
            Self::Expired => "expired",
        }
    }
}

impl fmt::Display for ProposalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a proposal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A payment: its open dead letter, its refunds, or one of its dead-lettered refunds.
    Payment(PaymentId),
    /// A tenant, or one to be created with this id.
    Tenant(TenantId),
}

impl Subject {
    /// What a stored proposal is about: its payment, if it has one, else its tenant.
    const fn of(tenant_id: TenantId, payment_id: Option<PaymentId>) -> Self {
        match payment_id {
            Some(payment_id) => Self::Payment(payment_id),
            None => Self::Tenant(tenant_id),
        }
    }

    const fn payment_id(self) -> Option<PaymentId> {
        match self {
            Self::Payment(payment_id) => Some(payment_id),
            Self::Tenant(_) => None,
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Payment(payment_id) => write!(f, "payment {payment_id}"),
            Self::Tenant(tenant_id) => write!(f, "tenant {tenant_id}"),
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
    /// A tenant's provider account.
    Tenant,
    /// Nothing yet: the tenant is to be created, and its name and account are checked then.
    NewTenant,
}

/// A tenant as a proposal on it saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct TenantSeen {
    tenant_id: TenantId,
    name: String,
    /// The provider account its payments were charged to in connect mode; none if `None`.
    provider_account: Option<String>,
}

impl TenantSeen {
    /// Tenant `tenant_id` as it is now, locked.
    async fn read(conn: &mut PgConnection, tenant_id: TenantId) -> Result<Self, OperatorError> {
        let tenant = crate::tenants::find_by_id(conn, tenant_id).await?;
        Ok(Self {
            tenant_id,
            name: tenant.name,
            provider_account: tenant.provider_account.map(|account| account.as_str().to_owned()),
        })
    }

    /// What changed between this and `now`, in words; `None` if nothing did.
    fn changes(&self, now: &Self) -> Option<String> {
        let account = |seen: &Self| seen.provider_account.clone().unwrap_or_else(|| "none".to_owned());
        (self.provider_account != now.provider_account)
            .then(|| format!("its provider account was {} and is now {}", account(self), account(now)))
    }
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
    /// A tenant and its provider account.
    Tenant(TenantSeen),
    /// A tenant to be created.
    NewTenant(TenantId),
}

impl Seen {
    /// Reads what `stand` names on `subject`, locked, if `scope` may see it.
    async fn read(
        conn: &mut PgConnection,
        scope: &Scope,
        subject: Subject,
        stand: Stand,
    ) -> Result<Self, OperatorError> {
        let tenants = scope.to_column();
        match (subject, stand) {
            (Subject::Payment(payment_id), Stand::DeadLetter) => {
                Ok(Self::DeadLetter(queries::snapshot(conn, payment_id).await?))
            }
            (Subject::Payment(payment_id), Stand::Refunds) => {
                let tenant_id = queries::payment_tenant(conn, tenants.as_deref(), payment_id)
                    .await?
                    .ok_or_else(|| no_payment(payment_id))?;
                Ok(Self::Refunds(operator_refunds::seen(conn, tenant_id, payment_id).await?))
            }
            (Subject::Payment(payment_id), Stand::Refund(refund_id)) => {
                let (tenant_id, of_payment, _) = dead_refunds::locate(conn, tenants.as_deref(), refund_id).await?;
                if of_payment != payment_id {
                    return Err(OperatorError::NotFound(format!("payment {payment_id} has no refund {refund_id}")));
                }
                Ok(Self::Refund(dead_refunds::snapshot(conn, tenant_id, refund_id).await?))
            }
            (Subject::Tenant(tenant_id), Stand::Tenant) => Ok(Self::Tenant(TenantSeen::read(conn, tenant_id).await?)),
            (Subject::Tenant(tenant_id), Stand::NewTenant) => Ok(Self::NewTenant(tenant_id)),
            _ => Err(OperatorError::Invalid(format!("this cannot be proposed on {subject}"))),
        }
    }

    /// The same thing as it is now, locked, for an approval.
    async fn again(&self, conn: &mut PgConnection, subject: Subject) -> Result<Self, OperatorError> {
        match (self, subject) {
            (Self::DeadLetter(_), Subject::Payment(payment_id)) => match queries::snapshot(conn, payment_id).await {
                Ok(now) => Ok(Self::DeadLetter(now)),
                Err(OperatorError::NotFound(_)) => Err(OperatorError::Refused(format!(
                    "payment {payment_id} has no open dead letter any more: someone settled or retried it since the \
                     proposal; nothing was done"
                ))),
                Err(other) => Err(other),
            },
            (Self::Refunds(seen), Subject::Payment(payment_id)) => {
                Ok(Self::Refunds(operator_refunds::seen(conn, seen.tenant_id, payment_id).await?))
            }
            (Self::Refund(seen), _) => {
                Ok(Self::Refund(dead_refunds::snapshot(conn, seen.tenant_id, seen.refund_id).await?))
            }
            (Self::Tenant(seen), _) => Ok(Self::Tenant(TenantSeen::read(conn, seen.tenant_id).await?)),
            (Self::NewTenant(tenant_id), _) => Ok(Self::NewTenant(*tenant_id)),
            (Self::DeadLetter(_) | Self::Refunds(_), Subject::Tenant(_)) => {
                Err(OperatorError::Failed(anyhow::anyhow!("a proposal on a payment is stored without its payment")))
            }
        }
    }

    const fn tenant_id(&self) -> TenantId {
        match self {
            Self::DeadLetter(seen) => seen.tenant_id,
            Self::Refunds(seen) => seen.tenant_id,
            Self::Refund(seen) => seen.tenant_id,
            Self::Tenant(seen) => seen.tenant_id,
            Self::NewTenant(tenant_id) => *tenant_id,
        }
    }

    /// Refuses a proposal that what it stands on cannot take now.
    fn refuse_closed(&self, subject: Subject) -> Result<(), OperatorError> {
        match self {
            Self::DeadLetter(seen) if seen.status.is_terminal() => Err(OperatorError::Refused(format!(
                "{subject} is {}, and a terminal payment never changes: acknowledge the conflict instead",
                seen.status.as_str()
            ))),
            Self::Refund(seen) => dead_refunds::require_dead_lettered(seen.refund_id, seen.status),
            Self::DeadLetter(_) | Self::Refunds(_) | Self::Tenant(_) | Self::NewTenant(_) => Ok(()),
        }
    }

    /// Why an approval is refused because of what changed between this and `now`; `None` if
    /// nothing did.
    fn moved(&self, now: &Self, on: Subject) -> Option<String> {
        let (subject, changes) = match (self, now) {
            (Self::DeadLetter(seen), Self::DeadLetter(now)) => (format!("{on} moved"), changes(seen, now)),
            (Self::Refunds(seen), Self::Refunds(now)) => (format!("the refunds of {on} changed"), seen.changes(now)),
            (Self::Refund(seen), Self::Refund(now)) => (format!("refund {} moved", seen.refund_id), seen.changes(now)),
            (Self::Tenant(seen), Self::Tenant(now)) => (format!("tenant {} changed", seen.name), seen.changes(now)),
            (Self::NewTenant(_), Self::NewTenant(_)) => return None,
            _ => (format!("{on} changed"), Some("it stands on something else".to_owned())),
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
                (columns.status, columns.event_count) = (Some(seen.status), Some(seen.event_count));
                columns.dead_letter_id = Some(seen.dead_letter_id);
                columns.evidence_count = Some(seen.evidence_count);
            }
            Self::Refunds(seen) => {
                (columns.status, columns.event_count) = (Some(seen.status), Some(seen.event_count));
                columns.refunds_reserved = Some(seen.refunds_reserved);
                columns.refunded = Some(seen.refunded);
                columns.refund_count = Some(seen.refund_count);
            }
            Self::Refund(seen) => {
                (columns.status, columns.event_count) = (Some(seen.payment_status), Some(seen.payment_event_count));
                columns.refund_id = Some(seen.refund_id.as_uuid());
                columns.refund_event_count = Some(seen.event_count);
            }
            Self::Tenant(seen) => columns.provider_account.clone_from(&seen.provider_account),
            Self::NewTenant(_) => {}
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
        let status = columns.status.context("a stored proposal on a payment has no status")?;
        let event_count = columns.event_count.context("a stored proposal on a payment has no history count")?;
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
                status: RefundStatus::DeadLettered,
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

/// The `seen_*` columns of `proposals` (migrations/0240, 0310, 0351): the payment's, then each kind's
/// own.
#[derive(Debug, Clone, Default)]
struct Columns {
    status: Option<PaymentStatus>,
    event_count: Option<i32>,
    dead_letter_id: Option<i64>,
    evidence_count: Option<i32>,
    refunds_reserved: Option<i64>,
    refunded: Option<i64>,
    refund_count: Option<i32>,
    refund_id: Option<Uuid>,
    refund_event_count: Option<i32>,
    provider_account: Option<String>,
}

/// A proposal as operators see it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProposalView {
    /// Its id.
    pub proposal_id: Uuid,
    /// The tenant it is about, or the payment's.
    pub tenant_id: TenantId,
    /// That tenant's name (for a tenant to be created, the name it will have).
    pub tenant: Option<String>,
    /// The payment it is about; none for a proposal on a tenant.
    pub payment_id: Option<PaymentId>,
    /// What it will do.
    pub action: Value,
    /// Why, in the proposer's words.
    pub reason: String,
    /// Where it stands.
    pub status: ProposalStatus,
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
    /// When its proposer collected the API key its approval made, if it made one.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub key_collected_at: Option<OffsetDateTime>,
}

impl ProposalView {
    /// What it is about, in words: `payment 0190…` or `tenant acme`.
    pub fn about(&self) -> String {
        match (self.payment_id, &self.tenant) {
            (Some(payment_id), _) => format!("payment {payment_id}"),
            (None, Some(name)) => format!("tenant {name}"),
            (None, None) => format!("tenant {}", self.tenant_id),
        }
    }
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

/// Proposes `action` on `subject` (a payment's open dead letter, its refunds, or one of its
/// dead-lettered refunds; a tenant, or one to create), to wait for an approver. Refused while another
/// proposal waits for the same payment or tenant, and refused at once when the action's own rules
/// would refuse it now: it is tried, and undone, before it is proposed.
pub async fn propose(
    conn: &mut PgConnection,
    by: &Account,
    source: Option<&str>,
    subject: Subject,
    action: &Proposed,
    reason: &str,
    limits: Limits,
) -> Result<ProposalView, OperatorError> {
    action.may_be_proposed_by(by)?;
    let reason = require_reason(reason)?;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let seen = Seen::read(&mut tx, &by.scope, subject, action.stand()).await?;
    let hidden = || match (subject, action.stand()) {
        (Subject::Payment(payment_id), Stand::DeadLetter) => not_found(payment_id),
        (Subject::Payment(payment_id), _) => no_payment(payment_id),
        (Subject::Tenant(tenant_id), _) => OperatorError::NotFound(format!("there is no tenant {tenant_id}")),
    };
    by.see(seen.tenant_id(), hidden)?;
    seen.refuse_closed(subject)?;
    let proposal_id = Uuid::now_v7();
    let stored = serde_json::to_value(action).context("cannot store the proposal")?;
    let operator = by.actor()?;
    let carry = Carry {
        proposal_id,
        seen: &seen,
        subject,
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
            "{subject} has {} left to refund now, not {}: its refunds changed while the proposal was being made. \
             Read it again",
            format_amount(refund.amount.minor_units(), currency.as_str()),
            format_amount(*comes_to, currency.as_str())
        )));
    }
    expire_stale(&mut tx, &seen, subject).await?;
    let inserted = insert(&mut tx, &carry, by).await?;
    if inserted.is_none() {
        return Err(OperatorError::Refused(format!(
            "another proposal already waits for {subject}: approve, reject or withdraw it first (GET /v1/proposals)"
        )));
    }
    let entry = Entry::new(action.audit_action(), Outcome::Proposed)
        .on(seen.tenant_id(), subject.payment_id())
        .proposal(proposal_id)
        .reason(reason)
        .before(json!(seen))
        .detail(stored);
    audit::record(&mut tx, &Actor::of(by, source), &entry).await?;
    let view = read(&mut tx, proposal_id).await?;
    tx.commit().await.context("cannot commit the proposal")?;
    Ok(view)
}

/// Marks the waiting proposals on `subject`'s payment (or tenant) that can no longer be approved
/// as expired: one past its expiry, or on a dead letter that is no longer the payment's open one.
/// They make way for a new one.
async fn expire_stale(tx: &mut PgConnection, seen: &Seen, subject: Subject) -> Result<(), OperatorError> {
    let columns = seen.columns();
    let payment_id = subject.payment_id().map(|p| p.as_uuid());
    sqlx::query!(
        r#"
        UPDATE proposals
        SET status = 'expired', decided_at = LEAST(expires_at, now()),
            decision_note = CASE WHEN expires_at <= now() THEN NULL
                                 ELSE 'its dead letter was closed before anyone decided' END
        WHERE status = 'pending'
          AND CASE WHEN $1::uuid IS NULL THEN payment_id IS NULL AND tenant_id = $3 ELSE payment_id = $1 END
          AND (expires_at <= now() OR (seen_dead_letter_id IS NOT NULL AND seen_dead_letter_id IS DISTINCT FROM $2))
        "#,
        payment_id,
        columns.dead_letter_id,
        seen.tenant_id().as_uuid(),
    )
    .execute(tx)
    .await
    .context("cannot expire the old proposals")?;
    Ok(())
}

/// Stores the proposal `carry` describes, made by `by`, with what its proposer saw; `None` when
/// another proposal already waits for the same payment or tenant.
async fn insert(tx: &mut PgConnection, carry: &Carry<'_>, by: &Account) -> Result<Option<Uuid>, OperatorError> {
    let Carry { proposal_id, seen, subject, reason, limits, action: stored, .. } = *carry;
    let columns = seen.columns();
    let payment_id = subject.payment_id().map(|p| p.as_uuid());
    // Any unique index refuses it: one waiting proposal per payment, and per tenant.
    let inserted = sqlx::query_scalar!(
        r#"
        INSERT INTO proposals (proposal_id, tenant_id, payment_id, action, reason, seen_status, seen_event_count,
                               seen_dead_letter_id, seen_evidence_count, seen_refunds_reserved, seen_refunded,
                               seen_refund_count, refund_id, seen_refund_event_count, proposed_by, expires_at,
                               proposer_credential_by, seen_provider_account)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                now() + make_interval(secs => $16), $17, $18)
        ON CONFLICT DO NOTHING
        RETURNING proposal_id
        "#,
        proposal_id,
        seen.tenant_id().as_uuid(),
        payment_id,
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
        columns.provider_account,
    )
    .fetch_optional(tx)
    .await
    .context("cannot store the proposal")?;
    Ok(inserted)
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
    let proposer = Credential {
        operator: pending.proposed_by_id,
        made_by: pending.proposer_credential_by.unwrap_or(pending.proposed_by_id),
    };
    if proposer.shares_a_holder_with(&Credential { operator: by.operator_id, made_by: by.made_by }) {
        return Err(OperatorError::Forbidden(format!(
            "proposal {proposal_id} cannot be approved with this credential: one of you made the other's \
             credential, or the same person made both, so one person could stand behind both sides. Approve with a \
             credential you made yourself (a password you set, a token you issued with it, or a sign-in at the \
             OpenID provider), to a proposal made the same way"
        )));
    }
    let subject = pending.subject;
    let now = pending.seen.again(&mut tx, subject).await?;
    if let Some(moved) = pending.seen.moved(&now, subject) {
        return Err(OperatorError::Refused(moved));
    }
    let proposer = Operator::parse(&pending.view.proposed_by)?;
    let operator = proposer.approved_by(&by.name);
    let carry = Carry {
        proposal_id,
        seen: &now,
        subject,
        operator: &operator,
        proposer: &proposer,
        reason: &pending.view.reason,
        limits,
        action: &pending.view.action,
    };
    let result = carry_out(&mut tx, &carry, &pending.proposed).await?;
    decide(&mut tx, proposal_id, ProposalStatus::Approved, by, note).await?;
    let entry = Entry::new("proposal.approve", Outcome::Done)
        .on(now.tenant_id(), subject.payment_id())
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

/// Makes the API key an approved `key_issue` or `tenant_create` proposal allows, for its proposer
/// alone, once, within `limits.ttl` of the approval, and records it under the tenant with both
/// people's names. The key is shown in the response and never again: only its hash is stored.
pub async fn collect_key(
    conn: &mut PgConnection,
    by: &Account,
    source: Option<&str>,
    proposal_id: Uuid,
    limits: Limits,
) -> Result<IssuedKey, OperatorError> {
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let row = sqlx::query!(
        r#"
        SELECT p.tenant_id AS "tenant_id: TenantId", p.action, p.reason, p.status AS "status: ProposalStatus", p.proposed_by,
               m.name AS proposer, d.name AS "approver?", p.key_collected_at,
               COALESCE(p.decided_at + make_interval(secs => $2) < now(), false) AS "too_late!"
        FROM proposals p
        JOIN operators m ON m.operator_id = p.proposed_by
        LEFT JOIN operators d ON d.operator_id = p.decided_by
        WHERE p.proposal_id = $1
        FOR UPDATE OF p
        "#,
        proposal_id,
        limits.ttl.as_secs_f64(),
    )
    .fetch_optional(&mut *tx)
    .await
    .context("cannot read the proposal")?
    .ok_or_else(|| proposal_not_found(proposal_id))?;
    by.see(row.tenant_id, || proposal_not_found(proposal_id))?;
    let proposed: Proposed =
        serde_json::from_value(row.action).with_context(|| format!("cannot read proposal {proposal_id}"))?;
    if !proposed.issues_a_key() {
        return Err(OperatorError::Refused(format!("proposal {proposal_id} makes no API key")));
    }
    if row.proposed_by != by.operator_id {
        return Err(OperatorError::Forbidden(format!(
            "only {}, who proposed it, collects the API key of proposal {proposal_id}: it is shown once, to them alone",
            row.proposer
        )));
    }
    by.require(Role::Admin, "collect an API key")?;
    if row.status != ProposalStatus::Approved {
        return Err(OperatorError::Refused(format!(
            "proposal {proposal_id} is {}: its key can be collected once a second operator approves it",
            row.status
        )));
    }
    if let Some(at) = row.key_collected_at {
        return Err(OperatorError::Refused(format!(
            "the API key of proposal {proposal_id} was collected at {}, and is shown only once. If it was lost, \
             revoke it and propose another",
            render::timestamp(at)
        )));
    }
    if row.too_late {
        return Err(OperatorError::Refused(format!(
            "proposal {proposal_id} was approved too long ago for its key to be collected: propose another"
        )));
    }
    let issued = crate::tenants::issue_key(&mut tx, row.tenant_id).await?;
    sqlx::query!(
        "UPDATE proposals SET key_id = $2, key_collected_at = now() WHERE proposal_id = $1",
        proposal_id,
        issued.key_id,
    )
    .execute(&mut *tx)
    .await
    .context("cannot record that the key was collected")?;
    let entry = Entry::new("key.issue", Outcome::Done)
        .on(row.tenant_id, None)
        .proposal(proposal_id)
        .reason(&row.reason)
        .after(json!({ "tenant": issued.tenant.name, "key_id": issued.key_id }))
        .detail(json!({ "proposed_by": row.proposer, "approved_by": row.approver }));
    audit::record(&mut tx, &Actor::of(by, source), &entry).await?;
    tx.commit().await.context("cannot commit the key")?;
    Ok(issued)
}

/// A credential an operator acts with, and who made it. Whoever makes a credential can act with it,
/// so its holders are its operator and its maker.
#[derive(Debug, Clone, Copy)]
struct Credential {
    operator: Uuid,
    made_by: Uuid,
}

impl Credential {
    /// Whether one person could hold both credentials: the two sides of an approval must not be one
    /// person's.
    fn shares_a_holder_with(&self, other: &Self) -> bool {
        let holders = [self.operator, self.made_by];
        holders.contains(&other.operator) || holders.contains(&other.made_by)
    }
}

/// What carrying out a proposal needs besides the action.
struct Carry<'a> {
    /// The proposal: an operator's refund is made under its key.
    proposal_id: Uuid,
    /// What it stands on, as it is now (locked).
    seen: &'a Seen,
    /// What it is about.
    subject: Subject,
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
/// rules refuse what does not fit the payment, the refund or the tenant now.
async fn carry_out(conn: &mut PgConnection, carry: &Carry<'_>, proposed: &Proposed) -> Result<Effect, OperatorError> {
    match carry.subject {
        Subject::Payment(payment_id) => carry_out_on_payment(conn, carry, payment_id, proposed).await,
        Subject::Tenant(tenant_id) => carry_out_on_tenant(conn, carry, tenant_id, proposed).await,
    }
}

/// What a proposal on a tenant that was carried out did.
#[derive(Debug, Serialize, Deserialize)]
pub struct TenantActed {
    /// The tenant, as it is now.
    pub tenant: TenantView,
    /// The proposal whose proposer collects the API key it made, once (`POST
    /// /v1/proposals/{id}/key`); none when it made no key.
    pub key_to_collect: Option<Uuid>,
}

impl Report for TenantActed {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let tenant = &self.tenant;
        match &tenant.provider_account {
            Some(account) => writeln!(out, "tenant {} is charged through provider account {account}", tenant.name)?,
            None => writeln!(out, "tenant {} has no provider account", tenant.name)?,
        }
        if let Some(proposal_id) = self.key_to_collect {
            writeln!(
                out,
                "its new API key waits for the proposer, who collects it once: oncepay-reconciler keys collect \
                 {proposal_id}"
            )?;
        }
        Ok(())
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

/// Does what `proposed` says to tenant `tenant_id`. A key is not made here: its proposer collects it
/// ([`collect_key`]), so that nobody else ever sees it.
async fn carry_out_on_tenant(
    conn: &mut PgConnection,
    carry: &Carry<'_>,
    tenant_id: TenantId,
    proposed: &Proposed,
) -> Result<Effect, OperatorError> {
    let tenant = match proposed {
        Proposed::TenantCreate { name, rate_limit, provider_account } => {
            crate::tenants::create(conn, tenant_id, name, *rate_limit, provider_account.as_deref()).await?
        }
        Proposed::TenantConnect { account } => crate::tenants::connect(conn, tenant_id, Some(account)).await?,
        Proposed::KeyIssue => TenantView::from(&crate::tenants::find_by_id(conn, tenant_id).await?),
        Proposed::BrokerUser { user } => crate::tenants::map_broker_user(conn, tenant_id, user).await?,
        _ => return Err(OperatorError::Failed(anyhow::anyhow!("a proposal on a payment is stored on a tenant"))),
    };
    let key_to_collect = proposed.issues_a_key().then_some(carry.proposal_id);
    Ok(Effect::Tenant(TenantActed { tenant, key_to_collect }))
}

/// Does what `proposed` says to payment `payment_id`.
async fn carry_out_on_payment(
    conn: &mut PgConnection,
    carry: &Carry<'_>,
    payment_id: PaymentId,
    proposed: &Proposed,
) -> Result<Effect, OperatorError> {
    let (operator, reason) = (carry.operator, carry.reason);
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
                amount: *amount,
                currency: *currency,
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
        Proposed::TenantCreate { .. }
        | Proposed::TenantConnect { .. }
        | Proposed::KeyIssue
        | Proposed::BrokerUser { .. } => {
            Err(OperatorError::Failed(anyhow::anyhow!("a proposal on a tenant is stored on a payment")))
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
        .on(pending.view.tenant_id, pending.view.payment_id)
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
    const fn status(self) -> ProposalStatus {
        match self {
            Self::Reject => ProposalStatus::Rejected,
            Self::Withdraw => ProposalStatus::Withdrawn,
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
    status: Option<ProposalStatus>,
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
    status: Option<ProposalStatus>,
) -> Result<Vec<ProposalView>, OperatorError> {
    let tenants = scope.to_column();
    let rows = sqlx::query_as!(
        ProposalView,
        r#"
        SELECT p.proposal_id, p.tenant_id AS "tenant_id: TenantId", COALESCE(t.name, p.action->>'name') AS tenant,
               p.payment_id AS "payment_id?: PaymentId", p.action, p.reason, s.status AS "status!: ProposalStatus",
               m.name AS proposed_by, p.proposed_at, p.expires_at, d.name AS "decided_by?", p.decided_at,
               p.decision_note, p.key_collected_at
        FROM proposals p
        CROSS JOIN LATERAL (
            SELECT CASE WHEN p.status = 'pending' AND p.expires_at <= now() THEN 'expired' ELSE p.status END
                AS status
        ) s
        JOIN operators m ON m.operator_id = p.proposed_by
        LEFT JOIN operators d ON d.operator_id = p.decided_by
        LEFT JOIN tenants t ON t.tenant_id = p.tenant_id
        WHERE ($1::uuid[] IS NULL OR p.tenant_id = ANY ($1))
          AND ($2::uuid IS NULL OR p.payment_id = $2)
          AND ($3::uuid IS NULL OR p.proposal_id = $3)
          AND ($4::proposal_status IS NULL OR s.status = $4)
        ORDER BY p.proposed_at DESC
        LIMIT 500
        "#,
        tenants.as_deref(),
        payment_id.map(|p| p.as_uuid()),
        proposal_id,
        status as Option<ProposalStatus>,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the proposals")?;
    Ok(rows)
}

/// A pending, unexpired proposal the operator may see, locked.
struct Pending {
    view: ProposalView,
    /// What it is about.
    subject: Subject,
    /// What it will do.
    proposed: Proposed,
    proposed_by_id: Uuid,
    /// Who made the credential the proposal was made with.
    proposer_credential_by: Option<Uuid>,
    seen: Seen,
}

async fn lock_pending(conn: &mut PgConnection, by: &Account, proposal_id: Uuid) -> Result<Pending, OperatorError> {
    let row = sqlx::query!(
        r#"
        SELECT proposed_by, proposer_credential_by, seen_status AS "seen_status?: PaymentStatus",
               seen_event_count, seen_dead_letter_id, seen_evidence_count, seen_refunds_reserved, seen_refunded,
               seen_refund_count, refund_id, seen_refund_event_count, seen_provider_account
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
    match view.status {
        ProposalStatus::Pending => {}
        ProposalStatus::Expired => {
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
    let proposed: Proposed =
        serde_json::from_value(view.action.clone()).with_context(|| format!("cannot read proposal {proposal_id}"))?;
    let subject = Subject::of(view.tenant_id, view.payment_id);
    let seen = match (subject, proposed.stand()) {
        (Subject::Tenant(tenant_id), Stand::NewTenant) => Seen::NewTenant(tenant_id),
        (Subject::Tenant(tenant_id), _) => Seen::Tenant(TenantSeen {
            tenant_id,
            name: view.tenant.clone().unwrap_or_else(|| tenant_id.to_string()),
            provider_account: row.seen_provider_account,
        }),
        (Subject::Payment(payment_id), _) => {
            let columns = Columns {
                status: row.seen_status,
                event_count: row.seen_event_count,
                dead_letter_id: row.seen_dead_letter_id,
                evidence_count: row.seen_evidence_count,
                refunds_reserved: row.seen_refunds_reserved,
                refunded: row.seen_refunded,
                refund_count: row.seen_refund_count,
                refund_id: row.refund_id,
                refund_event_count: row.seen_refund_event_count,
                provider_account: None,
            };
            // What the payment charged never changes: it is read now, not stored with the proposal.
            let charged = sqlx::query!(
                r#"
                SELECT amount AS "amount: Amount", currency AS "currency: Currency" FROM payments
                WHERE tenant_id = $1 AND payment_id = $2
                "#,
                view.tenant_id.as_uuid(),
                payment_id.as_uuid(),
            )
            .fetch_one(&mut *conn)
            .await
            .context("cannot read the proposal's payment")?;
            let money = (charged.amount, charged.currency);
            Seen::of_columns(proposal_id, view.tenant_id, payment_id, money, columns)?
        }
    };
    let (proposed_by_id, proposer_credential_by) = (row.proposed_by, row.proposer_credential_by);
    Ok(Pending { view, subject, proposed, proposed_by_id, proposer_credential_by, seen })
}

async fn decide(
    conn: &mut PgConnection,
    proposal_id: Uuid,
    status: ProposalStatus,
    by: &Account,
    note: &str,
) -> Result<(), OperatorError> {
    sqlx::query!(
        r#"
        UPDATE proposals SET status = $2, decided_by = $3, decided_at = now(), decision_note = $4
        WHERE proposal_id = $1 AND status = 'pending'
        "#,
        proposal_id,
        status as ProposalStatus,
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
    /// A tenant was created or connected, or a key made ready for its proposer.
    Tenant(TenantActed),
}

impl Report for Effect {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        match self {
            Self::Payment(resolved) => resolved.human(out),
            Self::Refund(acted) => acted.human(out),
            Self::Tenant(acted) => acted.human(out),
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
    fn two_credentials_that_one_person_could_hold_share_a_holder() {
        let [alice, bob, root] = [Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3)];
        let own = |operator| Credential { operator, made_by: operator };
        let given = |operator, made_by| Credential { operator, made_by };
        let cases = [
            (own(alice), own(bob), false),
            (own(alice), own(alice), true),
            (given(alice, root), own(bob), false),
            (given(alice, bob), own(bob), true),
            (own(alice), given(bob, alice), true),
            (given(alice, root), given(bob, root), true),
            (given(alice, root), given(bob, alice), true),
        ];
        for (proposer, approver, shared) in cases {
            assert_eq!(proposer.shares_a_holder_with(&approver), shared, "{proposer:?} and {approver:?}");
            assert_eq!(approver.shares_a_holder_with(&proposer), shared, "{approver:?} and {proposer:?}");
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
            amount: Some(Amount::new(500).unwrap()),
            comes_to: 500,
            currency: Currency::parse("EUR").unwrap(),
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
        let eur = Currency::parse("EUR").unwrap();
        let refund = |amount, reason| Proposed::Refund { amount, comes_to: 1999, currency: eur, reason };

        assert_eq!(words(refund(Some(Amount::new(1999).unwrap()), None)), "refund 19.99 EUR");
        assert_eq!(
            words(refund(None, Some(RefundReason::RequestedByCustomer))),
            "refund all that is left, 19.99 EUR (requested by customer)"
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
    fn tenant_proposals_are_stored_with_the_kinds_the_migration_knows_and_read_in_words() {
        let create = Proposed::TenantCreate {
            name: "initech".into(),
            rate_limit: Some(50),
            provider_account: Some("acct_1".into()),
        };
        let connect = Proposed::TenantConnect { account: "acct_2".into() };
        for (proposed, kind) in
            [(&create, "tenant_create"), (&connect, "tenant_connect"), (&Proposed::KeyIssue, "key_issue")]
        {
            let stored = serde_json::to_value(proposed).unwrap();
            assert_eq!(stored["kind"], kind);
            assert_eq!(&serde_json::from_value::<Proposed>(stored).unwrap(), proposed);
        }
        assert_eq!(
            create.to_string(),
            "create tenant initech with its first API key, limited to 50 requests a second, charged to provider account \
             acct_1"
        );
        assert_eq!(connect.to_string(), "charge the tenant's new payments to provider account acct_2");
        assert!(create.issues_a_key() && Proposed::KeyIssue.issues_a_key() && !connect.issues_a_key());
    }

    #[test]
    fn a_tenants_provider_account_that_changed_refuses_the_approval() {
        let seen = TenantSeen { tenant_id: TenantId::generate(), name: "acme".into(), provider_account: None };
        let now = TenantSeen { provider_account: Some("acct_2".into()), ..seen.clone() };
        let subject = Subject::Tenant(seen.tenant_id);

        assert_eq!(Seen::Tenant(seen.clone()).moved(&Seen::Tenant(seen.clone()), subject), None);
        let moved = Seen::Tenant(seen).moved(&Seen::Tenant(now), subject).unwrap();
        assert!(
            moved.starts_with(
                "tenant acme changed since it was proposed (its provider account was none and is now acct_2)"
            ),
            "{moved}"
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
            status: RefundStatus::DeadLettered,
            event_count: 6,
        });
        let dead_letter = Seen::DeadLetter(Snapshot { tenant_id, ..seen() });

        for stood in [refunds, refund, dead_letter] {
            let read = Seen::of_columns(Uuid::nil(), tenant_id, payment_id, money, stood.columns()).unwrap();
            assert_eq!(read, stood);
            assert_eq!(stood.moved(&read, Subject::Payment(payment_id)), None);
        }
        let muddled = Columns { refund_count: Some(1), ..Seen::DeadLetter(seen()).columns() };
        assert!(Seen::of_columns(Uuid::nil(), tenant_id, payment_id, money, muddled).is_err());
    }
}
