//! Signed `refund.updated` and `refund.failed` events, delivered to `POST /webhooks/provider` beside
//! the charge events ([`crate::webhooks`]): applied at most once per `webhook-id`, and
//! monotonically. Stripe's refund events (`crate::stripe_webhooks`) are applied here too
//! ([`apply_reported`]), by the same rules.
//!
//! An event settles only an `unknown` refund, by the rules of a lookup (`settling::judge`): a
//! refund still being sent is left to its sender, and a terminal or dead-lettered one never moves;
//! for those the delivery is only recorded, and one that contradicts a final refund opens a
//! conflict for an operator (`refund_dead_letters`). A refund held by another provider account than
//! the payment's changes nothing and is not recorded. What the event means is decided by [`judge`],
//! pure; this module does what it says, in one transaction with the refund's row locked.

use actix_web::HttpResponse;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::refund_status::RefundStatus;
use oncepay_provider::Refund as ProviderRefund;
use oncepay_provider::RefundState;
use oncepay_provider::wire::{RefundEvent, RefundEventType};
use oncepay_service::telemetry::{self, TraceContext};
use oncepay_store::StoreError;
use oncepay_store::refunds::settling::{self, AskedRefund, Finding, RefundSettlement};
use oncepay_store::transitions::Recorded;
use serde_json::{Value, json};
use sqlx::{Acquire, PgConnection, PgPool};
use tracing::{Instrument, Span};

use crate::unknown::refunds as unknown;
use crate::unknown::{Why, evidence};
use crate::webhook_outcome::{ApplyError, Handled, respond_to};
use oncepay_ops::dead_letters::refunds as dead_refunds;

const ACTOR: &str = "webhook";

/// What oncepay has stored about a refund, as far as a provider's refund can agree with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRefund {
    /// What the refund asked the provider for.
    pub asked: AskedRefund,
    /// Where it stands.
    pub status: RefundStatus,
    /// The provider refund it was settled with, or that the provider named, if any.
    pub provider_refund_id: Option<String>,
}

/// What to do with a refund an event reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundVerdict {
    /// The refund is `unknown` and the event settles it.
    Settle(RefundSettlement),
    /// The refund is `unknown` and the provider's refund is not what it asked for: dead-lettered,
    /// for an operator.
    Mismatch(String),
    /// The refund is `unknown` and the provider has not finished its refund: the poller keeps
    /// looking.
    Unfinished,
    /// The refund is still being sent (`pending`, `processing`): its sender learns the outcome.
    LeaveToSender,
    /// The refund is dead-lettered: only an operator moves it.
    ForOperator,
    /// The refund is terminal and the event agrees with it, or reports an earlier stage of the same
    /// provider refund (a late delivery).
    Agrees,
    /// The refund is terminal and the event contradicts it; the state is kept, and a conflict is
    /// opened (or added to) for an operator.
    Conflicts(String),
    /// The provider's refund is held by another provider account than the payment's: it is not
    /// evidence about this refund at all, and nothing is recorded.
    OtherAccount(String),
}

impl RefundVerdict {
    /// A short label for logs, metrics and `webhook_events.outcome`, from the charge events' set.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Settle(_) => "applied",
            Self::Mismatch(_) | Self::Conflicts(_) => "conflict",
            Self::Unfinished => "unfinished",
            Self::LeaveToSender => "not_unknown",
            Self::ForOperator => "dead_lettered",
            Self::Agrees => "already_terminal",
            Self::OtherAccount(_) => "other_account",
        }
    }
}

