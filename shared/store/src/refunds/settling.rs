//! A refund's status changes, persisted, and the one place a provider's refund becomes a
//! settlement.
//!
//! Every change is decided by [`oncepay_domain::refund_status::next`] and written as a
//! compare-and-set (`UPDATE refunds … WHERE status = <from>`) with an audit row (`refund_events`)
//! and a wake-up of the refund's long polls. Zero rows updated is [`Recorded::LostRace`]: another
//! actor moved the refund first, nothing was written. A terminal change also books the money on the
//! payment (`refunded` up, or `refunds_reserved` down for a failed refund), writes the ledger entry
//! of a succeeded one and stores the terminal response on the refund's key (whose retention then
//! starts again), in the caller's transaction.
//!
//! [`judge`] is what the worker, the reconciler and its webhooks all ask of a refund the provider
//! reports: does it settle this refund, and how.

use std::collections::BTreeMap;

use serde_json::Value;
use sqlx::PgConnection;
use sqlx::types::Json;
use time::OffsetDateTime;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::merchant_event::EventType;
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::refund::RefundResource;
use oncepay_domain::refund_status::{self, RefundStatus, RefundTransition};
use oncepay_provider::{Refund as ProviderRefund, RefundState};

use super::{REFUND_CHANNEL, REFUND_OUTBOX_CHANNEL, Refund};
use crate::transitions::{Recorded, TransitionError};
use crate::{StoreError, merchant_events};

/// One status change of a refund to persist.
#[derive(Debug, Clone)]
pub struct RefundChange<'a> {
    /// The refund's owner.
    pub tenant_id: TenantId,
    /// The refund.
    pub refund_id: RefundId,
    /// The status the caller saw; the change only happens if it is still current.
    pub from: RefundStatus,
    /// What happened.
    pub transition: RefundTransition,
    /// Who did it: `worker:<id>`, `sweeper`, `reconciler:<id>`, `webhook`, `operator:<name>`.
    pub actor: &'a str,
    /// Why, in words.
    pub reason: &'a str,
    /// Supporting evidence for the audit trail.
    pub detail: Option<Value>,
}

/// How a refund became terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundSettlement {
    /// The money went back to the customer.
    Succeeded {
        /// The provider's refund id.
        provider_refund_id: String,
        /// When the provider made the refund.
        refunded_at: OffsetDateTime,
    },
    /// No money moved.
    Failed {
        /// Stable failure code.
        code: String,
        /// Human-readable reason.
        message: String,
        /// The provider's failed refund, if it made one.
        provider_refund_id: Option<String>,
    },
}

