//! The operations API's refunds (docs/operators.md, "Operators"): an operator's refund of a succeeded
//! payment, always proposed for a second operator's approval; and the refunds automation gave up on
//! (`dead_lettered`), listed, shown, resent and settled as dead-lettered payments are.
//!
//! - `POST /v1/payments/{id}/refund` `{amount?, refund_reason?, reason}`: 202 with the proposal;
//! - `GET /v1/dead-letters/refunds`: the dead-lettered refunds the caller may see, oldest first;
//! - `GET /v1/refunds/{id}`: a refund and its history, with the evidence of each change (masked for
//!   viewers; the read is audited);
//! - `POST /v1/refunds/{id}/retry` `{reason, outside_key_window?}`: resent at once inside the
//!   provider's key window (200), proposed past it or when every resend needs approval (202);
//! - `POST /v1/refunds/{id}/resolve` `{as, reason, provider_refund_id?, amount?, currency?,
//!   refunded_at?, force?}`: settling as `succeeded` or `failed`, proposed (202); or, with `as:
//!   acknowledged`, closing the conflict on a final refund at once (200).
//!
//! Proposals are approved, rejected and withdrawn through `/v1/proposals/{id}/…`, as every other.

use std::str::FromStr;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, RefundId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::refund::RefundReason;
use oncepay_http::problem::{Problem, ProblemType};
use oncepay_provider::ConfiguredProvider;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::json;

use super::signing_in::{Caller, caller};
use super::{OperatorsState, acted, body, change, connection, ok, payment_id, problem, propose, respond};
use crate::dead_letters::actions::require_reason;
use crate::dead_letters::queries;
use crate::dead_letters::refunds::{self as dead_refunds, AskedRefundResolution, RefundRetry};
use crate::operator_error::OperatorError;
use crate::operators::audit::{self, Entry, Outcome};
use crate::operators::proposals::Effect;
use crate::operators::proposals::{Proposed, Subject};
use crate::operators::refunds as operator_refunds;
use crate::operators::reports::Acted;
use crate::operators::{Role, masking};

/// The routes.
pub(super) fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/v1/payments/{payment_id}/refund", web::post().to(refund))
        .route("/v1/dead-letters/refunds", web::get().to(dead_lettered))
        .route("/v1/refunds/{refund_id}", web::get().to(show))
        .route("/v1/refunds/{refund_id}/retry", web::post().to(retry))
        .route("/v1/refunds/{refund_id}/resolve", web::post().to(resolve));
}

fn refund_id(text: &str) -> Result<RefundId, Problem> {
    RefundId::from_str(text).map_err(|_| Problem::new(ProblemType::NotFound, format!("there is no refund {text:?}")))
}