/// Compares the refund an event reports with what is stored about the refund it names. Pure.
pub fn judge(stored: &StoredRefund, reported: &ProviderRefund) -> RefundVerdict {
    use RefundStatus as S;

    // Whoever holds another account can put any refund's name on a refund of theirs: it must not
    // move, dead-letter or contradict anything.
    if !settling::same_account(&stored.asked, reported) {
        return RefundVerdict::OtherAccount(format!(
            "refund {} is held by account {}, but the refund's payment was charged in account {}",
            reported.id,
            reported.account.as_deref().unwrap_or("(oncepay's own)"),
            stored.asked.account.as_ref().map_or("(oncepay's own)", |account| account.as_str()),
        ));
    }
    let finding = settling::judge(&stored.asked, reported);
    let ours = stored.provider_refund_id.as_deref();
    let same_refund = ours == Some(reported.id.as_str());
    match (stored.status, finding) {
        (S::Unknown, Finding::Settles(settlement)) => RefundVerdict::Settle(settlement),
        (S::Unknown, Finding::NotAsAsked(why)) => RefundVerdict::Mismatch(why),
        (S::Unknown, Finding::Unfinished) => RefundVerdict::Unfinished,
        (S::Pending | S::Processing, _) => RefundVerdict::LeaveToSender,
        (S::DeadLettered, _) => RefundVerdict::ForOperator,

        (S::Succeeded | S::Failed, Finding::NotAsAsked(why)) => RefundVerdict::Conflicts(why),
        (S::Succeeded, Finding::Settles(RefundSettlement::Succeeded { .. }) | Finding::Unfinished) if same_refund => {
            RefundVerdict::Agrees
        }
        (S::Succeeded, Finding::Settles(RefundSettlement::Failed { .. })) if same_refund => RefundVerdict::Conflicts(
            format!("the provider reports refund {} failed, but the refund succeeded with it", reported.id),
        ),
        (S::Succeeded, _) => RefundVerdict::Conflicts(format!(
            "the provider reports refund {}, but the refund succeeded with refund {}: a second refund",
            reported.id,
            ours.unwrap_or("(none)"),
        )),
        (S::Failed, Finding::Settles(RefundSettlement::Succeeded { .. })) => RefundVerdict::Conflicts(format!(
            "the provider reports refund {} succeeded, but the refund is recorded as failed: money moved",
            reported.id,
        )),
        (S::Failed, Finding::Settles(RefundSettlement::Failed { .. })) if ours.is_none() || same_refund => {
            RefundVerdict::Agrees
        }
        (S::Failed, Finding::Unfinished) if same_refund => RefundVerdict::Agrees,
        (S::Failed, _) => RefundVerdict::Conflicts(format!(
            "the provider reports refund {} under the refund's key, but the refund failed with {}",
            reported.id,
            ours.unwrap_or("no refund at the provider"),
        )),
    }
}

/// Applies a verified refund event and says how it went, as a metrics label and a response (see
/// [`crate::webhooks::apply_and_respond`]).
pub(crate) async fn apply_and_respond(
    pool: &PgPool,
    webhook_id: &str,
    event: &RefundEvent,
) -> (&'static str, HttpResponse) {
    let applied = apply(pool, webhook_id, event).await;
    if let Ok(handled) = &applied {
        tracing::info!(provider_refund.id = %event.data.id, outcome = handled.label(), "refund webhook applied");
    }
    respond_to(applied)
}

/// Applies a verified refund event ([`apply_reported`]).
pub async fn apply(pool: &PgPool, webhook_id: &str, event: &RefundEvent) -> Result<Handled, ApplyError> {
    apply_reported(pool, webhook_id, event.event_type.as_str(), &event.data).await
}