/// Persists a non-terminal change of a refund; a refund that goes back to `pending` is queued for
/// the worker again at `available_at`, in the trace of the request that asked for it. `provider_refund_id` is kept when the provider named its
/// refund (one it has not finished).
pub async fn apply(
    conn: &mut PgConnection,
    change: &RefundChange<'_>,
    provider_refund_id: Option<&str>,
    available_at: OffsetDateTime,
) -> Result<Recorded<RefundStatus>, TransitionError> {
    let to = refund_status::next(change.from, change.transition)?;
    if to.is_terminal() {
        return Err(TransitionError::RefundSettlementMismatch { transition: change.transition, from: change.from, to });
    }
    let place = sqlx::query_scalar!(
        r#"
        UPDATE refunds
        SET status = $3, updated_at = now(), event_count = event_count + 1,
            may_have_moved = may_have_moved OR $5,
            provider_refund_id = COALESCE(provider_refund_id, $6),
            -- A refund that becomes `unknown` is due for the reconciler's first lookup at once.
            -- now() stays outside the CASE, where Citus refuses it (NULL plus a time is NULL).
            lookups = CASE WHEN $3 = 'unknown'::payment_status THEN 0 ELSE lookups END,
            lookup_evidence = CASE WHEN $3 = 'unknown'::payment_status THEN '[]' ELSE lookup_evidence END,
            next_lookup_at = now() + CASE WHEN $3 = 'unknown'::payment_status THEN interval '0' END
        WHERE tenant_id = $1 AND refund_id = $2 AND status = $4
        RETURNING event_count
        "#,
        change.tenant_id.as_uuid(),
        change.refund_id.as_uuid(),
        to as RefundStatus,
        change.from as RefundStatus,
        change.transition.send_may_have_reached_provider(),
        provider_refund_id,
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    let Some(place) = place else {
        return Ok(Recorded::LostRace);
    };
    write_event(conn, change, to, place).await?;
    if EventType::of_refund_change(change.from, to).is_some() {
        let refund = super::find(conn, change.tenant_id, change.refund_id)
            .await?
            .ok_or_else(|| StoreError::Unexpected(sqlx::Error::RowNotFound.into()))?;
        merchant_events::of_refund(conn, &refund, change.from).await?;
    }
    if to == RefundStatus::Pending {
        sqlx::query!(
            r#"
            -- The resend continues the trace of the request that asked for the refund.
            INSERT INTO refund_outbox (tenant_id, refund_id, available_at, traceparent, tracestate)
            SELECT tenant_id, refund_id, $3, traceparent, tracestate FROM refunds
            WHERE tenant_id = $1 AND refund_id = $2
            ON CONFLICT (tenant_id, refund_id) DO NOTHING
            "#,
            change.tenant_id.as_uuid(),
            change.refund_id.as_uuid(),
            available_at,
        )
        .execute(&mut *conn)
        .await
        .map_err(StoreError::from)?;
        sqlx::query!("SELECT pg_notify($1, $2)", REFUND_OUTBOX_CHANNEL, change.tenant_id.to_string())
            .execute(&mut *conn)
            .await
            .map_err(StoreError::from)?;
    }
    wake(conn, change.refund_id).await?;
    Ok(Recorded::Moved(to))
}

/// Persists a terminal change: status, audit row, the money on the payment, the ledger entry of a
/// succeeded refund, the stored response on its key and the wake-up, in the caller's transaction.
/// Returns the refund as it now is.
#[tracing::instrument(name = "store.settle_refund", skip_all, fields(refund.id = %change.refund_id, transition = ?change.transition))]
pub async fn settle(
    conn: &mut PgConnection,
    change: &RefundChange<'_>,
    settlement: &RefundSettlement,
) -> Result<Recorded<Refund>, TransitionError> {
    let to = refund_status::next(change.from, change.transition)?;
    let (provider_refund_id, failure_code, failure_message) = match (to, settlement) {
        (RefundStatus::Succeeded, RefundSettlement::Succeeded { provider_refund_id, .. }) => {
            (Some(provider_refund_id.as_str()), None, None)
        }
        (RefundStatus::Failed, RefundSettlement::Failed { code, message, provider_refund_id }) => {
            (provider_refund_id.as_deref(), Some(code.as_str()), Some(message.as_str()))
        }
        _ => {
            return Err(TransitionError::RefundSettlementMismatch {
                transition: change.transition,
                from: change.from,
                to,
            });
        }
    };
    let refund = sqlx::query_as!(
        Refund,
        r#"
        UPDATE refunds
        SET status = $3, updated_at = now(), event_count = event_count + 1,
            provider_refund_id = COALESCE($5, provider_refund_id),
            failure_code = $6, failure_message = $7
        WHERE tenant_id = $1 AND refund_id = $2 AND status = $4
        RETURNING tenant_id AS "tenant_id: TenantId", refund_id AS "refund_id: RefundId",
                  payment_id AS "payment_id: PaymentId", status AS "status: RefundStatus",
                  amount AS "amount: Amount", currency AS "currency: Currency", reason,
                  metadata AS "metadata: Json<BTreeMap<String, String>>", provider_refund_id, failure_code, failure_message,
                  send_attempts, first_sent_at, may_have_moved, requested_by, created_at, updated_at, event_count
        "#,
        change.tenant_id.as_uuid(),
        change.refund_id.as_uuid(),
        to as RefundStatus,
        change.from as RefundStatus,
        provider_refund_id,
        failure_code,
        failure_message,
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    let Some(refund) = refund else {
        return Ok(Recorded::LostRace);
    };
    // The update counted this change's row: its place in the refund's history is the count.
    write_event(conn, change, to, refund.event_count).await?;
    book(conn, &refund, settlement).await?;
    merchant_events::of_refund(conn, &refund, change.from).await?;
    let body = serde_json::to_value(RefundResource::from(&refund))
        .map_err(|e| StoreError::Unexpected(sqlx::Error::Encode(Box::new(e)).into()))?;
    sqlx::query!(
        r#"
        -- The retention starts again when the refund becomes terminal, as a payment's key's does.
        -- The new expiry is computed in a SELECT, not in the UPDATE's SET: Citus refuses STABLE
        -- functions over a row's columns in an UPDATE (sql/store_response.sql does the same).
        WITH extended AS (
            SELECT idempotency_key, GREATEST(expires_at, now() + (expires_at - created_at)) AS expires_at
            FROM refund_keys
            WHERE tenant_id = $1 AND refund_id = $2
        )
        UPDATE refund_keys k
        SET response_status = 200, response_body = $3, expires_at = e.expires_at
        FROM extended e
        WHERE k.tenant_id = $1 AND k.idempotency_key = e.idempotency_key
        "#,
        change.tenant_id.as_uuid(),
        change.refund_id.as_uuid(),
        body,
    )
    .execute(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    wake(conn, change.refund_id).await?;
    Ok(Recorded::Moved(refund))
}

/// The money of a terminal refund, on its payment: a succeeded refund is refunded and booked in the
/// ledger; a failed one gives its reservation back.
async fn book(conn: &mut PgConnection, refund: &Refund, settlement: &RefundSettlement) -> Result<(), StoreError> {
    match settlement {
        RefundSettlement::Succeeded { provider_refund_id, refunded_at } => {
            sqlx::query!(
                r#"
                INSERT INTO refund_ledger_entries
                    (tenant_id, refund_id, payment_id, provider_refund_id, amount, currency, refunded_at)
                VALUES ($1, $2, $3, $4, $5, $6, $7)
                "#,
                refund.tenant_id.as_uuid(),
                refund.refund_id.as_uuid(),
                refund.payment_id.as_uuid(),
                provider_refund_id,
                refund.amount.minor_units(),
                refund.currency.as_str(),
                refunded_at,
            )
            .execute(&mut *conn)
            .await?;
            sqlx::query!(
                "UPDATE payments SET refunded = refunded + $3 WHERE tenant_id = $1 AND payment_id = $2",
                refund.tenant_id.as_uuid(),
                refund.payment_id.as_uuid(),
                refund.amount.minor_units(),
            )
            .execute(&mut *conn)
            .await?;
        }
        RefundSettlement::Failed { .. } => {
            sqlx::query!(
                "UPDATE payments SET refunds_reserved = refunds_reserved - $3 WHERE tenant_id = $1 AND payment_id = $2",
                refund.tenant_id.as_uuid(),
                refund.payment_id.as_uuid(),
                refund.amount.minor_units(),
            )
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

async fn write_event(
    conn: &mut PgConnection,
    change: &RefundChange<'_>,
    to: RefundStatus,
    place: i32,
) -> Result<(), StoreError> {
    sqlx::query!(
        r#"
        INSERT INTO refund_events (tenant_id, refund_id, seq, from_status, to_status, actor, reason, detail)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
        "#,
        change.tenant_id.as_uuid(),
        change.refund_id.as_uuid(),
        place,
        change.from as RefundStatus,
        to as RefundStatus,
        change.actor,
        change.reason,
        change.detail,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Wakes the refund's long polls when the transaction commits.
async fn wake(conn: &mut PgConnection, refund_id: RefundId) -> Result<(), StoreError> {
    sqlx::query!("SELECT pg_notify($1, $2)", REFUND_CHANNEL, refund_id.to_string()).execute(conn).await?;
    Ok(())
}

/// What a refund asked the provider for: a refund the provider reports settles it only if it is
/// this one, of this charge, in this account, for this money.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskedRefund {
    /// The owner.
    pub tenant_id: TenantId,
    /// The refund.
    pub refund_id: RefundId,
    /// The payment's charge at the provider.
    pub charge_id: String,
    /// The account that holds the charge; `None` for oncepay's own.
    pub account: Option<ProviderAccount>,
    /// How much.
    pub amount: Amount,
    /// In which currency.
    pub currency: Currency,
}

/// What a refund the provider reports means for the refund that asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// It settles the refund.
    Settles(RefundSettlement),
    /// The provider has it but has not finished it: still unknown.
    Unfinished,
    /// It names this refund but is not what it asked for (another charge, account, amount or
    /// currency): evidence for an operator, never a settlement.
    NotAsAsked(String),
}

/// Whether `refund` is held by the provider account of the refund's payment (`None`: oncepay's
/// own). A refund in any other account is another merchant's, or the platform's: it says nothing
/// about this refund, whatever its metadata or key name.
pub fn same_account(asked: &AskedRefund, refund: &ProviderRefund) -> bool {
    refund.account.as_deref() == asked.account.as_ref().map(ProviderAccount::as_str)
}

/// Judges a refund the provider reports against the refund that asked for it. The refund must name
/// the asking refund (by its downstream key, where the provider reports keys, or by oncepay's
/// metadata).
pub fn judge(asked: &AskedRefund, refund: &ProviderRefund) -> Finding {
    let key = asked.refund_id.downstream_key();
    let named = match &refund.idempotency_key {
        Some(reported) => reported == key.as_str(),
        None => refund.refund_ref() == Some((asked.tenant_id, asked.refund_id)),
    };
    let mismatches: Vec<String> = [
        (!named).then(|| "it does not name this refund".to_owned()),
        (refund.charge != asked.charge_id)
            .then(|| format!("it refunds charge {}, not {}", refund.charge, asked.charge_id)),
        (!same_account(asked, refund)).then(|| "it is in another provider account".to_owned()),
        (refund.amount != asked.amount.minor_units())
            .then(|| format!("it is for {} minor units, not {}", refund.amount, asked.amount.minor_units())),
        (!refund.currency.eq_ignore_ascii_case(asked.currency.as_str()))
            .then(|| format!("it is in {}, not {}", refund.currency, asked.currency.as_str())),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !mismatches.is_empty() {
        return Finding::NotAsAsked(format!("The provider's refund {}: {}.", refund.id, mismatches.join("; ")));
    }
    match refund.status {
        RefundState::Pending => Finding::Unfinished,
        RefundState::Succeeded => Finding::Settles(RefundSettlement::Succeeded {
            provider_refund_id: refund.id.clone(),
            refunded_at: OffsetDateTime::from_unix_timestamp(refund.created)
                .unwrap_or_else(|_| OffsetDateTime::now_utc()),
        }),
        RefundState::Failed | RefundState::Canceled => Finding::Settles(RefundSettlement::Failed {
            code: "refund_failed".to_owned(),
            message: refund.failure_reason.clone().map_or_else(
                || "The provider failed the refund.".to_owned(),
                |reason| format!("The provider failed the refund: {reason}."),
            ),
            provider_refund_id: Some(refund.id.clone()),
        }),
    }
}
