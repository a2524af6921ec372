//! The operator's actions on a dead letter: `retry`, `resolve`, and looking up the charge to resolve
//! it with. This module owns the rules and the refusals.
//!
//! Each action runs in one transaction that locks the open entry and the payment, and checks both; a
//! failed check changes nothing. No transaction is open while the provider is asked about a charge.

use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::ids::PaymentId;
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_provider::PaymentProvider;
use oncepay_store::outbox;
use oncepay_store::settlement::{self, Unsettled};
use oncepay_store::transitions::{self, Change, Recorded, Settlement};
use serde_json::json;
use sqlx::{Acquire, PgConnection};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::ResolutionKind;
use super::queries::{self, Locked};
use super::reports::Resolved;
use crate::operator_error::OperatorError;
use crate::render;
use oncepay_store::webhook_events;

/// An operator, as recorded: `operator:<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator(String);

impl Operator {
    /// Checks an operator's name.
    pub fn parse(name: &str) -> Result<Self, OperatorError> {
        let name = name.trim();
        if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
            return Err(OperatorError::Invalid(
                "name the operator with --operator (1 to 100 printable characters)".into(),
            ));
        }
        Ok(Self(format!("operator:{name}")))
    }

    /// This operator, carrying out what `approver` approved: `operator:<name>, approved by <approver>`.
    pub fn approved_by(&self, approver: &str) -> Self {
        Self(format!("{}, approved by {approver}", self.0))
    }

    /// `operator:<name>`.
    pub fn actor(&self) -> &str {
        &self.0
    }
}

/// The reason an operator gave for a change, trimmed; refused when empty, since every change says
/// why.
pub fn require_reason(reason: &str) -> Result<&str, OperatorError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(OperatorError::Invalid(
            "say why: every change needs a reason (--reason, or \"reason\" in the body)".into(),
        ));
    }
    Ok(reason)
}

fn refuse_conflict(payment_id: PaymentId, status: PaymentStatus, action: &str) -> OperatorError {
    OperatorError::Refused(format!(
        "payment {payment_id} is {}, and a terminal payment never changes, so it cannot be {action}; record your \
         decision with `dead-letters resolve {payment_id} --acknowledge --reason ..`",
        status.as_str()
    ))
}

fn moved<T>(recorded: Recorded<T>, payment_id: PaymentId) -> Result<(), OperatorError> {
    match recorded {
        Recorded::Moved(_) => Ok(()),
        // The payment and the entry are locked: nothing else can have moved it.
        Recorded::LostRace => {
            Err(OperatorError::Refused(format!("payment {payment_id} changed underneath; try again")))
        }
    }
}

/// What `retry` needs to know.
#[derive(Debug, Clone)]
pub struct Retry<'a> {
    /// The dead-lettered payment.
    pub payment_id: PaymentId,
    /// Who.
    pub operator: &'a Operator,
    /// Why.
    pub reason: &'a str,
    /// The provider's key window minus the margin, after the payment's first send.
    pub resend_horizon: Duration,
    /// Resend even though the provider may have forgotten the key.
    pub outside_key_window: bool,
}

