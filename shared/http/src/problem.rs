//! RFC 9457 problem details: the one shape of every error response oncepay sends.
//!
//! Each kind of problem has a stable `type` URI and title listed in [`ProblemType`]; clients branch
//! on the `type`, humans read `title` and `detail`. A problem never carries a stack trace, SQL text
//! or any other internal: the detail is written for the client, and internal causes are logged at
//! the boundary instead.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use serde::Serialize;

use oncepay_domain::payment_request::FieldError;

/// The media type of a problem document.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// Where the problem types are documented; every `type` URI starts with this.
pub const TYPE_BASE: &str = "https://oncepay.dev/problems/";

/// Every kind of problem oncepay reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemType {
    /// 401: no API key, or not a valid one.
    Unauthorized,
    /// 400: the `Idempotency-Key` header is missing.
    MissingIdempotencyKey,
    /// 400: the `Idempotency-Key` header is malformed.
    InvalidIdempotencyKey,
    /// 400: the body is not JSON, or a field is wrong.
    InvalidRequest,
    /// 400: payments are charged in each tenant's own provider account (Stripe Connect), and this
    /// tenant has none.
    NoProviderAccount,
    /// 413: the body is larger than allowed.
    PayloadTooLarge,
    /// 415: the body is not `application/json`.
    UnsupportedMediaType,
    /// 422: the key was used before with a different request.
    IdempotencyKeyReused,
    /// 409: another request with the same key is being processed right now.
    IdempotencyKeyInUse,
    /// 409: only a `succeeded` payment can be refunded, and this one is not.
    PaymentNotRefundable,
    /// 422: the payment's refunds already add up to its charge.
    NothingToRefund,
    /// 422: the refund asks for more than is left of the payment's charge.
    RefundExceedsPayment,
    /// 429: the tenant's rate limit is exhausted.
    RateLimited,
    /// 404: nothing here (or it belongs to someone else).
    NotFound,
    /// 403: the operator's role does not allow this (operations API).
    Forbidden,
    /// 409: the action does not apply to the thing's current state; nothing changed (operations
    /// API).
    Refused,
    /// 405: the resource exists but not with this method.
    MethodNotAllowed,
    /// 503: the key store cannot be reached; nothing was written.
    ServiceUnavailable,
    /// 500: a bug; nothing about it is shown.
    Internal,
    /// 401: a webhook whose signature or timestamp does not verify.
    InvalidSignature,
    /// 400: a webhook that verified but cannot be understood.
    InvalidWebhook,
}

impl ProblemType {
    /// Every problem type, for documentation and tests.
    pub const ALL: [Self; 21] = [
        Self::Unauthorized,
        Self::MissingIdempotencyKey,
        Self::InvalidIdempotencyKey,
        Self::InvalidRequest,
        Self::NoProviderAccount,
        Self::PayloadTooLarge,
        Self::UnsupportedMediaType,
        Self::IdempotencyKeyReused,
        Self::IdempotencyKeyInUse,
        Self::PaymentNotRefundable,
        Self::NothingToRefund,
        Self::RefundExceedsPayment,
        Self::RateLimited,
        Self::NotFound,
        Self::Forbidden,
        Self::Refused,
        Self::MethodNotAllowed,
        Self::ServiceUnavailable,
        Self::Internal,
        Self::InvalidSignature,
        Self::InvalidWebhook,
    ];

