//! `POST /webhooks/stripe`: Stripe's signed events about PaymentIntents and refunds, applied by the
//! same rules as the simulator protocol's webhooks ([`crate::webhooks::apply`],
//! [`crate::refund_webhooks::apply_reported`]).
//!
//! A delivery is verified with `Stripe-Signature` against every `webhooks.stripe_secrets` before its
//! body is parsed, and deduplicated by the event's `evt_…` id. Stripe sends many event types; only a
//! PaymentIntent that has finished (succeeded, or failed for good) is evidence about a payment, only
//! a Refund is evidence about a refund, and every other event is acknowledged and left alone, so
//! Stripe stops resending it.
//!
//! A Connect event names the connected account it happened in; its charge or refund is that
//! account's, and is evidence only about a payment or refund made in the same account
//! (`oncepay_store::settlement::same_account`, `oncepay_store::refunds::settling::same_account`).
//! An event from any other account (the platform's own included) changes nothing and is not
//! recorded: whoever holds an account can put any payment's name on an intent of theirs. It is
//! counted and logged (`other_account`).
//!
//! What the refund events are, from Stripe's API reference and changelog:
//! - `refund.created`, `refund.updated`, `refund.failed` ("Occurs whenever a refund has failed")
//!   and `charge.refund.updated` carry the Refund as `data.object`, as it was when the event
//!   happened; since 2024-10-28.acacia the `refund.*` events are sent for every refund, a charge's
//!   included. A Refund's `payment_intent` names the intent refunded (oncepay books a Stripe
//!   payment's charge as its `pi_…`); its `status` is `pending`, `requires_action`, `succeeded`,
//!   `failed` or `canceled` (`StripeRefund::state`).
//! - `charge.refunded` ("Occurs whenever a charge is refunded, including partial refunds. Listen to
//!   `refund.created` for information about the refund") carries the Charge, whose `refunds` list
//!   is only there when expanded: since 2022-11-15 a Charge no longer expands it by default. A
//!   `charge.refunded` that lists no refunds is acknowledged and ignored; which refund it was is
//!   never guessed from its amounts.
//! - A refund can fail after it succeeded (a closed card): Stripe then sends `refund.failed` for a
//!   refund oncepay may have booked as succeeded. A final refund never moves; the delivery is
//!   recorded as a `conflict` and opens a conflict for an operator (`RefundVerdict::Conflicts`).
//! - The Event's `account` is "the connected account that originates the event", present only on
//!   events from connected accounts.

use actix_web::{HttpRequest, HttpResponse, web};
use oncepay_domain::strict_json;
use oncepay_http::problem::{Problem, ProblemType};
use oncepay_provider::stripe::signature;
use oncepay_provider::stripe::wire::{Event, Settled, StripeRefund, event_types};
use oncepay_provider::wire::{EventType, WebhookEvent};
use oncepay_provider::{Charge, ChargeStatus, Refund};
use serde_json::json;
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::refund_webhooks::apply_reported;
use crate::webhook_outcome::{Handled, respond_to};
use crate::webhooks::{self, WebhookState};

/// The path Stripe delivers to: the URL to give the Stripe webhook endpoint.
pub const PATH: &str = "/webhooks/stripe";

/// Mounts the endpoint; the app must hold `web::Data<WebhookState>`.
pub fn configure(config: &mut web::ServiceConfig) {
    config.service(
        web::resource(PATH).route(web::post().to(receive)).default_service(web::to(webhooks::method_not_allowed)),
    );
}

#[tracing::instrument(name = "webhook.receive", skip_all, fields(webhook.id, webhook.verdict, provider = "stripe"))]
async fn receive(request: HttpRequest, payload: web::Payload, state: web::Data<WebhookState>) -> HttpResponse {
    let (verdict, response) = respond(&request, payload, &state).await;
    tracing::Span::current().record("webhook.verdict", verdict);
    metrics::counter!(crate::metrics::WEBHOOKS, "verdict" => verdict).increment(1);
    response
}

async fn respond(request: &HttpRequest, payload: web::Payload, state: &WebhookState) -> (&'static str, HttpResponse) {
    let body = match webhooks::read_body(payload, state.max_body_bytes).await {
        Ok(body) => body,
        Err(problem) => return ("invalid_body", problem.to_response()),
    };
    let header = request.headers().get("stripe-signature").and_then(|v| v.to_str().ok());
    let now = OffsetDateTime::now_utc().unix_timestamp();
    if let Err(error) = signature::verify(&state.stripe_secrets, header, &body, now, state.tolerance_secs) {
        tracing::warn!(error = %error, "rejected a Stripe webhook delivery");
        return ("invalid_signature", Problem::new(ProblemType::InvalidSignature, error.to_string()).to_response());
    }
    // Read strictly: an event that names a member twice is a 400, whichever of the two would count.
    let event: Event = match strict_json::from_slice(&body) {
        Ok(event) => event,
        Err(error) => {
            let detail = format!("the body is not a Stripe event: {error}");
            return ("invalid_body", Problem::new(ProblemType::InvalidWebhook, detail).to_response());
        }
    };
    tracing::Span::current().record("webhook.id", event.id.as_str());
    match event.refunds() {
        Some(Ok(refunds)) => return apply_refunds(&state.pool, &event, &refunds).await,
        Some(Err(error)) => {
            let detail = format!("the event's object is not a Stripe Refund or Charge: {error}");
            return ("invalid_body", Problem::new(ProblemType::InvalidWebhook, detail).to_response());
        }
        None => {}
    }
    let intent = match event.payment_intent() {
        Some(Ok(intent)) => intent,
        Some(Err(error)) => {
            let detail = format!("the event's object is not a PaymentIntent: {error}");
            return ("invalid_body", Problem::new(ProblemType::InvalidWebhook, detail).to_response());
        }
        None => return ignored(),
    };
    // The key is the one oncepay derives from the payment the intent's metadata names, so an intent
    // made for another payment can never settle this one.
    let charge = match intent.settled_by_metadata() {
        Settled::Final(charge) => Charge { account: event.account.clone(), ..*charge },
        // `processing`, `requires_action` and the like prove nothing yet; a later event will.
        Settled::NotFinal(_) => return ignored(),
    };
    let event_type = match charge.status {
        ChargeStatus::Succeeded => EventType::ChargeSucceeded,
        ChargeStatus::Failed => EventType::ChargeFailed,
    };
    let charge_event = WebhookEvent { event_type, created: event.created, data: charge };
    webhooks::apply_and_respond(&state.pool, &event.id, &charge_event).await
}