/// `retry`: `dead_lettered → pending` and back into the outbox, resent with the same downstream key.
///
/// Refused past the provider's key window unless `outside_key_window`: the provider would no longer
/// recognise the key, so if the first attempt did charge, the resend would charge again.
pub async fn retry(conn: &mut PgConnection, retry: &Retry<'_>) -> Result<Resolved, OperatorError> {
    let reason = require_reason(retry.reason)?;
    let payment_id = retry.payment_id;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let locked = queries::lock_open(&mut tx, payment_id, retry.resend_horizon).await?;
    if locked.status != PaymentStatus::DeadLettered {
        return Err(refuse_conflict(payment_id, locked.status, "retried"));
    }
    if !locked.in_key_window && !retry.outside_key_window {
        let sent = locked.first_sent_at.map_or_else(|| "?".to_owned(), render::timestamp);
        return Err(OperatorError::Refused(format!(
            "payment {payment_id} was first sent at {sent}, and the provider may have forgotten its key since: if that \
             attempt charged, a resend would charge again. Check the evidence (`dead-letters show {payment_id}`), then \
             pass --outside-key-window to resend anyway"
        )));
    }
    // Past the key window the operator vouches that no send charged: a recorded success says otherwise.
    if !locked.in_key_window
        && let Some(charged) = queries::succeeded_charge_on_record(&mut tx, &locked).await?
    {
        return Err(OperatorError::Refused(format!(
            "a signed provider report says charge {charged} of payment {payment_id} succeeded, and past the \
             provider's key window a resend would charge again. Check the evidence (`dead-letters show \
             {payment_id}`) and resolve it `--as succeeded --charge-id {charged}`"
        )));
    }
    let detail = json!({
        "dead_letter_id": locked.dead_letter_id,
        "outside_key_window": !locked.in_key_window,
    });
    let change = Change {
        tenant_id: locked.tenant_id,
        payment_id,
        from: PaymentStatus::DeadLettered,
        transition: Transition::OperatorRetry,
        actor: retry.operator.actor(),
        reason,
        detail: Some(detail),
    };
    moved(transitions::apply(&mut tx, &change).await.context("cannot move the payment")?, payment_id)?;
    if !locked.in_key_window {
        // The operator vouches that no earlier send charged: without this the worker would refuse the
        // resend past the key window. The audit row above records that they did.
        queries::clear_may_be_charged(&mut tx, &locked).await?;
    }
    outbox::enqueue(&mut tx, locked.tenant_id, payment_id, OffsetDateTime::now_utc())
        .await
        .context("cannot queue the payment")?;
    // Who and why go on the entry here, and in the payment's audit trail with the move above.
    queries::close(&mut tx, &locked, retry.operator.actor(), ResolutionKind::Retried, reason).await?;
    tx.commit().await.context("cannot commit the retry")?;
    Ok(Resolved {
        payment_id,
        dead_letter_id: locked.dead_letter_id,
        resolution: ResolutionKind::Retried,
        resolved_by: retry.operator.actor().to_owned(),
        note: reason.to_owned(),
        payment_status: PaymentStatus::Pending,
    })
}

/// The charge an operator says the payment succeeded with, as the ledger will book it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookedCharge {
    /// The provider's charge id.
    pub charge_id: String,
    /// What the provider charged.
    pub amount: Amount,
    /// In this currency.
    pub currency: Currency,
    /// When the provider created the charge.
    pub charged_at: OffsetDateTime,
}

/// What `resolve` decides.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// The payment succeeded with this charge.
    Succeeded(BookedCharge),
    /// No money moved (a failed charge id, if the provider made one).
    Failed {
        /// The provider's failed charge, if any.
        charge_id: Option<String>,
        /// Settle as failed although a recorded charge says the payment succeeded (the operator
        /// refunded it, say); the reason must say why.
        force: bool,
    },
    /// A conflict entry was looked at; the terminal payment stays as it is.
    Acknowledge,
}

/// A `resolve` as the operator asked for it, before the charge it names is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// Acknowledge a conflict.
    Acknowledge,
    /// Settle as failed.
    Failed {
        /// The provider's failed charge, if any.
        charge_id: Option<String>,
        /// Although a recorded charge says the payment succeeded.
        force: bool,
    },
    /// Settle as succeeded with the provider's charge `charge_id`: what it charged and when are given,
    /// or else looked up.
    Succeeded {
        /// The provider's charge (required).
        charge_id: Option<String>,
        /// What it charged, in minor units, when the provider no longer lists it.
        amount: Option<Amount>,
        /// In this currency (with `amount`).
        currency: Option<Currency>,
        /// When the provider created it, RFC 3339 (with `amount`).
        charged_at: Option<String>,
    },
}

