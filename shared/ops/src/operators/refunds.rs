//! An operator's refund of a succeeded payment: what the proposer saw of the payment's refunds
//! ([`RefundsSeen`]), checked again when it is approved, and the refund itself ([`refund`]),
//! accepted by the same intake as a merchant's (`oncepay_store::refunds::intake`) under the key
//! `proposal-<proposal id>`, so that an approval carried out twice refunds once. Also a payment's
//! refunds as operators read them ([`of_payment`]).
//!
//! Who may refund, and when, is decided in [`super::proposals`]; nothing here checks a role.

use std::io::{self, Write};
use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency, format_amount};
use oncepay_domain::refund::{RefundReason, RefundRequest};
use oncepay_domain::refund_status::RefundStatus;
use oncepay_domain::status::PaymentStatus;
use oncepay_store::refunds::intake::{self, NewRefund, RefundIntake, Refusal};
use oncepay_store::refunds::{self, Refund};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgConnection;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::dead_letters::actions::Operator;
use crate::dead_letters::refunds::{self as dead_refunds, RefundActed, RefundDone};
use crate::operator_error::OperatorError;
use crate::render::{self, Table};

/// A succeeded payment's refunds as the proposer of a refund saw them: enough to tell later whether
/// a refund was accepted, failed or succeeded since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefundsSeen {
    /// The payment's tenant.
    pub tenant_id: TenantId,
    /// Its status.
    pub status: PaymentStatus,
    /// How many rows its history has.
    pub event_count: i32,
    /// What it charged.
    pub amount: Amount,
    /// In this currency.
    pub currency: Currency,
    /// What its refunds that are not `failed` add up to.
    pub refunds_reserved: i64,
    /// What its `succeeded` refunds add up to.
    pub refunded: i64,
    /// How many refunds it has.
    pub refund_count: i32,
}

impl RefundsSeen {
    /// What is left to refund, in minor units.
    pub const fn left(&self) -> i64 {
        self.amount.minor_units() - self.refunds_reserved
    }

    /// What is different between this and `now`, in words; `None` if nothing.
    pub fn changes(&self, now: &Self) -> Option<String> {
        let mut changes = Vec::new();
        if self.status != now.status {
            changes.push(format!("it was {} and is now {}", self.status.as_str(), now.status.as_str()));
        }
        if now.refund_count > self.refund_count {
            let more = now.refund_count - self.refund_count;
            let refunds = if more == 1 { "1 more refund was".to_owned() } else { format!("{more} more refunds were") };
            changes.push(format!("{refunds} accepted"));
        }
        let money = |minor_units: i64| format_amount(minor_units, now.currency.as_str());
        if now.refunds_reserved != self.refunds_reserved {
            changes.push(format!(
                "what it has promised back went from {} to {}",
                money(self.refunds_reserved),
                money(now.refunds_reserved)
            ));
        }
        if now.refunded != self.refunded {
            changes.push(format!(
                "what it has given back went from {} to {}",
                money(self.refunded),
                money(now.refunded)
            ));
        }
        (!changes.is_empty()).then(|| changes.join("; "))
    }
}

