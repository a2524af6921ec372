//! What several endpoints share: the refusals every one of them can make before anything else
//! ([`Admission`]), those of a JSON body ([`JsonBodyRefusals`]) and of the store when both create
//! endpoints write ([`IntakeRefusals`]), the headers and
//! the payment path some of them take, and the schemas of the fields both request bodies have, all
//! as the OpenAPI document describes them; and reading a payment's id from its path
//! ([`path_payment_id`]).

use std::str::FromStr;

use actix_web::HttpRequest;
use oncepay_domain::ids::PaymentId;
use oncepay_domain::money::Amount;
use oncepay_domain::payment_request::limits;
use oncepay_http::problem::Problem;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::{IntoParams, IntoResponses};

use crate::errors::ApiError;

/// The refusals of every endpoint before it does anything: the API key, then the rate limit.
#[derive(IntoResponses)]
pub enum Admission {
    #[response(
        status = 401,
        description = "Missing, malformed, unknown or revoked API key.",
        content_type = "application/problem+json"
    )]
    Unauthorized(Problem),
    #[response(status = 429, description = "The tenant's rate limit is exhausted.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    RateLimited(Problem),
}

/// The refusals of every endpoint that takes a JSON body, before it is read ([`crate::json_body`]).
/// What its fields must be (400, 422) each endpoint says itself.
#[derive(IntoResponses)]
pub enum JsonBodyRefusals {
    #[response(
        status = 413,
        description = "The body is larger than the limit (64 KiB by default).",
        content_type = "application/problem+json"
    )]
    TooLarge(Problem),
    #[response(
        status = 415,
        description = "The body is not `application/json`.",
        content_type = "application/problem+json"
    )]
    NotJson(Problem),
}

/// The refusal both create endpoints share when the store cannot be reached.
#[derive(IntoResponses)]
pub enum IntakeRefusals {
    #[response(status = 503, description = "The store cannot be reached; nothing was written. Retry with the same key.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    Unavailable(Problem),
}

/// The headers of `POST /v1/payments` and `POST /v1/payments/{id}/refunds`.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKeyHeader {
    // The grammar `IdempotencyKey::parse` accepts: a bare key not starting with a quote, or an
    // RFC 8941 string of 1 to 255 visible ASCII characters (an escape `\"` or `\\` counts as one).
    #[doc = "1 to 255 visible ASCII characters, bare (`abc-123`) or as an RFC 8941 string \
             (`\"abc-123\"`); both forms name the same key. Retry with the same key and body."]
    #[param(rename = "Idempotency-Key", pattern = r#"^(?:[!#-~][!-~]{0,254}|"(?:[!#-\[\]-~]|\\["\\]){1,255}")$"#)]
    pub idempotency_key: String,
}

/// The headers of `POST /v1/webhook-endpoints`: a key is optional there.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct OptionalIdempotencyKeyHeader {
    // The pattern of `IdempotencyKeyHeader`, written again: utoipa takes only a literal here.
    #[doc = "Optional; the grammar of a payment's key. Sent again with the same key and body, the create \
             answers the endpoint it made and makes no other; without a key, each create makes one."]
    #[param(rename = "Idempotency-Key", pattern = r#"^(?:[!#-~][!-~]{0,254}|"(?:[!#-\[\]-~]|\\["\\]){1,255}")$"#)]
    pub idempotency_key: Option<String>,
}

/// The headers of `GET /v1/payments/{id}` and `GET /v1/refunds/{id}`.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct LongPollHeaders {
    #[doc = "`wait=N` (RFC 7240): hold the response until the status changes or N seconds pass \
             (N is capped at the server's maximum, 30 by default)."]
    #[param(rename = "Prefer")]
    pub prefer: Option<String>,
}

/// The path of `GET /v1/payments/{id}` and of a payment's refunds.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PaymentPath {
    /// The payment's id, from `Location`
    #[param(format = Uuid)]
    pub id: String,
}

/// The payment id in the path (`{id}`); an id that is not a UUID names no payment (404).
pub fn path_payment_id(request: &HttpRequest) -> Result<PaymentId, ApiError> {
    request.match_info().get("id").and_then(|raw| PaymentId::from_str(raw).ok()).ok_or(ApiError::NotFound)
}

/// Strings that PostgreSQL can store: no U+0000 (`PaymentRequest::from_json` refuses it).
pub const NO_NUL: &str = "^[^\\u0000]*$";

/// `amount`: minor units, within the limits of [`Amount`].
pub fn amount_schema(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(Amount::MIN))
        .maximum(Some(Amount::MAX))
        .description(Some(description))
}

/// `metadata`: the merchant's key/value pairs, within the limits `from_json` enforces.
pub fn metadata_schema() -> ObjectBuilder {
    let metadata_key = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(limits::METADATA_KEY_MAX_CHARS))
        .pattern(Some(NO_NUL));
    let metadata_value = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(limits::METADATA_VALUE_MAX_CHARS))
        .pattern(Some(NO_NUL));
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .max_properties(Some(limits::METADATA_MAX_PAIRS))
        .property_names(Some(metadata_key))
        .additional_properties(Some(metadata_value))
        .description(Some(format!(
            "Your own key/value pairs (keys of 1 to {} characters), returned as given.",
            limits::METADATA_KEY_MAX_CHARS
        )))
}
