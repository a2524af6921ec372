//! The api's one error type, [`ApiError`], and how every error leaves the process: as an RFC 9457
//! problem document (`oncepay_http::problem`), so no client ever sees a plain-text or empty error.
//!
//! Invariants: a response never carries an internal cause (no SQL, no stack trace, no key); an
//! unexpected error is logged exactly once, here, with its cause chain, and becomes an opaque 500;
//! an unavailable store is logged as a warning and becomes a 503 with `Retry-After`.

use std::borrow::Cow;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{HttpResponse, ResponseError, web};
use oncepay_domain::idempotency_key::IdempotencyKeyError;
use oncepay_domain::money::Currency;
use oncepay_domain::payment_request::FieldError;
use oncepay_domain::status::PaymentStatus;
use oncepay_http::problem::{self, Problem, ProblemType};
use oncepay_service::telemetry;
use oncepay_store::StoreError;
use time::OffsetDateTime;

use crate::accept_groups::LOCK_NOT_AVAILABLE;
use crate::resource_response;

/// `intake.retry_after_secs`: how long a client should wait before sending again a request that was
/// refused only for now. App data, read by [`problem_guard`].
#[derive(Debug, Clone, Copy)]
pub struct RetryAfter {
    /// The delay, in seconds.
    pub secs: u64,
}