/// Applies the refund a verified event of `event_type` reports, whichever provider sent it, in one
/// transaction: locks the refund it names (by oncepay's metadata on the provider's refund), records
/// the `webhook-id`, and judges the reported refund against the stored one ([`judge`]):
/// - `unknown`: settled, exactly as a lookup settles it; a refund that is not what it asked for
///   dead-letters it, with the event as evidence; an unfinished one changes nothing.
/// - terminal and contradicted: the refund keeps its status, and a conflict is opened for an
///   operator (a later one is added to it), with the event as evidence.
/// - anything else: only recorded.
///
/// A refund held by another provider account than the payment's changes nothing and is not
/// recorded: it is counted and logged (`other_account`).
///
/// A `refund.failed` event must report a failed refund; any other type may report any status.
#[tracing::instrument(name = "webhook.apply_refund", skip_all, fields(refund.id))]
pub async fn apply_reported(
    pool: &PgPool,
    webhook_id: &str,
    event_type: &str,
    reported: &ProviderRefund,
) -> Result<Handled, ApplyError> {
    let consistent = event_type != RefundEventType::RefundFailed.as_str() || reported.status == RefundState::Failed;
    if !consistent {
        return Err(ApplyError::Invalid(format!("the event type does not match the status of refund {}", reported.id)));
    }
    let Some((tenant_id, refund_id)) = reported.refund_ref() else {
        tracing::warn!(provider_refund.id = %reported.id, "a webhook for a refund that names no refund of ours");
        return Ok(Handled::NotOurs);
    };
    tracing::Span::current().record("refund.id", tracing::field::display(refund_id));

    let mut conn = pool.acquire().await.map_err(StoreError::from)?;
    let mut tx = conn.begin().await.map_err(StoreError::from)?;
    let Some((payment_id, stored, trace)) = lock_refund(&mut tx, tenant_id, refund_id).await? else {
        return Ok(Handled::NotOurs);
    };
    let verdict = judge(&stored, reported);
    if let RefundVerdict::OtherAccount(why) = &verdict {
        // Dropping the transaction releases the lock: nothing about the refund was written.
        crate::metrics::other_account("webhook", "refund", why);
        return Ok(Handled::OtherAccount);
    }
    if !record_delivery(&mut tx, tenant_id, payment_id, webhook_id, event_type, verdict.label()).await? {
        // A redelivery: dropping the transaction rolls everything back, so it changes nothing.
        return Ok(Handled::Duplicate);
    }
    let acting = resolution_span(tenant_id, refund_id, &verdict, trace.as_ref());
    act_on(&mut tx, tenant_id, refund_id, webhook_id, event_type, reported, &verdict).instrument(acting).await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(Handled::Recorded(verdict.label()))
}

/// Does what a first delivery's verdict asks, in the delivery's transaction with the refund locked.
async fn act_on(
    tx: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
    webhook_id: &str,
    event_type: &str,
    reported: &ProviderRefund,
    verdict: &RefundVerdict,
) -> Result<(), ApplyError> {
    let evidence = evidence("webhook", json!({ "webhook_id": webhook_id, "event": event_type, "refund": reported }));
    let reason = format!("provider webhook {event_type}");
    let recorded = match verdict {
        RefundVerdict::Settle(settlement) => {
            let how = resolution(settlement);
            let why = Why { actor: ACTOR, reason: &reason };
            let settled = unknown::settle(tx, tenant_id, refund_id, settlement, why, evidence).await?;
            if matches!(settled, Recorded::Moved(_)) {
                metrics::counter!(crate::metrics::UNKNOWN_REFUNDS_RESOLVED, "how" => how).increment(1);
            }
            matches!(settled, Recorded::Moved(_))
        }
        RefundVerdict::Mismatch(why) => {
            let why = Why { actor: ACTOR, reason: why };
            let applied = unknown::mismatch(tx, tenant_id, refund_id, why, evidence).await?;
            if matches!(applied, Recorded::Moved(_)) {
                metrics::counter!(crate::metrics::UNKNOWN_REFUNDS_RESOLVED, "how" => "dead_lettered").increment(1);
            }
            matches!(applied, Recorded::Moved(_))
        }
        RefundVerdict::Conflicts(why) => {
            // The terminal state is kept; an operator decides how the money is put right.
            dead_refunds::record_conflict(tx, tenant_id, refund_id, why, Value::Array(vec![evidence])).await?;
            true
        }
        // Recorded with the delivery, and nothing more. A refund still being sent is left to its
        // worker; an unfinished one to the poller, which keeps looking it up.
        RefundVerdict::Unfinished
        | RefundVerdict::LeaveToSender
        | RefundVerdict::ForOperator
        | RefundVerdict::Agrees => true,
        // Never recorded: `apply_reported` returns before.
        RefundVerdict::OtherAccount(_) => true,
    };
    if !recorded {
        // The refund row is locked, so its status cannot have changed.
        return Err(ApplyError::RefundMovedWhileLocked(refund_id));
    }
    Ok(())
}