/// The resolution an operator asked for: a success's charge is taken as given when its amount,
/// currency and time are, and otherwise looked up with [`find_charge`] from the provider that
/// `provider` builds (only then).
pub async fn resolution<P: PaymentProvider>(
    conn: &mut PgConnection,
    provider: impl FnOnce() -> Result<P, OperatorError>,
    payment_id: PaymentId,
    asked: Asked,
) -> Result<Resolution, OperatorError> {
    match asked {
        Asked::Acknowledge => Ok(Resolution::Acknowledge),
        Asked::Failed { charge_id, force } => Ok(Resolution::Failed { charge_id, force }),
        Asked::Succeeded { charge_id: None, .. } => {
            Err(OperatorError::Invalid("a resolution as succeeded needs the provider's charge id".into()))
        }
        Asked::Succeeded { charge_id: Some(charge_id), amount, currency, charged_at } => {
            match (amount, currency, charged_at) {
                (Some(amount), Some(currency), Some(charged_at)) => {
                    Ok(Resolution::Succeeded(booked(charge_id, amount, currency, &charged_at)?))
                }
                (None, None, None) => {
                    Ok(Resolution::Succeeded(find_charge(conn, &provider()?, payment_id, &charge_id).await?))
                }
                _ => Err(OperatorError::Invalid(
                    "give the charge's amount, currency and time together, or none of them to look the charge up"
                        .into(),
                )),
            }
        }
    }
}

/// A charge as the operator read it from the provider's records.
fn booked(
    charge_id: String,
    amount: Amount,
    currency: Currency,
    charged_at: &str,
) -> Result<BookedCharge, OperatorError> {
    let charged_at = OffsetDateTime::parse(charged_at, &Rfc3339)
        .map_err(|_| OperatorError::Invalid(format!("charged_at {charged_at:?} is not an RFC 3339 time")))?;
    Ok(BookedCharge { charge_id, amount, currency, charged_at })
}

/// Finds the charge `charge_id` of a dead-lettered payment, for a `resolve --as succeeded` that did
/// not give the amount, currency and time itself: among the charges signed webhooks reported for
/// the payment, else among the provider's charges for its key. No transaction is open meanwhile.
pub async fn find_charge<P: PaymentProvider>(
    conn: &mut PgConnection,
    provider: &P,
    payment_id: PaymentId,
    charge_id: &str,
) -> Result<BookedCharge, OperatorError> {
    let (tenant_id, asked) = queries::open_payment(conn, payment_id).await?;
    let recorded = webhook_events::recorded_charges(conn, tenant_id, payment_id)
        .await
        .context("cannot read the payment's recorded webhooks")?;
    let charge = match recorded.into_iter().find(|c| c.id == charge_id) {
        Some(charge) => charge,
        None => {
            let charges =
                provider.find_by_key(&payment_id.downstream_key(), asked.account.as_ref()).await.map_err(|error| {
                    let context = format!("cannot ask the provider about charge {charge_id}");
                    OperatorError::Failed(anyhow::Error::new(error).context(context))
                })?;
            charges.into_iter().find(|c| c.id == charge_id).ok_or_else(|| {
                OperatorError::Refused(format!(
                    "neither a webhook nor the provider's lookup by key names a charge {charge_id} for payment \
                     {payment_id} (past its key window the provider may not); give --amount, --currency and \
                     --charged-at from the provider's records"
                ))
            })?
        }
    };
    match settlement::settlement_of(&asked, &charge).map_err(|why| refuse_booking(payment_id, &why))? {
        Settlement::Succeeded { charge_id, amount, currency, charged_at } => {
            Ok(BookedCharge { charge_id, amount, currency, charged_at })
        }
        Settlement::Failed { .. } => Err(OperatorError::Refused(format!(
            "the provider reports charge {charge_id} as failed; no money moved with it"
        ))),
    }
}