/// Everything a request can fail with. Handlers return it; actix renders it through
/// [`ResponseError`].
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No API key, or not a valid, live one. The reason is for the client; it never echoes the key.
    #[error("unauthorized: {0}")]
    Unauthorized(&'static str),
    /// The tenant's rate limit is exhausted.
    #[error("rate limited")]
    RateLimited {
        /// When a request would be admitted again, rounded up.
        retry_after_secs: u64,
    },
    /// No `Idempotency-Key` header.
    #[error("missing Idempotency-Key")]
    MissingIdempotencyKey,
    /// More than one `Idempotency-Key` header.
    #[error("more than one Idempotency-Key")]
    RepeatedIdempotencyKey,
    /// A malformed `Idempotency-Key` header.
    #[error("invalid Idempotency-Key: {0}")]
    InvalidIdempotencyKey(#[from] IdempotencyKeyError),
    /// The body is not `application/json`.
    #[error("unsupported media type")]
    UnsupportedMediaType,
    /// The body is larger than allowed.
    #[error("body larger than {max_bytes} bytes")]
    PayloadTooLarge {
        /// The limit.
        max_bytes: usize,
    },
    /// The body could not be read to its end.
    #[error("the body could not be read")]
    UnreadableBody,
    /// The body is not JSON.
    #[error("the body is not valid JSON: {0}")]
    MalformedJson(#[source] serde_json::Error),
    /// The body is JSON, but fields are wrong.
    #[error("{} invalid field(s)", .0.len())]
    InvalidFields(Vec<FieldError>),
    /// A webhook endpoint's body is well-formed, but names an endpoint oncepay does not save: each
    /// message names its field.
    #[error("{} invalid endpoint field(s)", .0.len())]
    InvalidEndpoint(Vec<FieldError>),
    /// Payments are charged in each tenant's connected account, and this tenant has none.
    #[error("the tenant has no provider account")]
    NoProviderAccount,
    /// The key was used before with a different request.
    #[error("idempotency key reused with a different request")]
    KeyReused {
        /// When the key may be forgotten.
        key_expires_at: OffsetDateTime,
    },
    /// Another request is writing the same key right now.
    #[error("idempotency key in use")]
    KeyInUse,
    /// Another request is refunding the same payment right now (with this key or another).
    #[error("the payment's refunds are being written")]
    RefundsInUse,
    /// Only a `succeeded` payment can be refunded.
    #[error("the payment is {} and cannot be refunded", .status.as_str())]
    PaymentNotRefundable {
        /// Where the payment stands.
        status: PaymentStatus,
    },
    /// The payment's refunds that are not `failed` already add up to its charge.
    #[error("nothing is left to refund")]
    NothingToRefund,
    /// The refund asks for more than is left of the payment's charge.
    #[error("the refund asks for {asked} but {left} is left")]
    RefundExceedsPayment {
        /// What was asked, in minor units.
        asked: i64,
        /// What is left to refund, in minor units.
        left: i64,
        /// The payment's currency.
        currency: Currency,
    },
    /// No such payment or refund for this tenant (or a malformed id), or no such route.
    #[error("not found")]
    NotFound,
    /// The route exists, but not for this method.
    #[error("method not allowed")]
    MethodNotAllowed {
        /// The methods it does support, for the `Allow` header.
        allow: &'static str,
    },
    /// API keys cannot be checked right now: every place for a key read is taken.
    #[error("the API key cannot be checked right now")]
    KeyCheckBusy,
    /// The store cannot be reached or the transaction failed; nothing was written, unless the
    /// connection broke after the commit was sent.
    #[error("the store is unavailable")]
    Unavailable(#[source] StoreError),
    /// A bug. Nothing about it is shown to the client.
    #[error("unexpected error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    /// Maps a store failure: unavailable (503, retry) or a bug (500).
    pub fn from_store(error: StoreError) -> Self {
        if error.is_unavailable() { Self::Unavailable(error) } else { Self::Internal(anyhow::Error::new(error)) }
    }

    /// Maps a failure of an idempotent write (intake of a payment or a refund): a lock wait past
    /// `lock_timeout` is the key (or the payment) being written by another request right now, 409
    /// + `Retry-After`; anything else as [`Self::from_store`].
    pub fn from_intake(error: StoreError) -> Self {
        if error.sqlstate().as_deref() == Some(LOCK_NOT_AVAILABLE) {
            Self::KeyInUse
        } else {
            // 503 + `Retry-After`, never cached. Nothing was written, unless the connection broke
            // after the commit was sent: the 503 tells the client to retry with the same key (which
            // then replays what was recorded), never that nothing was recorded.
            Self::from_store(error)
        }
    }

    /// The `outcome` label of a refused intake request (`oncepay_api_intake_total`,
    /// `oncepay_api_refund_intake_total`).
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Unauthorized(_) => "unauthorized",
            Self::RateLimited { .. } => "rate_limited",
            Self::KeyReused { .. } => "key_reused",
            Self::KeyInUse | Self::RefundsInUse => "key_in_use",
            Self::Unavailable(_) => "store_unavailable",
            Self::KeyCheckBusy => "key_check_busy",
            Self::MissingIdempotencyKey
            | Self::RepeatedIdempotencyKey
            | Self::InvalidIdempotencyKey(_)
            | Self::UnsupportedMediaType
            | Self::PayloadTooLarge { .. }
            | Self::UnreadableBody
            | Self::MalformedJson(_)
            | Self::InvalidFields(_)
            | Self::InvalidEndpoint(_)
            | Self::NoProviderAccount => "invalid",
            Self::PaymentNotRefundable { .. } | Self::NothingToRefund | Self::RefundExceedsPayment { .. } => "refused",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed { .. } | Self::Internal(_) => "error",
        }
    }

    /// The problem document for this error.
    pub fn problem(&self) -> Problem {
        let problem = Problem::new(self.problem_type(), self.detail());
        match self {
            Self::InvalidFields(errors) => problem.with_errors(errors.clone()),
            // `invalid-request`, as for the other bodies, but 422: the JSON was read, and what it
            // asks for cannot be done.
            Self::InvalidEndpoint(errors) => Problem { status: 422, ..problem.with_errors(errors.clone()) },
            _ => problem,
        }
    }

    /// The problem's type, which gives its status and title.
    fn problem_type(&self) -> ProblemType {
        match self {
            Self::Unauthorized(_) => ProblemType::Unauthorized,
            Self::RateLimited { .. } => ProblemType::RateLimited,
            Self::MissingIdempotencyKey => ProblemType::MissingIdempotencyKey,
            Self::RepeatedIdempotencyKey | Self::InvalidIdempotencyKey(_) => ProblemType::InvalidIdempotencyKey,
            Self::UnsupportedMediaType => ProblemType::UnsupportedMediaType,
            Self::PayloadTooLarge { .. } => ProblemType::PayloadTooLarge,
            Self::UnreadableBody | Self::MalformedJson(_) | Self::InvalidFields(_) | Self::InvalidEndpoint(_) => {
                ProblemType::InvalidRequest
            }
            Self::NoProviderAccount => ProblemType::NoProviderAccount,
            Self::KeyReused { .. } => ProblemType::IdempotencyKeyReused,
            Self::KeyInUse | Self::RefundsInUse => ProblemType::IdempotencyKeyInUse,
            Self::PaymentNotRefundable { .. } => ProblemType::PaymentNotRefundable,
            Self::NothingToRefund => ProblemType::NothingToRefund,
            Self::RefundExceedsPayment { .. } => ProblemType::RefundExceedsPayment,
            Self::NotFound => ProblemType::NotFound,
            Self::MethodNotAllowed { .. } => ProblemType::MethodNotAllowed,
            Self::KeyCheckBusy | Self::Unavailable(_) => ProblemType::ServiceUnavailable,
            Self::Internal(_) => ProblemType::Internal,
        }
    }

    /// What went wrong and what to do, for the client: never an internal cause.
    fn detail(&self) -> Cow<'static, str> {
        match self {
            Self::Unauthorized(reason) => Cow::Borrowed(reason),
            Self::RateLimited { .. } => {
                "This API key's tenant has exceeded its request rate; retry after the indicated delay.".into()
            }
            Self::MissingIdempotencyKey => {
                "This request requires an Idempotency-Key header (1 to 255 visible ASCII characters).".into()
            }
            Self::RepeatedIdempotencyKey => "The Idempotency-Key header must be sent exactly once.".into(),
            Self::InvalidIdempotencyKey(reason) => format!("The Idempotency-Key header {reason}.").into(),
            Self::UnsupportedMediaType => "The request body must be sent with Content-Type: application/json.".into(),
            Self::PayloadTooLarge { max_bytes } => {
                format!("The request body must be at most {max_bytes} bytes.").into()
            }
            Self::UnreadableBody => "The request body could not be read to its end.".into(),
            Self::MalformedJson(error) => format!("The request body is not valid JSON: {error}.").into(),
            Self::InvalidFields(errors) => {
                let names: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
                format!("Invalid fields: {}.", names.join(", ")).into()
            }
            Self::InvalidEndpoint(errors) => {
                let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
                format!("Nothing was saved: {}.", messages.join("; ")).into()
            }
            Self::NoProviderAccount => "This tenant has no Stripe account connected, so its payments cannot be \
                                        charged yet. Ask the operators of this service to connect your Stripe \
                                        account; nothing was recorded."
                .into(),
            Self::KeyReused { .. } => "This Idempotency-Key was already used with a different request; use a new \
                                       key for a new payment or refund."
                .into(),
            Self::KeyInUse => {
                "Another request with this Idempotency-Key is being processed; retry after the indicated delay.".into()
            }
            Self::RefundsInUse => "Another request, with this Idempotency-Key or another, is refunding this payment \
                                   right now; retry with the same Idempotency-Key after the indicated delay."
                .into(),
            Self::PaymentNotRefundable { status } => format!(
                "Only a succeeded payment can be refunded, and this payment is {}; nothing was recorded.",
                status.as_str()
            )
            .into(),
            Self::NothingToRefund => {
                "This payment's refunds already add up to its whole amount; nothing was recorded.".into()
            }
            Self::RefundExceedsPayment { asked, left, currency } => format!(
                "The refund asks for {asked} but only {left} (minor units of {}) is left to refund on this payment; \
                 nothing was recorded.",
                currency.as_str()
            )
            .into(),
            Self::NotFound => "There is nothing here.".into(),
            Self::MethodNotAllowed { allow } => format!("This resource only supports {allow}.").into(),
            Self::KeyCheckBusy => {
                "The service cannot check API keys right now; retry after the indicated delay.".into()
            }
            Self::Unavailable(_) => "The service cannot reach its store right now. Retry with the same \
                                     Idempotency-Key after the indicated delay: if this request was recorded after \
                                     all, the retry returns what it recorded."
                .into(),
            Self::Internal(_) => "An unexpected error occurred.".into(),
        }
    }

    /// Seconds the client should wait before retrying, for the errors whose request can simply be
    /// sent again: the rate limiter's own wait for a 429, else the configured delay (409 for a key
    /// being written, 503 for a key check or a store that is unavailable).
    fn retry_after_secs(&self, configured: RetryAfter) -> Option<u64> {
        match self {
            Self::RateLimited { retry_after_secs } => Some(*retry_after_secs),
            Self::KeyInUse | Self::RefundsInUse | Self::KeyCheckBusy | Self::Unavailable(_) => Some(configured.secs),
            Self::Unauthorized(_)
            | Self::MissingIdempotencyKey
            | Self::RepeatedIdempotencyKey
            | Self::InvalidIdempotencyKey(_)
            | Self::UnsupportedMediaType
            | Self::PayloadTooLarge { .. }
            | Self::UnreadableBody
            | Self::MalformedJson(_)
            | Self::InvalidFields(_)
            | Self::InvalidEndpoint(_)
            | Self::NoProviderAccount
            | Self::KeyReused { .. }
            | Self::PaymentNotRefundable { .. }
            | Self::NothingToRefund
            | Self::RefundExceedsPayment { .. }
            | Self::NotFound
            | Self::MethodNotAllowed { .. }
            | Self::Internal(_) => None,
        }
    }

    fn log(&self) {
        match self {
            Self::Internal(error) => tracing::error!(error = format!("{error:#}"), "request failed unexpectedly"),
            Self::Unavailable(source) => {
                tracing::warn!(error = %telemetry::error_chain(source), "request failed closed: the store is unavailable");
            }
            _ => {}
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.problem().status_code()
    }

    fn error_response(&self) -> HttpResponse<BoxBody> {
        self.log();
        let mut response = self.problem().to_response();
        match self {
            Self::KeyReused { key_expires_at } => {
                if let Some(value) = resource_response::http_date(*key_expires_at) {
                    response.headers_mut().insert(resource_response::IDEMPOTENCY_KEY_EXPIRES, value);
                }
            }
            Self::MethodNotAllowed { allow } => {
                response.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            _ => {}
        }
        response
    }
}

/// The default service of the app: any route that does not exist. Like [`method_not_allowed`], it
/// turns an error actix would produce itself into an [`ApiError`].
pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}

/// The default service of a resource that only supports `allow` (e.g. `"GET"`).
pub fn method_not_allowed(allow: &'static str) -> actix_web::Route {
    actix_web::web::to(move || async move { Err::<HttpResponse, _>(ApiError::MethodNotAllowed { allow }) })
}

/// Middleware: the response to an [`ApiError`] gets the `Retry-After` its kind calls for, and any
/// error response that is not already a problem document (one actix wrote itself) is replaced by
/// the problem of its status, so every error a client sees has the same shape.
pub async fn problem_guard(
    configured: web::Data<RetryAfter>,
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let mut response = next.call(request).await?.map_into_boxed_body();
    add_retry_after(response.response_mut(), **configured);
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(problem::CONTENT_TYPE.as_bytes()));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return Ok(response);
    }
    let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
    let mut problem = problem_for_status(status).to_response();
    *problem.status_mut() = status;
    if let Some(value) = retry_after {
        problem.headers_mut().insert(header::RETRY_AFTER, value);
    }
    Ok(response.into_response(problem))
}

