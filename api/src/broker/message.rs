//! A payment request that came as a broker's message, taken by the same intake as
//! `POST /v1/payments`, and what the consumer is to do with the message afterwards ([`Outcome`]).
//!
//! The message is the HTTP request in other clothes: its body is the request's body, its
//! `idempotency-key` header the request's key, and the broker user that published it (the
//! message's `user_id`, which the broker checks) stands for the API key. From there on it is the
//! HTTP request: the same rate limit, the same checks in the same order, the same fingerprint (a
//! message and an HTTP request with one key and one body are one payment), the same group commit.
//! Nothing here knows which broker the message came from.

use actix_web::body::{self, MessageBody};
use oncepay_http::problem::Problem;
use oncepay_service::telemetry::{self, TraceContext};
use tracing::Span;

use crate::create::{self, Responded};
use crate::create_payment::CreatePayment;
use crate::errors::ApiError;
use crate::idempotent_request::IdempotentRequest;
use crate::state::AppState;

/// A payment request, as a broker delivered it.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// The broker user that published it, as the broker vouches (`user_id`); `None` if it has none.
    pub user: Option<&'a str>,
    /// Its `idempotency-key` header, if it has one.
    pub key: Option<&'a [u8]>,
    /// Its body: the JSON of `POST /v1/payments`.
    pub body: &'a [u8],
    /// Its `traceparent` header, if it has one: the producer's trace, which the message's span
    /// continues.
    pub traceparent: Option<&'a str>,
    /// Its `tracestate` header, if it has one.
    pub tracestate: Option<&'a str>,
}

/// What to do with a message, once intake has seen it.
#[derive(Debug)]
pub enum Outcome {
    /// Its payment is written (or was already: `replayed`): acknowledge it, and answer a producer
    /// that asked with `resource`, the payment as `GET /v1/payments/{id}` would show it then.
    Taken {
        /// Whether an earlier message or request with its key made the payment.
        replayed: bool,
        /// The payment, as JSON.
        resource: Vec<u8>,
    },
    /// It can never become a payment: dead-letter it with `reason` and the problem HTTP would have
    /// answered, then acknowledge it. Nothing was written.
    Refused {
        /// Why, as a name: `idempotency_key_reused`, `invalid_fields`, …
        reason: &'static str,
        /// The problem document (`application/problem+json`).
        problem: Problem,
    },
    /// Not now: its key is being written by another request, or its tenant is over its rate.
    /// Deliver it again after the broker's delay; never dead-letter it for this. Nothing was
    /// written.
    Later {
        /// Why, as a name: `idempotency_key_in_use`, `rate_limited`.
        reason: &'static str,
    },
    /// The store cannot be reached: keep the message, unacknowledged, and try it again after a
    /// pause. Nothing was written.
    StoreUnavailable,
    /// Something unexpected failed: return it to the queue, where it counts against the queue's
    /// delivery limit.
    Failed(String),
}

impl Outcome {
    /// The `outcome` label of the broker's messages counter.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Taken { replayed: false, .. } => "created",
            Self::Taken { replayed: true, .. } => "replayed",
            Self::Refused { .. } => "dead_lettered",
            Self::Later { .. } => "delayed",
            Self::StoreUnavailable => "store_unavailable",
            Self::Failed(_) => "error",
        }
    }
}

/// Takes `message` as `POST /v1/payments` takes a request, and says what is to become of it.
pub async fn take(state: &AppState, message: Message<'_>) -> Outcome {
    let span =
        tracing::info_span!("broker.payment", tenant.id = tracing::field::Empty, payment.id = tracing::field::Empty);
    // The producer's trace becomes the span's parent, as a caller's does over HTTP, so the outbox
    // row, written with this span's context, joins that trace.
    if let Some(traceparent) = message.traceparent {
        telemetry::continue_trace(&span, &TraceContext::received(traceparent, message.tracestate));
    }
    let result = admitted(state, &span, message).await;
    match result {
        Ok(responded) => taken(responded).await,
        Err(error) => Outcome::of(&error),
    }
}

/// Admits the message's user and reads the message, then hands it on to the create shell.
async fn admitted(state: &AppState, span: &Span, message: Message<'_>) -> Result<Responded, ApiError> {
    let caller = state.auth.broker_caller(message.user, &state.connections).await?;
    span.record("tenant.id", tracing::field::display(caller.tenant_id));
    state.limits.admit(&caller)?;
    let idempotent = IdempotentRequest::of_message(message.key, message.body, state.intake.max_body_bytes)?;
    create::take_read::<CreatePayment>(state, span.clone(), caller, (), idempotent).await
}

/// A written or replayed payment, with the resource its HTTP response carries.
async fn taken(responded: Responded) -> Outcome {
    let replayed = responded.replayed();
    match body::to_bytes(responded.into_response().into_body().boxed()).await {
        Ok(resource) => Outcome::Taken { replayed, resource: resource.to_vec() },
        Err(error) => Outcome::Failed(format!("the response could not be read: {error}")),
    }
}

impl Outcome {
    /// What becomes of a message that intake refused with `error`.
    fn of(error: &ApiError) -> Self {
        let refused = |reason| Self::Refused { reason, problem: error.problem() };
        match error {
            ApiError::KeyReused { .. } => refused("idempotency_key_reused"),
            ApiError::Unauthorized(_) => refused("unknown_user"),
            ApiError::MissingIdempotencyKey => refused("missing_idempotency_key"),
            ApiError::RepeatedIdempotencyKey | ApiError::InvalidIdempotencyKey(_) => refused("invalid_idempotency_key"),
            ApiError::PayloadTooLarge { .. } => refused("body_too_large"),
            ApiError::MalformedJson(_) | ApiError::UnreadableBody | ApiError::UnsupportedMediaType => {
                refused("malformed_json")
            }
            ApiError::InvalidFields(_) => refused("invalid_fields"),
            ApiError::NoProviderAccount => refused("no_provider_account"),
            ApiError::KeyInUse | ApiError::RefundsInUse => Self::Later { reason: "idempotency_key_in_use" },
            ApiError::RateLimited { .. } => Self::Later { reason: "rate_limited" },
            ApiError::Unavailable(_) | ApiError::KeyCheckBusy => Self::StoreUnavailable,
            other => Self::Failed(other.to_string()),
        }
    }
}