fn ignored() -> (&'static str, HttpResponse) {
    ("ignored", HttpResponse::Ok().json(json!({ "outcome": "ignored" })))
}

/// Applies the refunds a verified event reports, each as the simulator's refund events are
/// applied ([`apply_reported`]): the one Refund of a refund event, under the event's id; or each
/// refund a `charge.refunded` event's Charge lists, under the event's id and the refund's (one
/// `webhook_events` row holds one outcome, and one Charge may list several refunds of one
/// payment). A redelivered event is then a duplicate, refund by refund.
///
/// A refund event answers as the simulator's do; a `charge.refunded` answers with each refund's
/// outcome and, as its own, the most telling of them ([`most_telling`]). An error stops at once:
/// Stripe delivers the event again, and the refunds already applied are then duplicates.
async fn apply_refunds(pool: &PgPool, event: &Event, refunds: &[StripeRefund]) -> (&'static str, HttpResponse) {
    let listed_by_charge = event.event_type == event_types::CHARGE_REFUNDED;
    if refunds.is_empty() {
        // Only a `charge.refunded` can list none. Its amounts could match several refunds; its
        // refunds are settled by their own `refund.*` events or by lookups.
        tracing::info!("a charge.refunded event lists no refunds: acknowledged and ignored");
        return ignored();
    }
    let mut outcomes = Vec::with_capacity(refunds.len());
    for refund in refunds {
        let Some(reported) = as_booked(refund, event.account.as_deref()) else {
            // Without the intent it refunds it cannot be compared with what the refund asked for,
            // and judging it anyway would dead-letter a refund that may well be as asked.
            tracing::warn!(provider_refund.id = %refund.id, "a Stripe refund that names no PaymentIntent is left alone");
            outcomes.push((refund.id.as_str(), "ignored"));
            continue;
        };
        let webhook_id = if listed_by_charge { format!("{}/{}", event.id, refund.id) } else { event.id.clone() };
        match apply_reported(pool, &webhook_id, &event.event_type, &reported).await {
            Ok(handled) => {
                tracing::info!(provider_refund.id = %refund.id, outcome = handled.label(), "refund webhook applied");
                outcomes.push((refund.id.as_str(), handled.label()));
            }
            Err(error) => return respond_to(Err(error)),
        }
    }
    let outcome = most_telling(outcomes.iter().map(|(_, outcome)| *outcome));
    if !listed_by_charge {
        return (outcome, HttpResponse::Ok().json(json!({ "outcome": outcome })));
    }
    let each: Vec<_> = outcomes.iter().map(|(id, outcome)| json!({ "refund": id, "outcome": outcome })).collect();
    (outcome, HttpResponse::Ok().json(json!({ "outcome": outcome, "refunds": each })))
}

/// A Stripe refund as oncepay books it: of the PaymentIntent it names, held by the event's
/// connected account (`None`: the platform's own). `None` when it names no PaymentIntent.
fn as_booked(refund: &StripeRefund, account: Option<&str>) -> Option<Refund> {
    let payment_intent = refund.payment_intent.as_ref()?;
    Some(refund.to_refund(payment_intent.id(), account))
}

/// Of several refunds' outcomes, the one to report for them all: what needs an operator first, then
/// what changed a refund, then what changed nothing. An outcome not listed here comes first.
fn most_telling<'a>(outcomes: impl Iterator<Item = &'a str>) -> &'a str {
    const FIRST_TO_LAST: [&str; 10] = [
        "conflict",
        "applied",
        "dead_lettered",
        "unfinished",
        "not_unknown",
        "already_terminal",
        Handled::Duplicate.label(),
        Handled::OtherAccount.label(),
        Handled::NotOurs.label(),
        "ignored",
    ];
    let rank = |outcome: &str| FIRST_TO_LAST.iter().position(|known| *known == outcome).unwrap_or(0);
    outcomes.min_by_key(|outcome| rank(outcome)).unwrap_or("ignored")
}

#[cfg(test)]
mod tests {
    use super::most_telling;

    #[test]
    fn several_refunds_report_the_outcome_to_look_at_first() {
        let cases: [(&[&str], &str); 7] = [
            (&["not_ours", "applied", "already_terminal"], "applied"),
            (&["applied", "conflict", "duplicate"], "conflict"),
            (&["dead_lettered", "unfinished"], "dead_lettered"),
            (&["duplicate", "not_ours", "ignored"], "duplicate"),
            (&["other_account", "not_ours", "ignored"], "other_account"),
            (&["applied", "an_outcome_from_the_future"], "an_outcome_from_the_future"),
            (&[], "ignored"),
        ];
        for (outcomes, expected) in cases {
            assert_eq!(most_telling(outcomes.iter().copied()), expected, "{outcomes:?}");
        }
    }
}
