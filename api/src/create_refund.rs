//! `POST /v1/payments/{id}/refunds`: accepts a refund of a succeeded payment exactly once per
//! (tenant, idempotency key).
//!
//! The request shell is [`crate::create`]'s, as for `POST /v1/payments`; this module is the
//! refund's part of it. A known key is replayed, or refused (422) for another request; a key or
//! payment another request is writing right now is 409; a store that cannot be reached fails closed
//! (503). What only the store can decide, under the payment's row lock, is refused with nothing
//! written: a payment the tenant does not have (404, another tenant's included), one that has not
//! succeeded (409), one with nothing left to refund or less left than asked (422). Refund keys are
//! their own namespace, always read from the database (there is no replay memory for them). Never
//! logged: the API key, the idempotency key, the body.

use std::borrow::Cow;

use actix_web::{HttpRequest, HttpResponse, web};
use oncepay_domain::ids::{PaymentId, RefundId};
use oncepay_domain::payment_request::FieldError;
use oncepay_domain::refund::{RefundReason, RefundRequest, RefundResource};
use oncepay_http::problem::Problem;
use oncepay_service::telemetry;
use oncepay_store::refunds;
use oncepay_store::refunds::intake::{NewRefund, RefundIntake, Refusal};
use serde_json::Value;
use sqlx::PgConnection;
use tracing::Span;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Schema, Type};
use utoipa::{IntoResponses, PartialSchema, ToSchema};

use crate::create::{self, Checked, Create, KnownKey, Responded};
use crate::endpoints::{
    Admission, IdempotencyKeyHeader, IntakeRefusals, JsonBodyRefusals, PaymentPath, amount_schema, metadata_schema,
    path_payment_id,
};
use crate::errors::ApiError;
use crate::idempotent_request;
use crate::state::AppState;

/// Who asks for a refund made through the api: the merchant.
const REQUESTED_BY: &str = "api";

/// Accepts a refund, or replays the outcome of the first request with the same key.
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/refunds",
    tag = "refunds",
    operation_id = "create_refund",
    security(("api_key" = [])),
    params(PaymentPath, IdempotencyKeyHeader),
    request_body(content = RefundRequestBody, content_type = "application/json",
        description = "At most 64 KiB by default. Every field is optional: `{}` refunds all that is left. Unknown \
                       fields, and a member named twice at any depth, are rejected."),
    responses(CreateRefundResponses, IntakeRefusals, JsonBodyRefusals, Admission),
)]
pub async fn create_refund(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    create::respond::<CreateRefund>(&request, payload, &state).await
}

/// The refund's part of the create shell.
struct CreateRefund;

impl Create for CreateRefund {
    const METRIC: &'static str = crate::metrics::REFUND_INTAKE;
    type Target = PaymentId;
    type Body = RefundRequest;

    fn target(request: &HttpRequest, span: &Span) -> Result<PaymentId, ApiError> {
        let payment_id = path_payment_id(request)?;
        span.record("payment.id", tracing::field::display(payment_id));
        Ok(payment_id)
    }

    fn parse(json: &Value) -> Result<RefundRequest, Vec<FieldError>> {
        RefundRequest::from_json(json)
    }

    /// The payment's: the same key and body for another payment is another request. Spelled as the
    /// api spells ids, so however the client spelled it.
    fn path(payment_id: &PaymentId) -> Cow<'static, str> {
        Cow::Owned(format!("/v1/payments/{payment_id}/refunds"))
    }

    /// Refuses what the provider could never refund (400), then lets the store replay a known key,
    /// or accept the refund or refuse it.
    async fn store(state: &AppState, request: Checked<Self>, body: RefundRequest) -> Result<Responded, ApiError> {
        state.provider_intake.admit_refund(&body)?;
        let new = NewRefund {
            tenant_id: request.caller.tenant_id,
            payment_id: request.target,
            refund_id: RefundId::generate(),
            key: &request.key,
            fingerprint: request.fingerprint,
            request: &body,
            requested_by: REQUESTED_BY,
            retention: state.intake.key_retention(),
            trace: telemetry::trace_context_of(&request.span),
        };
        let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
        let responded = accept(&mut conn, &request, &new, state.intake.retry_after_secs).await;
        create::release_unless_in_doubt(conn, &responded);
        responded
    }
}