/// How a webhook's settlement takes a refund out of `unknown`: the resolved metric's `how`.
const fn resolution(settlement: &RefundSettlement) -> &'static str {
    match settlement {
        RefundSettlement::Succeeded { .. } => "webhook_refunded",
        RefundSettlement::Failed { .. } => "webhook_failed",
    }
}

/// The span a delivery's verdict is acted on in. Settling a refund (`webhook.resolve_refund`)
/// continues the trace of the request that asked for it and links back to the delivery, as a
/// payment's settlement does (`webhook.resolve`), so the resolution shows in the same trace as the
/// request and the send. Anything else, or a refund with no trace, stays in the delivery's trace.
fn resolution_span(
    tenant_id: TenantId,
    refund_id: RefundId,
    verdict: &RefundVerdict,
    trace: Option<&TraceContext>,
) -> Span {
    let (RefundVerdict::Settle(settlement), Some(trace)) = (verdict, trace) else {
        return Span::current();
    };
    let span = tracing::info_span!(
        "webhook.resolve_refund",
        refund.id = %refund_id,
        tenant.id = %tenant_id,
        resolution = resolution(settlement),
    );
    telemetry::continue_trace(&span, trace);
    telemetry::link(&span, &Span::current());
    span
}

/// Records a delivery's `webhook-id` with the refund's payment and the verdict's label (the
/// `outcome` column), in the same table as the charge events, so that ids are deduplicated across
/// both; false when that id was recorded before. `charge` stays empty: it holds reported charges
/// only, which lookups and operators read as such.
async fn record_delivery(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    webhook_id: &str,
    event_type: &str,
    label: &str,
) -> Result<bool, StoreError> {
    let inserted = sqlx::query_scalar!(
        r#"
        INSERT INTO webhook_events (tenant_id, webhook_id, event_type, payment_id, outcome)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (tenant_id, webhook_id) DO NOTHING
        RETURNING true AS "inserted!"
        "#,
        tenant_id.as_uuid(),
        webhook_id,
        event_type,
        payment_id.as_uuid(),
        label,
    )
    .fetch_optional(conn)
    .await?;
    Ok(inserted.is_some())
}

/// Locks the refund row for the rest of the transaction and reads what a reported refund is judged
/// against, and the trace of the request that asked for the refund. A statement that waits for the
/// lock (a worker is settling the refund) reads the row as that worker left it. The payment's charge
/// and account never change once it has succeeded.
async fn lock_refund(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
) -> Result<Option<(PaymentId, StoredRefund, Option<TraceContext>)>, StoreError> {
    let row = sqlx::query!(
        r#"
        SELECT r.payment_id AS "payment_id: PaymentId", r.status AS "status: RefundStatus",
               r.provider_refund_id, r.amount AS "amount: Amount", r.currency AS "currency: Currency",
               p.provider_charge_id AS "charge_id!", p.provider_account AS "account: ProviderAccount",
               r.traceparent, r.tracestate
        FROM refunds r
        JOIN payments p ON p.tenant_id = r.tenant_id AND p.payment_id = r.payment_id
        WHERE r.tenant_id = $1 AND r.refund_id = $2
        FOR UPDATE OF r
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|row| {
        let asked = AskedRefund {
            tenant_id,
            refund_id,
            charge_id: row.charge_id,
            account: row.account,
            amount: row.amount,
            currency: row.currency,
        };
        let stored = StoredRefund { asked, status: row.status, provider_refund_id: row.provider_refund_id };
        let trace = row.traceparent.map(|traceparent| TraceContext { traceparent, tracestate: row.tracestate });
        (row.payment_id, stored, trace)
    }))
}