/// Refuses to book a charge that does not settle the payment.
fn refuse_booking(payment_id: PaymentId, why: &Unsettled) -> OperatorError {
    OperatorError::Refused(format!(
        "{why}. A charge that is not what payment {payment_id} asked for is never booked as its success: \
         check it with the provider, refund it there if it was taken, and resolve the payment --as failed"
    ))
}

/// `resolve`: settles a dead-lettered payment as the operator decided, or acknowledges a conflict.
pub async fn resolve(
    conn: &mut PgConnection,
    payment_id: PaymentId,
    decision: &Resolution,
    operator: &Operator,
    reason: &str,
) -> Result<Resolved, OperatorError> {
    let reason = require_reason(reason)?;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let locked = queries::lock_open(&mut tx, payment_id, Duration::ZERO).await?;
    // A terminal payment never moves: its entry can only be acknowledged.
    let terminal = locked.status.is_terminal();
    let (resolution, status) = match decision {
        Resolution::Acknowledge if terminal => (ResolutionKind::Acknowledged, locked.status),
        Resolution::Acknowledge => {
            return Err(OperatorError::Refused(format!(
                "payment {payment_id} is dead-lettered and needs a decision: `--as succeeded|failed`, or \
                 `dead-letters retry`"
            )));
        }
        Resolution::Succeeded(_) | Resolution::Failed { .. } if terminal => {
            return Err(refuse_conflict(payment_id, locked.status, "settled again"));
        }
        Resolution::Succeeded(charge) => {
            let settlement = settlement::success(
                &locked.asked,
                &charge.charge_id,
                charge.amount.minor_units(),
                charge.currency.as_str(),
                charge.charged_at.unix_timestamp(),
            )
            .map_err(|why| refuse_booking(payment_id, &why))?;
            settle(&mut tx, &locked, payment_id, Transition::OperatorSucceeded, &settlement, operator, reason).await?;
            (ResolutionKind::Succeeded, PaymentStatus::Succeeded)
        }
        Resolution::Failed { charge_id, force } => {
            if !force && let Some(charged) = queries::succeeded_charge_on_record(&mut tx, &locked).await? {
                return Err(OperatorError::Refused(format!(
                    "a signed provider report says charge {charged} of payment {payment_id} succeeded; settling it as \
                     failed would tell the merchant no money moved. Check the evidence (`dead-letters show \
                     {payment_id}`): resolve it `--as succeeded --charge-id {charged}`, or, if you refunded it, pass \
                     --force and say so in --reason"
                )));
            }
            let settlement = Settlement::Failed {
                code: "resolved_by_operator".to_owned(),
                message: reason.to_owned(),
                charge_id: charge_id.clone(),
            };
            settle(&mut tx, &locked, payment_id, Transition::OperatorFailed, &settlement, operator, reason).await?;
            (ResolutionKind::Failed, PaymentStatus::Failed)
        }
    };
    // Who and why go on the entry here, and in the payment's audit trail when the payment moved.
    queries::close(&mut tx, &locked, operator.actor(), resolution, reason).await?;
    tx.commit().await.context("cannot commit the resolution")?;
    Ok(Resolved {
        payment_id,
        dead_letter_id: locked.dead_letter_id,
        resolution,
        resolved_by: operator.actor().to_owned(),
        note: reason.to_owned(),
        payment_status: status,
    })
}

async fn settle(
    conn: &mut PgConnection,
    locked: &Locked,
    payment_id: PaymentId,
    transition: Transition,
    settlement: &Settlement,
    operator: &Operator,
    reason: &str,
) -> Result<(), OperatorError> {
    let change = Change {
        tenant_id: locked.tenant_id,
        payment_id,
        from: PaymentStatus::DeadLettered,
        transition,
        actor: operator.actor(),
        reason,
        detail: Some(json!({ "dead_letter_id": locked.dead_letter_id })),
    };
    let recorded = transitions::settle(conn, &change, settlement).await.context("cannot settle the payment")?;
    moved(recorded, payment_id)
}