    /// The last segment of the `type` URI.
    pub const fn slug(self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::MissingIdempotencyKey => "missing-idempotency-key",
            Self::InvalidIdempotencyKey => "invalid-idempotency-key",
            Self::InvalidRequest => "invalid-request",
            Self::NoProviderAccount => "no-provider-account",
            Self::PayloadTooLarge => "payload-too-large",
            Self::UnsupportedMediaType => "unsupported-media-type",
            Self::IdempotencyKeyReused => "idempotency-key-reused",
            Self::IdempotencyKeyInUse => "idempotency-key-in-use",
            Self::PaymentNotRefundable => "payment-not-refundable",
            Self::NothingToRefund => "nothing-to-refund",
            Self::RefundExceedsPayment => "refund-exceeds-payment",
            Self::RateLimited => "rate-limited",
            Self::NotFound => "not-found",
            Self::Forbidden => "forbidden",
            Self::Refused => "refused",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::ServiceUnavailable => "service-unavailable",
            Self::Internal => "internal",
            Self::InvalidSignature => "invalid-signature",
            Self::InvalidWebhook => "invalid-webhook",
        }
    }

    /// The short, fixed summary.
    pub const fn title(self) -> &'static str {
        match self {
            Self::Unauthorized => "Missing or invalid API key",
            Self::MissingIdempotencyKey => "Idempotency-Key header required",
            Self::InvalidIdempotencyKey => "Invalid Idempotency-Key header",
            Self::InvalidRequest => "Invalid request",
            Self::NoProviderAccount => "No provider account connected",
            Self::PayloadTooLarge => "Request body too large",
            Self::UnsupportedMediaType => "Unsupported media type",
            Self::IdempotencyKeyReused => "Idempotency-Key reused with a different request",
            Self::IdempotencyKeyInUse => "A request with this Idempotency-Key is in progress",
            Self::PaymentNotRefundable => "Payment cannot be refunded",
            Self::NothingToRefund => "Nothing left to refund",
            Self::RefundExceedsPayment => "Refund exceeds what is left of the payment",
            Self::RateLimited => "Rate limit exceeded",
            Self::NotFound => "Not found",
            Self::Forbidden => "Not allowed for your role",
            Self::Refused => "Refused in the current state",
            Self::MethodNotAllowed => "Method not allowed",
            Self::ServiceUnavailable => "Service unavailable",
            Self::Internal => "Internal error",
            Self::InvalidSignature => "Invalid webhook signature",
            Self::InvalidWebhook => "Invalid webhook",
        }
    }

    /// The HTTP status of its response.
    pub const fn status(self) -> u16 {
        match self {
            Self::Unauthorized | Self::InvalidSignature => 401,
            Self::MissingIdempotencyKey
            | Self::InvalidIdempotencyKey
            | Self::InvalidRequest
            | Self::NoProviderAccount
            | Self::InvalidWebhook => 400,
            Self::PayloadTooLarge => 413,
            Self::UnsupportedMediaType => 415,
            Self::IdempotencyKeyReused | Self::NothingToRefund | Self::RefundExceedsPayment => 422,
            Self::IdempotencyKeyInUse | Self::Refused | Self::PaymentNotRefundable => 409,
            Self::Forbidden => 403,
            Self::RateLimited => 429,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::ServiceUnavailable => 503,
            Self::Internal => 500,
        }
    }

    /// The full `type` URI.
    pub fn uri(self) -> String {
        format!("{TYPE_BASE}{}", self.slug())
    }
}

// This doc is the schema's description in the OpenAPI document: the document is a contract, so
// rewording it is a change to the API.
/// One problem document, ready to send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// The stable URI naming the kind of problem.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short summary of the kind.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong with this request, for a human.
    pub detail: String,
    /// For `invalid-request`: each field that is wrong.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// Seconds to wait before retrying, also sent as `Retry-After`.
    #[serde(skip)]
    pub retry_after_secs: Option<u64>,
}

impl Problem {
    /// A problem of `kind` with a request-specific detail.
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Self {
        Self {
            type_uri: kind.uri(),
            title: kind.title().to_owned(),
            status: kind.status(),
            detail: detail.into(),
            errors: Vec::new(),
            retry_after_secs: None,
        }
    }

    /// Adds the list of invalid fields.
    pub fn with_errors(mut self, errors: Vec<FieldError>) -> Self {
        self.errors = errors;
        self
    }

    /// Adds a `Retry-After`.
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    /// The HTTP status.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// Renders the response: status, `application/problem+json` body and `Retry-After` if set.
    pub fn to_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        response.insert_header((header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE)));
        if let Some(secs) = self.retry_after_secs {
            response.insert_header((header::RETRY_AFTER, secs.to_string()));
        }
        if self.status == 401 {
            response.insert_header((header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")));
        }
        // Serialising a struct of strings and numbers cannot fail.
        response.body(serde_json::to_vec(self).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_problem_type_has_a_distinct_uri_and_an_error_status() {
        let slugs: HashSet<_> = ProblemType::ALL.iter().map(|t| t.slug()).collect();
        assert_eq!(slugs.len(), ProblemType::ALL.len());
        for kind in ProblemType::ALL {
            assert!((400..600).contains(&kind.status()), "{kind:?}");
            assert!(kind.uri().starts_with(TYPE_BASE));
        }
    }

    #[test]
    fn a_problem_renders_as_rfc_9457_json_with_retry_after() {
        let problem = Problem::new(ProblemType::IdempotencyKeyInUse, "try again shortly").with_retry_after(2);

        let response = problem.to_response();

        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers().get(header::CONTENT_TYPE).unwrap(), CONTENT_TYPE);
        assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), "2");
        assert_eq!(
            serde_json::to_value(&problem).unwrap(),
            serde_json::json!({
                "type": "https://oncepay.dev/problems/idempotency-key-in-use",
                "title": "A request with this Idempotency-Key is in progress",
                "status": 409,
                "detail": "try again shortly",
            })
        );
    }
}