/// The payment's refunds, with the payment's row locked until the caller's transaction ends: what
/// is left to refund cannot change meanwhile.
pub async fn seen(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<RefundsSeen, OperatorError> {
    let row = sqlx::query_as!(
        RefundsSeen,
        r#"
        SELECT p.tenant_id AS "tenant_id: TenantId", p.status AS "status: PaymentStatus", p.event_count,
               p.amount AS "amount: Amount", p.currency AS "currency: Currency", p.refunds_reserved, p.refunded,
               (SELECT count(*)::int FROM refunds r WHERE r.tenant_id = $1 AND r.payment_id = $2) AS "refund_count!"
        FROM payments p
        WHERE p.tenant_id = $1 AND p.payment_id = $2
        FOR UPDATE OF p
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the payment's refunds")?;
    row.ok_or_else(|| OperatorError::NotFound(format!("there is no payment {payment_id}")))
}

/// An operator's refund to make.
#[derive(Debug, Clone)]
pub struct OperatorRefund<'a> {
    /// The proposal it carries out: its key is `proposal-<id>`.
    pub proposal_id: Uuid,
    /// The payment's tenant.
    pub tenant_id: TenantId,
    /// The succeeded payment.
    pub payment_id: PaymentId,
    /// How much, in minor units; `None` gives back all that is left.
    pub amount: Option<Amount>,
    /// Why, in the provider's words.
    pub reason: Option<RefundReason>,
    /// The proposal's action as stored: what the refund's key is a fingerprint of.
    pub action: &'a Value,
    /// Who asked for it: recorded as the refund's `requested_by`.
    pub requested_by: &'a Operator,
    /// Who carries it out: the proposer, approved by the approver.
    pub operator: &'a Operator,
    /// Why.
    pub note: &'a str,
    /// How long the refund's key is kept (at least; never while the refund is not final).
    pub retention: Duration,
}

/// The idempotency key of the refund that proposal `proposal_id` makes.
fn key_of(proposal_id: Uuid) -> Result<IdempotencyKey, OperatorError> {
    IdempotencyKey::parse(format!("proposal-{proposal_id}").as_bytes())
        .context("a proposal's id does not make an idempotency key")
        .map_err(OperatorError::Failed)
}

/// Makes the refund through the merchants' intake, in the caller's transaction (a savepoint of
/// it): accepted `pending` with its outbox row, for the worker to send. Made once per proposal:
/// carried out again, it finds the refund its key already made. Refused, with nothing written, when
/// the intake refuses it (the payment is not succeeded, nothing or too little is left).
pub async fn refund(conn: &mut PgConnection, asked: &OperatorRefund<'_>) -> Result<RefundActed, OperatorError> {
    let key = key_of(asked.proposal_id)?;
    let request = RefundRequest { amount: asked.amount, reason: asked.reason, metadata: Default::default() };
    let fingerprint = Fingerprint::of("POST", &format!("/v1/proposals/{}/approve", asked.proposal_id), asked.action);
    let new = NewRefund {
        tenant_id: asked.tenant_id,
        payment_id: asked.payment_id,
        refund_id: RefundId::generate(),
        key: &key,
        fingerprint,
        request: &request,
        requested_by: asked.requested_by.actor(),
        retention: asked.retention,
        trace: None,
    };
    let accepted = intake::accept(conn, &new).await.context("cannot accept the refund")?;
    let refund = match accepted {
        RefundIntake::Created { refund, .. } => *refund,
        RefundIntake::Existing(existing) if existing.fingerprint == fingerprint => {
            refunds::find(conn, asked.tenant_id, existing.refund_id)
                .await
                .context("cannot read the refund")?
                .with_context(|| format!("refund {} of key {} is missing", existing.refund_id, key.as_str()))?
        }
        RefundIntake::Existing(_) => {
            return Err(OperatorError::Refused(format!(
                "the refund key {} is already taken by another request; nothing was done",
                key.as_str()
            )));
        }
        RefundIntake::Refused(refusal) => return Err(refused(asked.payment_id, &refusal)),
    };
    Ok(RefundActed {
        refund_id: refund.refund_id,
        payment_id: refund.payment_id,
        done: RefundDone::Accepted,
        by: asked.operator.actor().to_owned(),
        note: asked.note.to_owned(),
        refund_status: refund.status,
        amount: refund.amount,
        currency: refund.currency,
    })
}

/// The intake's refusal, in words.
fn refused(payment_id: PaymentId, refusal: &Refusal) -> OperatorError {
    match refusal {
        Refusal::NoSuchPayment => OperatorError::NotFound(format!("there is no payment {payment_id}")),
        Refusal::NotRefundable { status } => OperatorError::Refused(format!(
            "payment {payment_id} is {}: only a succeeded payment can be refunded",
            status.as_str()
        )),
        Refusal::NothingLeft => OperatorError::Refused(format!(
            "payment {payment_id} has nothing left to refund: its refunds that are not failed already add up to its \
             charge"
        )),
        Refusal::TooMuch { asked, left, currency } => OperatorError::Refused(format!(
            "payment {payment_id} has {} left to refund, and {} is more than that",
            format_amount(*left, currency.as_str()),
            format_amount(*asked, currency.as_str())
        )),
    }
}

/// A refund of a payment, as operators read it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RefundView {
    /// The refund.
    pub refund_id: RefundId,
    /// Where it stands.
    pub status: RefundStatus,
    /// How much it gives back.
    pub amount: Amount,
    /// In the payment's currency.
    pub currency: Currency,
    /// Why, in the provider's words, if given.
    pub reason: Option<String>,
    /// The provider's refund, once known.
    pub provider_refund_id: Option<String>,
    /// Who asked: `api` or `operator:<name>`.
    pub requested_by: String,
    /// Why it failed, when it did.
    pub failure: Option<String>,
    /// When it was accepted.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

impl From<Refund> for RefundView {
    fn from(refund: Refund) -> Self {
        let failure = match (refund.failure_code, refund.failure_message) {
            (Some(code), Some(message)) => Some(format!("{code}: {message}")),
            _ => None,
        };
        Self {
            refund_id: refund.refund_id,
            status: refund.status,
            amount: refund.amount,
            currency: refund.currency,
            reason: refund.reason,
            provider_refund_id: refund.provider_refund_id,
            requested_by: refund.requested_by,
            failure,
            created_at: refund.created_at,
        }
    }
}

/// What a payment has given back, and its refunds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PaymentRefunds {
    /// The payment's status.
    pub status: PaymentStatus,
    /// What it charged.
    pub amount: Amount,
    /// In this currency.
    pub currency: Currency,
    /// What its refunds that are not `failed` add up to.
    pub refunds_reserved: i64,
    /// What its `succeeded` refunds add up to.
    pub amount_refunded: i64,
    /// Its refunds, oldest first.
    pub refunds: Vec<RefundView>,
}