#[cfg(test)]
mod tests {
    use oncepay_provider::fixtures;

    use super::*;

    fn asked() -> AskedRefund {
        AskedRefund {
            tenant_id: TenantId::generate(),
            refund_id: RefundId::generate(),
            charge_id: "ch_1".to_owned(),
            account: None,
            amount: Amount::new(100).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
        }
    }

    #[test]
    fn each_stored_state_and_reported_refund_gets_the_right_verdict() {
        use RefundState::{Canceled, Failed, Pending, Succeeded};
        use RefundStatus as S;
        let a = asked();
        let stored = |status, id: Option<&str>| StoredRefund {
            asked: a.clone(),
            status,
            provider_refund_id: id.map(str::to_owned),
        };
        let reported = |id: &str, status| fixtures::refund(a.refund_id, id, "ch_1", status, 100);
        let other_amount = |id: &str, status| ProviderRefund { amount: 90, ..reported(id, status) };
        let elsewhere = |refund: ProviderRefund| ProviderRefund { account: Some("acct_other".into()), ..refund };
        let cases = [
            ("unknown, refunded", stored(S::Unknown, None), reported("re_1", Succeeded), "applied"),
            ("unknown, failed", stored(S::Unknown, None), reported("re_1", Failed), "applied"),
            ("unknown, canceled", stored(S::Unknown, None), reported("re_1", Canceled), "applied"),
            ("unknown, unfinished", stored(S::Unknown, None), reported("re_1", Pending), "unfinished"),
            ("unknown, another amount", stored(S::Unknown, None), other_amount("re_1", Succeeded), "conflict"),
            ("pending", stored(S::Pending, None), reported("re_1", Succeeded), "not_unknown"),
            ("processing", stored(S::Processing, None), reported("re_1", Failed), "not_unknown"),
            ("dead lettered", stored(S::DeadLettered, None), reported("re_1", Succeeded), "dead_lettered"),
            ("same success", stored(S::Succeeded, Some("re_1")), reported("re_1", Succeeded), "already_terminal"),
            ("late pending", stored(S::Succeeded, Some("re_1")), reported("re_1", Pending), "already_terminal"),
            ("a second refund", stored(S::Succeeded, Some("re_1")), reported("re_2", Succeeded), "conflict"),
            ("succeeded, then failed", stored(S::Succeeded, Some("re_1")), reported("re_1", Failed), "conflict"),
            (
                "succeeded, another amount",
                stored(S::Succeeded, Some("re_1")),
                other_amount("re_1", Succeeded),
                "conflict",
            ),
            ("failed, then refunded", stored(S::Failed, Some("re_1")), reported("re_1", Succeeded), "conflict"),
            ("same failure", stored(S::Failed, Some("re_1")), reported("re_1", Failed), "already_terminal"),
            ("failure without refund id", stored(S::Failed, None), reported("re_1", Failed), "already_terminal"),
            ("another failed refund", stored(S::Failed, Some("re_1")), reported("re_2", Failed), "conflict"),
            ("not made, then a refund appears", stored(S::Failed, None), reported("re_1", Pending), "conflict"),
            (
                "unknown, from another account",
                stored(S::Unknown, None),
                elsewhere(reported("re_1", Succeeded)),
                "other_account",
            ),
            (
                "succeeded, a failure from another account",
                stored(S::Succeeded, Some("re_1")),
                elsewhere(reported("re_1", Failed)),
                "other_account",
            ),
            (
                "dead lettered, from another account",
                stored(S::DeadLettered, None),
                elsewhere(reported("re_1", Succeeded)),
                "other_account",
            ),
        ];
        for (name, stored, reported, expected) in cases {
            assert_eq!(judge(&stored, &reported).label(), expected, "{name}");
        }
    }
}