/// The store's part: one transaction that reads the key, then locks the payment and reserves the
/// refund's amount on it, and writes the refund, its key, its audit row and its outbox row (or
/// nothing). If a concurrent request with the same key committed first, intake reads it and this
/// request is replayed, so every concurrent duplicate gets the same refund id. A known key is
/// replayed with its stored final response, or the refund as it stands, read once more (a 202 tells
/// the client to poll after `retry_after_secs`); 422 for another request either way.
async fn accept(
    conn: &mut PgConnection,
    request: &Checked<CreateRefund>,
    new: &NewRefund<'_>,
    retry_after_secs: u64,
) -> Result<Responded, ApiError> {
    let intake = refunds::intake::accept(conn, new).await.map_err(|error| match ApiError::from_intake(error) {
        // The lock waited for is the payment's, held by another refund of it (perhaps with this key).
        ApiError::KeyInUse => ApiError::RefundsInUse,
        other => other,
    })?;
    match intake {
        RefundIntake::Created { refund, key_expires_at } => {
            request.span.record("refund.id", tracing::field::display(refund.refund_id));
            Ok(Responded::created(&RefundResource::from(&*refund), key_expires_at, retry_after_secs))
        }
        RefundIntake::Existing(existing) => {
            request.span.record("refund.id", tracing::field::display(existing.refund_id));
            let known = KnownKey { created_by: existing.fingerprint, expires_at: existing.expires_at };
            match existing.stored_response {
                Some((status, body)) => request.replay_stored(known, status, idempotent_request::stored_body(body)),
                None => {
                    let reread = refunds::find(conn, new.tenant_id, existing.refund_id);
                    request.replay_in_progress::<RefundResource, _>(known, reread, retry_after_secs).await
                }
            }
        }
        RefundIntake::Refused(refusal) => Err(refused(refusal)),
    }
}

/// Why the store refused the refund, as the client is told it. Another tenant's payment is refused
/// exactly like one that does not exist.
fn refused(refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::NoSuchPayment => ApiError::NotFound,
        Refusal::NotRefundable { status } => ApiError::PaymentNotRefundable { status },
        Refusal::NothingLeft => ApiError::NothingToRefund,
        Refusal::TooMuch { asked, left, currency } => ApiError::RefundExceedsPayment { asked, left, currency },
    }
}

/// The body of `POST /v1/payments/{id}/refunds` (its schema only: the body is validated field by
/// field by `RefundRequest::from_json`, whose limits this schema states).
pub struct RefundRequestBody;

impl ToSchema for RefundRequestBody {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("RefundRequest")
    }
}

impl PartialSchema for RefundRequestBody {
    fn schema() -> RefOr<Schema> {
        let amount = amount_schema(
            "How much to give back, in minor units of the payment's currency; at most what is left to refund. \
             Left out, the refund gives back all that is left.",
        )
        .examples([500]);
        let reason = ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(RefundReason::ALL.iter().map(|reason| reason.as_str())))
            .description(Some("Why the money is given back."));
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property("amount", amount)
            .property("reason", reason)
            .property("metadata", metadata_schema())
            .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
            .description(Some(
                "A refund of a succeeded payment, in its currency; `{}` refunds all that is left. Unknown fields, \
                 and a member named twice at any depth, are rejected (400).",
            ))
            .into()
    }
}