/// A refund reason by its name; none when `name` is absent or empty.
pub fn refund_reason(name: Option<&str>) -> Result<Option<RefundReason>, OperatorError> {
    let Some(name) = name.map(str::trim).filter(|name| !name.is_empty()) else { return Ok(None) };
    let names: Vec<&str> = RefundReason::ALL.iter().map(|reason| reason.as_str()).collect();
    RefundReason::parse(name).map(Some).ok_or_else(|| {
        OperatorError::Invalid(format!(
            "refund_reason {name:?} is not a refund reason: use one of {}",
            names.join(", ")
        ))
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RefundBody {
    /// Minor units; absent: all that is left.
    amount: Option<i64>,
    /// `duplicate`, `fraudulent` or `requested_by_customer`.
    refund_reason: Option<String>,
    reason: String,
}

/// `POST /v1/payments/{id}/refund`: proposes giving money back from a succeeded payment (202), for
/// an approver.
async fn refund(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let payment_id = payment_id(&path)?;
            let entry = Entry::new("payment.refund", Outcome::Done).on_payment(payment_id);
            let outcome = async {
                let asked: RefundBody = body(&bytes)?;
                let reason = refund_reason(asked.refund_reason.as_deref())?;
                refund_payment(&state, &caller, payment_id, asked.amount, reason, &asked.reason).await
            };
            change(&state, &caller, entry, outcome.await.map(acted)).await
        }
        .await,
    )
}

/// Proposes refunding `amount` (all that is left when `None`) of `payment_id`, as the caller, for
/// an approver. A refund the intake would refuse now is refused at once, with its reason. A refused
/// change is the caller's to record ([`change`]).
pub async fn refund_payment(
    state: &OperatorsState,
    caller: &Caller,
    payment_id: PaymentId,
    amount: Option<i64>,
    refund_reason: Option<RefundReason>,
    reason: &str,
) -> Result<Acted, OperatorError> {
    caller.account.require(Role::Operator, "refund a payment")?;
    let amount =
        amount.map(Amount::new).transpose().map_err(|error| OperatorError::Invalid(format!("amount {error}")))?;
    let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
    let tenants = caller.account.scope.to_column();
    let tenant_id = queries::payment_tenant(&mut conn, tenants.as_deref(), payment_id)
        .await?
        .ok_or_else(|| OperatorError::NotFound(format!("there is no payment {payment_id}")))?;
    let refunds = operator_refunds::of_payment(&mut conn, tenant_id, payment_id).await?;
    let action = Proposed::Refund {
        amount,
        comes_to: amount.map_or_else(|| refunds.left(), Amount::minor_units),
        currency: refunds.currency,
        reason: refund_reason,
    };
    propose(state, &mut conn, caller, Subject::Payment(payment_id), &action, reason).await
}

/// `GET /v1/dead-letters/refunds`: the refunds automation gave up on, of the tenants the caller may
/// see, oldest first, their evidence masked.
async fn dead_lettered(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let tenants = caller.account.scope.to_column();
            let mut conn = connection(&state).await?;
            let mut list = dead_refunds::list(&mut conn, tenants.as_deref(), None).await.map_err(problem)?;
            // A list is not a read of one payment: it shows no customer data, to anyone.
            for refund in &mut list {
                refund.evidence = refund.evidence.as_ref().map(masking::evidence);
            }
            Ok(ok(StatusCode::OK, &list))
        }
        .await,
    )
}

/// `GET /v1/refunds/{id}`: the refund and its history, the evidence masked for viewers. The read is
/// audited, on the refund's payment.
async fn show(state: web::Data<OperatorsState>, request: HttpRequest, path: web::Path<String>) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let refund_id = refund_id(&path)?;
            let tenants = caller.account.scope.to_column();
            let mut conn = connection(&state).await?;
            let mut detail =
                operator_refunds::detail(&mut conn, tenants.as_deref(), refund_id).await.map_err(problem)?;
            let masked = caller.account.role == Role::Viewer;
            if masked {
                for change in &mut detail.history {
                    change.detail = change.detail.as_ref().map(masking::evidence);
                }
            }
            let read = Entry::new("payment.read", Outcome::Done)
                .payment(detail.tenant_id, detail.payment_id)
                .detail(json!({ "refund_id": refund_id, "customer_data": if masked { "masked" } else { "shown" } }));
            audit::record(&mut conn, &caller.actor(), &read).await.map_err(problem)?;
            Ok(ok(StatusCode::OK, &detail))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    reason: String,
    #[serde(default)]
    outside_key_window: bool,
}

/// `POST /v1/refunds/{id}/retry`: resends a dead-lettered refund (200), or proposes the resend
/// (202) when it is past the provider's key window or every resend needs approval.
async fn retry(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let refund_id = refund_id(&path)?;
            let entry = Entry::new("refund.retry", Outcome::Done).detail(json!({ "refund_id": refund_id }));
            let outcome = async {
                let asked: RetryBody = body(&bytes)?;
                retry_refund(&state, &caller, refund_id, &asked.reason, asked.outside_key_window).await
            };
            change(&state, &caller, entry, outcome.await.map(acted)).await
        }
        .await,
    )
}