impl PaymentRefunds {
    /// What is left to refund, in minor units.
    pub const fn left(&self) -> i64 {
        self.amount.minor_units() - self.refunds_reserved
    }

    /// The refunds as a table, after a line of what was refunded.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        let money = |minor_units: i64| format_amount(minor_units, self.currency.as_str());
        writeln!(
            out,
            "refunded    {} of {} ({} promised back)",
            money(self.amount_refunded),
            money(self.amount.minor_units()),
            money(self.refunds_reserved)
        )?;
        let mut table = Table::new(&["REFUND", "AMOUNT", "STATUS", "PROVIDER REFUND", "REQUESTED BY", "CREATED"]);
        for r in &self.refunds {
            table.row(vec![
                r.refund_id.to_string(),
                format_amount(r.amount.minor_units(), r.currency.as_str()),
                r.status.as_str().to_owned(),
                r.provider_refund_id.clone().unwrap_or_default(),
                r.requested_by.clone(),
                render::timestamp(r.created_at),
            ]);
        }
        table.write(out, "no refunds")
    }
}

/// The payment's refunds and what they add up to; the payment must exist.
pub async fn of_payment(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<PaymentRefunds, OperatorError> {
    let payment = sqlx::query!(
        r#"
        SELECT status AS "status: PaymentStatus", amount AS "amount: Amount", currency AS "currency: Currency",
               refunds_reserved, refunded
        FROM payments WHERE tenant_id = $1 AND payment_id = $2
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_optional(&mut *conn)
    .await
    .context("cannot read the payment")?
    .ok_or_else(|| OperatorError::NotFound(format!("there is no payment {payment_id}")))?;
    let listed = refunds::of_payment(conn, tenant_id, payment_id).await.context("cannot read the payment's refunds")?;
    Ok(PaymentRefunds {
        status: payment.status,
        amount: payment.amount,
        currency: payment.currency,
        refunds_reserved: payment.refunds_reserved,
        amount_refunded: payment.refunded,
        refunds: listed.into_iter().map(RefundView::from).collect(),
    })
}

/// One row of a refund's history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RefundEventRow {
    /// From where (none for its acceptance).
    pub from_status: Option<RefundStatus>,
    /// To where.
    pub to_status: RefundStatus,
    /// Who.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// Supporting evidence.
    pub detail: Option<Value>,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// `GET /v1/refunds/{id}`: a refund and its history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RefundDetail {
    /// Its tenant.
    pub tenant_id: TenantId,
    /// The payment it gives money back from.
    pub payment_id: PaymentId,
    /// The refund.
    pub refund: RefundView,
    /// Its status changes, oldest first, with the evidence each was made on.
    pub history: Vec<RefundEventRow>,
}

impl render::Report for RefundDetail {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let r = &self.refund;
        writeln!(
            out,
            "refund      {} ({}, now {})",
            r.refund_id,
            format_amount(r.amount.minor_units(), r.currency.as_str()),
            r.status.as_str()
        )?;
        writeln!(out, "payment     {}", self.payment_id)?;
        writeln!(out, "asked by    {}", r.requested_by)?;
        if let Some(provider_refund_id) = &r.provider_refund_id {
            writeln!(out, "provider    {provider_refund_id}")?;
        }
        if let Some(failure) = &r.failure {
            writeln!(out, "failure     {failure}")?;
        }
        writeln!(out, "history")?;
        let mut table = Table::new(&["AT", "FROM", "TO", "ACTOR", "REASON", "EVIDENCE"]);
        for row in &self.history {
            table.row(vec![
                render::timestamp(row.created_at),
                row.from_status.map_or("-", RefundStatus::as_str).to_owned(),
                row.to_status.as_str().to_owned(),
                row.actor.clone(),
                row.reason.clone(),
                row.detail.as_ref().map(Value::to_string).unwrap_or_default(),
            ]);
        }
        table.write(out, "(empty)")
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

/// Refund `refund_id` and its history, if one of `tenants` (every tenant: `None`) has it.
pub async fn detail(
    conn: &mut PgConnection,
    tenants: Option<&[Uuid]>,
    refund_id: RefundId,
) -> Result<RefundDetail, OperatorError> {
    let (tenant_id, _, _) = dead_refunds::locate(conn, tenants, refund_id).await?;
    let refund = refunds::find(conn, tenant_id, refund_id)
        .await
        .context("cannot read the refund")?
        .ok_or_else(|| OperatorError::NotFound(format!("there is no refund {refund_id}")))?;
    let history = sqlx::query_as!(
        RefundEventRow,
        r#"
        SELECT from_status AS "from_status: RefundStatus", to_status AS "to_status: RefundStatus", actor, reason,
               detail, created_at
        FROM refund_events WHERE tenant_id = $1 AND refund_id = $2
        ORDER BY seq
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
    )
    .fetch_all(conn)
    .await
    .context("cannot read the refund's history")?;
    Ok(RefundDetail { tenant_id, payment_id: refund.payment_id, refund: RefundView::from(refund), history })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen() -> RefundsSeen {
        RefundsSeen {
            tenant_id: TenantId::generate(),
            status: PaymentStatus::Succeeded,
            event_count: 4,
            amount: Amount::new(1999).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            refunds_reserved: 0,
            refunded: 0,
            refund_count: 0,
        }
    }

    #[test]
    fn a_refund_accepted_failed_or_given_back_since_is_a_change_named_in_words() {
        let before = seen();
        let accepted = RefundsSeen { refunds_reserved: 1500, refund_count: 1, ..before.clone() };
        let given_back = RefundsSeen { refunded: 1500, ..accepted.clone() };

        assert_eq!(before.changes(&before.clone()), None);
        assert_eq!(
            before.changes(&accepted).unwrap(),
            "1 more refund was accepted; what it has promised back went from 0.00 EUR to 15.00 EUR"
        );
        assert_eq!(accepted.changes(&given_back).unwrap(), "what it has given back went from 0.00 EUR to 15.00 EUR");
        assert_eq!(before.left(), 1999);
        assert_eq!(accepted.left(), 499);
    }

    #[test]
    fn each_refusal_of_the_intake_says_why_with_the_amounts() {
        let payment_id = PaymentId::generate();
        let currency = Currency::parse("EUR").unwrap();

        let too_much = refused(payment_id, &Refusal::TooMuch { asked: 700, left: 499, currency });
        let not_yet = refused(payment_id, &Refusal::NotRefundable { status: PaymentStatus::Pending });
        let nothing = refused(payment_id, &Refusal::NothingLeft);
        let missing = refused(payment_id, &Refusal::NoSuchPayment);

        assert_eq!(
            too_much.to_string(),
            format!("payment {payment_id} has 4.99 EUR left to refund, and 7.00 EUR is more than that")
        );
        assert!(matches!(not_yet, OperatorError::Refused(ref why) if why.contains("is pending")), "{not_yet}");
        assert!(matches!(nothing, OperatorError::Refused(ref why) if why.contains("nothing left")), "{nothing}");
        assert!(matches!(missing, OperatorError::NotFound(_)));
    }

    #[test]
    fn a_proposals_refund_key_is_a_valid_idempotency_key_of_its_own() {
        let proposal_id = Uuid::now_v7();
        assert_eq!(key_of(proposal_id).unwrap().as_str(), format!("proposal-{proposal_id}"));
    }
}