/// The responses of `POST /v1/payments/{id}/refunds`, besides those of [`IntakeRefusals`] and
/// [`Admission`].
#[derive(IntoResponses)]
pub enum CreateRefundResponses {
    #[response(status = 202, description = "Accepted (or, with `Idempotent-Replayed: true`, a retry of a refund that is \
                                            still in progress). Poll the `Location` after `Retry-After` seconds.",
        headers(
            ("Location" = String, description = "`/v1/refunds/{id}`"),
            ("Retry-After" = u64, description = "Seconds before polling the refund"),
            ("Idempotency-Key-Expires" = String, description = "HTTP date after which the key may be forgotten"),
            ("Idempotent-Replayed" = bool, description = "`true` when this repeats an earlier request's outcome"),
        ))]
    Accepted(RefundResource),
    #[response(status = 200, description = "A retry of a refund that has reached its final state: the stored final \
                                            response, with `Idempotent-Replayed: true`.",
        headers(
            ("Idempotency-Key-Expires" = String, description = "HTTP date after which the key may be forgotten"),
            ("Idempotent-Replayed" = bool, description = "Always `true`"),
        ))]
    Replayed(RefundResource),
    #[response(
        status = 400,
        description = "Missing or malformed `Idempotency-Key`, malformed JSON, a member named twice, or invalid fields \
                       (each one listed in `errors`).",
        content_type = "application/problem+json"
    )]
    Invalid(Problem),
    #[response(
        status = 404,
        description = "No such payment for this tenant; nothing was written.",
        content_type = "application/problem+json"
    )]
    NotFound(Problem),
    #[response(status = 409, description = "`payment-not-refundable`: only a succeeded payment can be refunded, and this \
                                            one is not (the detail names its status). Or `idempotency-key-in-use`: \
                                            another request is refunding this payment right now, retry after \
                                            `Retry-After`. Nothing was written.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying, for `idempotency-key-in-use`")))]
    Conflict(Problem),
    #[response(status = 422, description = "`idempotency-key-reused`: the key was already used with a different \
                                            request. `nothing-to-refund`: the payment's refunds that have not failed \
                                            already add up to its amount. `refund-exceeds-payment`: the refund asks \
                                            for more than is left (the detail says how much, in which currency). \
                                            Nothing was written.",
        content_type = "application/problem+json",
        headers(("Idempotency-Key-Expires" = String, description = "HTTP date after which the key may be forgotten, \
                                                                   for `idempotency-key-reused`")))]
    Unprocessable(Problem),
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use oncepay_domain::fingerprint::Fingerprint;
    use serde_json::json;

    use super::*;

    #[test]
    fn the_fingerprint_covers_the_payment_however_its_id_was_spelled() {
        let body = json!({"amount": 100});
        let lower = PaymentId::from_str("0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e7f").unwrap();
        let upper = PaymentId::from_str("0192F0C4-7A3E-7C1D-9B1E-3F2A4C5D6E7F").unwrap();
        let other = PaymentId::generate();
        let fingerprint = |id| Fingerprint::of(idempotent_request::METHOD, &CreateRefund::path(&id), &body);

        assert_eq!(fingerprint(lower), fingerprint(upper));
        assert_ne!(fingerprint(lower), fingerprint(other));
    }

    #[test]
    fn each_refusal_becomes_its_own_problem() {
        use oncepay_domain::money::Currency;
        use oncepay_domain::status::PaymentStatus;

        let eur = Currency::parse("EUR").unwrap();
        let cases = [
            (Refusal::NoSuchPayment, 404, "not-found"),
            (Refusal::NotRefundable { status: PaymentStatus::Pending }, 409, "payment-not-refundable"),
            (Refusal::NothingLeft, 422, "nothing-to-refund"),
            (Refusal::TooMuch { asked: 2, left: 1, currency: eur }, 422, "refund-exceeds-payment"),
        ];
        for (refusal, status, slug) in cases {
            let problem = refused(refusal.clone()).problem();

            assert_eq!(problem.status, status, "{refusal:?}");
            assert!(problem.type_uri.ends_with(slug), "{refusal:?}: {}", problem.type_uri);
        }
    }
}
