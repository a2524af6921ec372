//! What applying a verified webhook event did ([`Handled`]) or why it could not be applied
//! ([`ApplyError`]), and the answer the provider gets for it ([`respond_to`]): shared by the charge
//! and refund events of every provider's endpoint.

use actix_web::HttpResponse;
use oncepay_domain::ids::{PaymentId, RefundId};
use oncepay_http::problem::{Problem, ProblemType};
use oncepay_service::telemetry;
use oncepay_store::StoreError;
use oncepay_store::transitions::TransitionError;
use serde_json::json;

/// What applying a verified event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// The event was recorded; the label says what it did (see [`crate::verdict::ChargeVerdict::label`]).
    Recorded(&'static str),
    /// This `webhook-id` was seen before: nothing changed.
    Duplicate,
    /// The charge or refund names no payment or refund of ours.
    NotOurs,
    /// The charge or refund is held by another provider account than the payment's: nothing was
    /// recorded or changed.
    OtherAccount,
}

impl Handled {
    /// The label for the response, the logs and `oncepay_reconciler_webhooks_total{verdict}`.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Recorded(label) => label,
            Self::Duplicate => "duplicate",
            Self::NotOurs => "not_ours",
            Self::OtherAccount => "other_account",
        }
    }
}

/// Why a verified event could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The event contradicts itself; the provider must not send it again as is.
    #[error("{0}")]
    Invalid(String),
    /// The database failed; the provider should retry later.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A transition the state machine refused: a bug.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// The locked payment changed status anyway: a bug.
    #[error("payment {0} moved while it was locked")]
    MovedWhileLocked(PaymentId),
    /// The locked refund changed status anyway: a bug.
    #[error("refund {0} moved while it was locked")]
    RefundMovedWhileLocked(RefundId),
}

/// The metrics label and the response for an event applied, or not: 2xx once it is recorded, 400
/// for an event that contradicts itself, 503 while the database is unavailable, else 500.
pub(crate) fn respond_to(applied: Result<Handled, ApplyError>) -> (&'static str, HttpResponse) {
    match applied {
        Ok(handled) => (handled.label(), HttpResponse::Ok().json(json!({ "outcome": handled.label() }))),
        Err(ApplyError::Invalid(detail)) => {
            tracing::warn!(detail, "a signed webhook cannot be applied");
            ("invalid_body", Problem::new(ProblemType::InvalidWebhook, detail).to_response())
        }
        Err(ApplyError::Store(error)) if error.is_unavailable() => {
            tracing::warn!(error = %telemetry::error_chain(&error), "webhook not applied: the database is unavailable");
            let detail = "the event could not be recorded; deliver it again later";
            ("unavailable", Problem::new(ProblemType::ServiceUnavailable, detail).with_retry_after(5).to_response())
        }
        Err(error) => {
            tracing::error!(error = format!("{:#}", anyhow::Error::new(error)), "applying a webhook failed");
            ("error", Problem::new(ProblemType::Internal, "the event could not be recorded").to_response())
        }
    }
}