/// Adds `Retry-After` to the response to an [`ApiError`] whose request can be sent again as it is.
fn add_retry_after(response: &mut HttpResponse, configured: RetryAfter) {
    let secs = response
        .error()
        .and_then(|error| error.as_error::<ApiError>())
        .and_then(|error| error.retry_after_secs(configured));
    if let Some(secs) = secs {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
}

/// The problem for a status actix responded with on its own.
fn problem_for_status(status: StatusCode) -> Problem {
    let kind = match status {
        StatusCode::UNAUTHORIZED => ProblemType::Unauthorized,
        StatusCode::NOT_FOUND => ProblemType::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ProblemType::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => ProblemType::PayloadTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ProblemType::UnsupportedMediaType,
        StatusCode::TOO_MANY_REQUESTS => ProblemType::RateLimited,
        StatusCode::SERVICE_UNAVAILABLE => ProblemType::ServiceUnavailable,
        status if status.is_server_error() => ProblemType::Internal,
        _ => ProblemType::InvalidRequest,
    };
    let detail = status.canonical_reason().unwrap_or("The request could not be served.");
    let mut problem = Problem::new(kind, detail);
    problem.status = status.as_u16();
    problem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_503_never_says_that_nothing_was_recorded_and_says_to_retry_with_the_same_key() {
        // The connection may have broken after the commit was sent: then the payment exists.
        let unavailable =
            ApiError::Unavailable(StoreError::Unavailable(sqlx::Error::Protocol("connection closed".into()).into()));

        let detail = unavailable.problem().detail.to_lowercase();

        assert!(!detail.contains("nothing"), "{detail}");
        assert!(detail.contains("retry with the same idempotency-key"), "{detail}");
    }

    #[test]
    fn every_error_renders_a_problem_with_its_status_and_no_internals() {
        let unavailable =
            ApiError::Unavailable(StoreError::Unavailable(sqlx::Error::Protocol("secret internals".into()).into()));
        let internal = ApiError::Internal(anyhow::anyhow!("SELECT secret FROM internals"));
        // The error, the configured delay, then the status and `Retry-After` of its response.
        let cases: Vec<(ApiError, u64, u16, Option<&str>)> = vec![
            (ApiError::Unauthorized("no key"), 1, 401, None),
            (ApiError::RateLimited { retry_after_secs: 3 }, 1, 429, Some("3")),
            (ApiError::MissingIdempotencyKey, 1, 400, None),
            (ApiError::RepeatedIdempotencyKey, 1, 400, None),
            (ApiError::InvalidIdempotencyKey(IdempotencyKeyError::Empty), 1, 400, None),
            (ApiError::UnsupportedMediaType, 1, 415, None),
            (ApiError::PayloadTooLarge { max_bytes: 10 }, 1, 413, None),
            (ApiError::InvalidEndpoint(vec![]), 1, 422, None),
            (ApiError::KeyReused { key_expires_at: OffsetDateTime::UNIX_EPOCH }, 1, 422, None),
            (ApiError::KeyInUse, 1, 409, Some("1")),
            (ApiError::RefundsInUse, 1, 409, Some("1")),
            (ApiError::PaymentNotRefundable { status: PaymentStatus::Pending }, 1, 409, None),
            (ApiError::NothingToRefund, 1, 422, None),
            (
                ApiError::RefundExceedsPayment { asked: 2, left: 1, currency: Currency::parse("EUR").unwrap() },
                1,
                422,
                None,
            ),
            (ApiError::NotFound, 1, 404, None),
            (ApiError::MethodNotAllowed { allow: "GET" }, 1, 405, None),
            (unavailable, 2, 503, Some("2")),
            (ApiError::KeyCheckBusy, 2, 503, Some("2")),
            (internal, 2, 500, None),
        ];
        for (error, configured, status, retry_after) in cases {
            let rendered = serde_json::to_string(&error.problem()).unwrap();
            let mut response = HttpResponse::from_error(error);
            add_retry_after(&mut response, RetryAfter { secs: configured });
            let error = response.error().unwrap();

            assert_eq!(response.status().as_u16(), status, "{error:?}");
            assert_eq!(response.headers().get(header::CONTENT_TYPE).unwrap(), problem::CONTENT_TYPE);
            assert_eq!(
                response.headers().get(header::RETRY_AFTER).map(|v| v.to_str().unwrap()),
                retry_after,
                "{error:?}"
            );
            assert!(!rendered.contains("internals"), "{rendered}");
        }
    }

    #[test]
    fn a_reused_key_response_says_when_the_key_expires() {
        let error = ApiError::KeyReused { key_expires_at: OffsetDateTime::UNIX_EPOCH };

        let response = error.error_response();

        assert_eq!(
            response.headers().get(resource_response::IDEMPOTENCY_KEY_EXPIRES).unwrap(),
            "Thu, 01 Jan 1970 00:00:00 GMT"
        );
    }

    #[test]
    fn a_refused_refund_says_why_and_how_much_is_left() {
        let not_refundable = ApiError::PaymentNotRefundable { status: PaymentStatus::Processing }.problem();
        let too_much =
            ApiError::RefundExceedsPayment { asked: 1500, left: 999, currency: Currency::parse("EUR").unwrap() }
                .problem();

        assert!(not_refundable.type_uri.ends_with("/payment-not-refundable"), "{}", not_refundable.type_uri);
        assert!(not_refundable.detail.contains("processing"), "{}", not_refundable.detail);
        assert!(too_much.type_uri.ends_with("/refund-exceeds-payment"), "{}", too_much.type_uri);
        assert!(
            too_much.detail.contains("1500") && too_much.detail.contains("999 (minor units of EUR)"),
            "{}",
            too_much.detail
        );
    }

    #[test]
    fn field_errors_are_listed_and_named_in_the_detail() {
        let error = ApiError::InvalidFields(vec![
            FieldError { field: "amount".into(), message: "is required".into() },
            FieldError { field: "currency".into(), message: "is required".into() },
        ]);

        let problem = serde_json::to_value(error.problem()).unwrap();

        assert_eq!(problem["errors"].as_array().unwrap().len(), 2);
        assert_eq!(problem["detail"], "Invalid fields: amount, currency.");
    }

    #[test]
    fn an_invalid_endpoint_is_a_422_invalid_request_that_says_what_is_wrong() {
        let error = ApiError::InvalidEndpoint(vec![
            FieldError { field: "url".into(), message: "`url` must be https".into() },
            FieldError {
                field: "event_types[0]".into(),
                message: "`event_types[0]`: there is no event type `x`".into(),
            },
        ]);

        let response = error.error_response();
        let problem = serde_json::to_value(error.problem()).unwrap();

        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(problem["status"], 422);
        assert_eq!(problem["type"], "https://oncepay.dev/problems/invalid-request");
        assert_eq!(problem["errors"].as_array().unwrap().len(), 2);
        assert_eq!(
            problem["detail"],
            "Nothing was saved: `url` must be https; `event_types[0]`: there is no event type `x`."
        );
    }

    #[actix_web::test]
    async fn the_guard_turns_an_error_actix_rendered_itself_into_a_problem_and_leaves_the_rest_alone() {
        use actix_web::{App, test};

        let app = test::init_service(
            App::new()
                .app_data(web::Data::new(RetryAfter { secs: 1 }))
                .wrap(actix_web::middleware::from_fn(problem_guard))
                .route("/plain-error", web::get().to(|| async { HttpResponse::PayloadTooLarge().body("too big") }))
                .route("/problem", web::get().to(|| async { Err::<HttpResponse, _>(ApiError::NotFound) }))
                .route("/ok", web::get().to(|| async { HttpResponse::Ok().body("fine") })),
        )
        .await;

        let plain = test::call_service(&app, test::TestRequest::get().uri("/plain-error").to_request()).await;
        let problem = test::call_service(&app, test::TestRequest::get().uri("/problem").to_request()).await;
        let ok = test::call_service(&app, test::TestRequest::get().uri("/ok").to_request()).await;

        assert_eq!(plain.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(plain.headers().get(header::CONTENT_TYPE).unwrap(), problem::CONTENT_TYPE);
        let body: serde_json::Value = test::read_body_json(plain).await;
        assert_eq!(body["type"], "https://oncepay.dev/problems/payload-too-large");
        assert_eq!(body["status"], 413);
        let body: serde_json::Value = test::read_body_json(problem).await;
        assert_eq!(body["type"], "https://oncepay.dev/problems/not-found");
        assert_eq!(test::read_body(ok).await, "fine");
    }

    #[actix_web::test]
    async fn the_guard_gives_a_refusal_that_can_be_retried_the_configured_delay_or_the_limiters_own() {
        use actix_web::{App, test};

        let app = test::init_service(
            App::new()
                .app_data(web::Data::new(RetryAfter { secs: 7 }))
                .wrap(actix_web::middleware::from_fn(problem_guard))
                .route("/in-use", web::get().to(|| async { Err::<HttpResponse, _>(ApiError::KeyInUse) }))
                .route(
                    "/limited",
                    web::get().to(|| async { Err::<HttpResponse, _>(ApiError::RateLimited { retry_after_secs: 3 }) }),
                )
                .route("/not-found", web::get().to(|| async { Err::<HttpResponse, _>(ApiError::NotFound) })),
        )
        .await;

        for (uri, retry_after) in [("/in-use", Some("7")), ("/limited", Some("3")), ("/not-found", None)] {
            let response = test::call_service(&app, test::TestRequest::get().uri(uri).to_request()).await;

            assert_eq!(response.headers().get(header::RETRY_AFTER).map(|v| v.to_str().unwrap()), retry_after, "{uri}");
        }
    }

    #[test]
    fn statuses_actix_responds_with_on_its_own_become_problems_of_that_status() {
        for (status, slug) in [
            (StatusCode::NOT_FOUND, "not-found"),
            (StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed"),
            (StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large"),
            (StatusCode::BAD_REQUEST, "invalid-request"),
            (StatusCode::URI_TOO_LONG, "invalid-request"),
            (StatusCode::BAD_GATEWAY, "internal"),
        ] {
            let problem = problem_for_status(status);

            assert_eq!(problem.status, status.as_u16());
            assert!(problem.type_uri.ends_with(slug), "{status}: {}", problem.type_uri);
        }
    }
}