/// Resends dead-lettered refund `refund_id` at once, with its audit row, or proposes the resend
/// when it is past the provider's key window or every resend needs approval. A refused change is
/// the caller's to record ([`change`]).
pub async fn retry_refund(
    state: &OperatorsState,
    caller: &Caller,
    refund_id: RefundId,
    reason: &str,
    outside_key_window: bool,
) -> Result<Acted, OperatorError> {
    caller.account.require(Role::Operator, "retry a refund")?;
    let reason = require_reason(reason)?;
    let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
    let tenants = caller.account.scope.to_column();
    if outside_key_window || state.retries_need_approval {
        let (_, payment_id, _) = dead_refunds::locate(&mut conn, tenants.as_deref(), refund_id).await?;
        let action = Proposed::RefundRetry { refund_id, outside_key_window };
        return propose(state, &mut conn, caller, Subject::Payment(payment_id), &action, reason).await;
    }
    let (tenant_id, _, _) = dead_refunds::locate(&mut conn, tenants.as_deref(), refund_id).await?;
    let mut tx = sqlx::Acquire::begin(&mut *conn).await.context("cannot start a transaction")?;
    let seen = dead_refunds::snapshot(&mut tx, tenant_id, refund_id).await?;
    let operator = caller.account.actor()?;
    let resend = RefundRetry {
        tenant_id: seen.tenant_id,
        refund_id,
        operator: &operator,
        reason,
        resend_horizon: state.resend_horizon,
        outside_key_window: false,
    };
    let done = dead_refunds::retry(&mut tx, &resend).await?;
    let entry = Entry::new("refund.retry", Outcome::Done)
        .payment(seen.tenant_id, seen.payment_id)
        .reason(reason)
        .before(json!(seen))
        .after(json!(done))
        .detail(json!({ "refund_id": refund_id }));
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the retry")?;
    Ok(Acted::Done(Effect::Refund(done)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    /// `succeeded` or `failed`.
    #[serde(rename = "as")]
    outcome: ResolveAs,
    reason: String,
    provider_refund_id: Option<String>,
    amount: Option<Amount>,
    #[serde(default, deserialize_with = "currency_in_any_case")]
    currency: Option<Currency>,
    refunded_at: Option<String>,
    #[serde(default)]
    force: bool,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ResolveAs {
    Succeeded,
    Failed,
    Acknowledged,
}

/// A currency code in upper or lower case: the provider's refund, which the operator copies it
/// from, may spell it as Stripe does (`eur`).
fn currency_in_any_case<'de, D: Deserializer<'de>>(input: D) -> Result<Option<Currency>, D::Error> {
    let Some(code) = Option::<String>::deserialize(input)? else { return Ok(None) };
    Currency::parse(&code.to_ascii_uppercase())
        .map(Some)
        .map_err(|error| D::Error::custom(format!("currency {code:?} {error}")))
}

/// `POST /v1/refunds/{id}/resolve`: proposes settling a dead-lettered refund as succeeded or failed
/// (202), for an approver.
async fn resolve(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let refund_id = refund_id(&path)?;
            let asked: Result<ResolveBody, _> = body(&bytes);
            let action = match &asked {
                Ok(ResolveBody { outcome: ResolveAs::Acknowledged, .. }) => "refund.acknowledge",
                _ => "refund.resolve",
            };
            let entry = Entry::new(action, Outcome::Done).detail(json!({ "refund_id": refund_id }));
            let outcome = async {
                let asked = asked?;
                let provider_refund_id = asked.provider_refund_id.filter(|id| !id.trim().is_empty());
                let decision = match asked.outcome {
                    ResolveAs::Acknowledged => {
                        return acknowledge_refund(&state, &caller, refund_id, &asked.reason).await;
                    }
                    ResolveAs::Failed => AskedRefundResolution::Failed { provider_refund_id, force: asked.force },
                    ResolveAs::Succeeded => AskedRefundResolution::Succeeded {
                        provider_refund_id,
                        amount: asked.amount,
                        currency: asked.currency,
                        refunded_at: asked.refunded_at,
                    },
                };
                resolve_refund(&state, &caller, refund_id, decision, &asked.reason).await
            };
            change(&state, &caller, entry, outcome.await.map(acted)).await
        }
        .await,
    )
}

/// Proposes settling dead-lettered refund `refund_id` as succeeded (with the provider's refund,
/// looked up unless given whole) or failed, for an approver. A refused change is the caller's to
/// record ([`change`]).
pub async fn resolve_refund(
    state: &OperatorsState,
    caller: &Caller,
    refund_id: RefundId,
    asked: AskedRefundResolution,
    reason: &str,
) -> Result<Acted, OperatorError> {
    caller.account.require(Role::Operator, "resolve a refund")?;
    require_reason(reason)?;
    let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
    // Scope first: looking the provider's refund up must not tell a limited operator that it exists.
    let tenants = caller.account.scope.to_column();
    let (tenant_id, payment_id, status) = dead_refunds::locate(&mut conn, tenants.as_deref(), refund_id).await?;
    dead_refunds::require_dead_lettered(refund_id, status)?;
    let provider = || {
        ConfiguredProvider::new(&state.provider)
            .context("cannot build the provider client")
            .map_err(OperatorError::Failed)
    };
    let resolution = dead_refunds::resolution(&mut conn, provider, tenant_id, refund_id, asked).await?;
    let action = Proposed::refund_resolution(refund_id, resolution);
    propose(state, &mut conn, caller, Subject::Payment(payment_id), &action, reason).await
}

/// Closes the open conflict on final refund `refund_id` at once, as acknowledged, with its audit row
/// (`refund.acknowledge`): the refund keeps its status and no money moves, so no second operator is
/// needed, as for a payment's conflict. A refused change is the caller's to record ([`change`]).
pub async fn acknowledge_refund(
    state: &OperatorsState,
    caller: &Caller,
    refund_id: RefundId,
    reason: &str,
) -> Result<Acted, OperatorError> {
    caller.account.require(Role::Operator, "acknowledge a refund's conflict")?;
    let reason = require_reason(reason)?;
    let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
    let tenants = caller.account.scope.to_column();
    let (tenant_id, _, _) = dead_refunds::locate(&mut conn, tenants.as_deref(), refund_id).await?;
    let mut tx = sqlx::Acquire::begin(&mut *conn).await.context("cannot start a transaction")?;
    let seen = dead_refunds::snapshot(&mut tx, tenant_id, refund_id).await?;
    let operator = caller.account.actor()?;
    let done = dead_refunds::acknowledge(&mut tx, tenant_id, refund_id, &operator, reason).await?;
    let entry = Entry::new("refund.acknowledge", Outcome::Done)
        .payment(seen.tenant_id, seen.payment_id)
        .reason(reason)
        .before(json!(seen))
        .after(json!(done))
        .detail(json!({ "refund_id": refund_id }));
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the acknowledgement")?;
    Ok(Acted::Done(Effect::Refund(done)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolve_body_reads_its_money_typed_and_refuses_a_bad_amount_or_currency_by_name() {
        let resolve = |amount: serde_json::Value, currency: &str| {
            let text = json!({
                "as": "succeeded", "reason": "seen", "provider_refund_id": "re_1", "amount": amount,
                "currency": currency, "refunded_at": "2026-01-10T12:00:00Z",
            })
            .to_string();
            body::<ResolveBody>(text.as_bytes())
        };

        let upper = resolve(json!(500), "EUR").unwrap();
        let lower = resolve(json!(500), "eur").unwrap();
        let zero = resolve(json!(0), "EUR").unwrap_err().to_string();
        let unknown = resolve(json!(500), "ABC").unwrap_err().to_string();

        assert_eq!((upper.amount, upper.currency), (Amount::new(500).ok(), Currency::parse("EUR").ok()));
        assert_eq!(lower.currency, upper.currency, "a provider's lower-case code is the same currency");
        assert!(zero.contains("amount 0 must be an integer number of minor units"), "{zero}");
        assert!(unknown.contains(r#"currency "ABC" is not an active ISO 4217 currency code"#), "{unknown}");
    }
}
