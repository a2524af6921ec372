//! `POST /webhooks/stripe`: Stripe's signed events about PaymentIntents, applied by the same rules as
//! the simulator protocol's webhooks ([`crate::webhooks::apply`]).
//!
//! A delivery is verified with `Stripe-Signature` against every `webhooks.stripe_secrets` before its
//! body is parsed, and deduplicated by the event's `evt_…` id. Stripe sends many event types; only a
//! PaymentIntent that has finished (succeeded, or failed for good) is evidence about a payment, and
//! every other event is acknowledged and left alone, so Stripe stops resending it.
//!
//! A Connect event names the connected account it happened in; its charge is that account's, and
//! settles only a payment charged to the same account (`oncepay_store::settlement`). An event from
//! any other account is recorded as evidence for an operator, never booked.

use actix_web::{HttpRequest, HttpResponse, web};
use oncepay_domain::strict_json;
use oncepay_http::problem::{Problem, ProblemType};
use oncepay_provider::stripe::signature;
use oncepay_provider::stripe::wire::{Event, Settled};
use oncepay_provider::wire::{EventType, WebhookEvent};
use oncepay_provider::{Charge, ChargeStatus};
use serde_json::json;
use time::OffsetDateTime;

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
