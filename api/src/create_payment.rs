//! `POST /v1/payments`: accepts a payment request exactly once per (tenant, idempotency key).
//!
//! The request shell is [`crate::create`]'s; this module is the payment's part of it. A key whose
//! payment is final is replayed from memory ([`crate::replay_cache`]); any other request goes to the
//! store with the requests of its tenant that arrive meanwhile ([`crate::accept_groups`]), where a
//! known key is replayed and a new payment accepted. What the provider could never charge is refused
//! only for a new key: a stored key replays, whatever the provider's rules or the tenant's account
//! say now. A store that cannot be reached fails closed. Never logged: the API key, the idempotency
//! key, the body.

use std::borrow::Cow;
use std::sync::Arc;

use actix_web::{HttpRequest, HttpResponse, web};
use oncepay_domain::money::Currency;
use oncepay_domain::payment::PaymentResource;
use oncepay_domain::payment_request::{FieldError, PaymentRequest, limits};
use oncepay_domain::provider_ref::{self, ProviderAccount};
use oncepay_http::problem::Problem;
use oncepay_service::telemetry;
use oncepay_store::intake::{self, ExistingKey, Intake, NewPayment};
use oncepay_store::payments;
use serde_json::Value;
use time::OffsetDateTime;
use tracing::Span;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Schema, Type};
use utoipa::{IntoResponses, PartialSchema, ToSchema};

use crate::create::{self, Checked, Create, KnownKey, Responded};
use crate::endpoints::{
    Admission, IdempotencyKeyHeader, IntakeRefusals, JsonBodyRefusals, NO_NUL, amount_schema, metadata_schema,
};
use crate::errors::ApiError;
use crate::idempotent_request;
use crate::replay_cache::Final;
use crate::state::AppState;

/// Accepts a payment request, or replays the outcome of the first request with the same key.
#[utoipa::path(
    post,
    path = "/v1/payments",
    tag = "payments",
    operation_id = "create_payment",
    security(("api_key" = [])),
    params(IdempotencyKeyHeader),
    request_body(content = PaymentRequestBody, content_type = "application/json",
        description = "At most 64 KiB by default. Unknown fields, and a member named twice at any depth, are \
                       rejected."),
    responses(CreatePaymentResponses, IntakeRefusals, JsonBodyRefusals, Admission),
)]
pub async fn create_payment(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    create::respond::<CreatePayment>(&request, payload, &state).await
}

/// The payment's part of the create shell, for HTTP and for the broker ([`crate::broker`]).
pub struct CreatePayment;

impl Create for CreatePayment {
    const METRIC: &'static str = crate::metrics::INTAKE;
    type Target = ();
    type Body = PaymentRequest;

    fn target(_: &HttpRequest, _: &Span) -> Result<(), ApiError> {
        Ok(())
    }

    fn parse(json: &Value) -> Result<PaymentRequest, Vec<FieldError>> {
        PaymentRequest::from_json(json)
    }

    fn path((): &()) -> Cow<'static, str> {
        Cow::Borrowed("/v1/payments")
    }

    /// Serves the request from memory or from the store. What the configured provider could never
    /// charge (400, naming the field) or a tenant without the provider account it needs (400) is
    /// refused only once the key is known to be new.
    async fn store(state: &AppState, request: Checked<Self>, body: PaymentRequest) -> Result<Responded, ApiError> {
        // A key whose payment this process has seen final needs no round trip: its stored final
        // response, or 422 for another request.
        let tenant_id = request.caller.tenant_id;
        if let Some(remembered) = state.replays.get(tenant_id, &request.key, OffsetDateTime::now_utc()) {
            request.span.record("payment.id", tracing::field::display(remembered.payment_id));
            return replay_remembered(&request, remembered);
        }
        match state.provider_intake.admit(&body, request.caller.provider_account.as_ref()) {
            Ok(account) => accept(state, &request, body, account).await,
            Err(refusal) => replay_or_refuse(state, &request, refusal).await,
        }
    }
}

/// A request the provider's rules refuse now: if its key is stored, the payment it names is
/// replayed (or 422 for another request), as for any retry; only a new key gets `refusal`, and
/// nothing is written.
async fn replay_or_refuse(
    state: &AppState,
    request: &Checked<CreatePayment>,
    refusal: ApiError,
) -> Result<Responded, ApiError> {
    let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let stored =
        intake::stored(&mut conn, request.caller.tenant_id, &request.key).await.map_err(ApiError::from_store)?;
    conn.release();
    match stored {
        Some(existing) => replay_existing(state, request, existing).await,
        None => Err(refusal),
    }
}

/// The store's part: intake, together with the tenant's requests that arrive meanwhile, then for a
/// known key the replay (one more read while its payment is not terminal). A known key comes back as
/// stored and nothing is written: the same fingerprint is replayed, another one is refused (422). A
/// new key's payment, `body`, is charged to `account`.
async fn accept(
    state: &AppState,
    request: &Checked<CreatePayment>,
    body: PaymentRequest,
    account: Option<ProviderAccount>,
) -> Result<Responded, ApiError> {
    let new = NewPayment {
        tenant_id: request.caller.tenant_id,
        key: request.key.clone(),
        fingerprint: request.fingerprint,
        request: body,
        provider_account: account,
        retention: state.intake.key_retention(),
        lock_wait: Some(state.intake.key_lock_wait()),
        trace: telemetry::trace_context_of(&request.span),
    };
    // A new key is written in one statement with the other new keys of its group: key, payment,
    // outbox row and audit row each. If a concurrent request with the same key committed first,
    // intake waited for it (at most `lock_timeout`), wrote nothing and read the key again, so every
    // concurrent duplicate gets the same payment id.
    let accepted = Arc::clone(&state.accepts).accept(Arc::clone(&state.connections), new).await;
    match accepted.map_err(ApiError::from_intake)? {
        Intake::Created(created) => {
            // Committed: wake the workers, one coalesced `NOTIFY` for many accepts, naming the
            // tenants whose rows they queued (`oncepay_store::notify`).
            state.wake.announce(request.caller.tenant_id);
            request.span.record("payment.id", tracing::field::display(created.payment.payment_id));
            let resource = PaymentResource::from(&created.payment);
            Ok(Responded::created(&resource, created.key_expires_at, state.intake.retry_after_secs))
        }
        Intake::Existing(existing) => replay_existing(state, request, existing).await,
    }
}

/// The response for a known key: its stored final response, or the payment as it stands, read once
/// more (422 for another request either way).
async fn replay_existing(
    state: &AppState,
    request: &Checked<CreatePayment>,
    existing: ExistingKey,
) -> Result<Responded, ApiError> {
    request.span.record("payment.id", tracing::field::display(existing.payment_id));
    let known = KnownKey { created_by: existing.fingerprint, expires_at: existing.expires_at };
    let Some((status, body)) = existing.stored_response else {
        let tenant_id = request.caller.tenant_id;
        let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
        let reread = payments::fetch(&mut conn, tenant_id, existing.payment_id);
        let responded =
            request.replay_in_progress::<PaymentResource, _>(known, reread, state.intake.retry_after_secs).await;
        create::release_unless_in_doubt(conn, &responded);
        return responded;
    };
    let remembered = Final {
        fingerprint: known.created_by,
        payment_id: existing.payment_id,
        expires_at: known.expires_at,
        status,
        body: idempotent_request::stored_body(body),
    };
    // A stored response is final, so the next retry can be served from memory.
    state.replays.remember(request.caller.tenant_id, &request.key, remembered.clone());
    replay_remembered(request, remembered)
}

/// The response for a key whose payment is final: its stored response, or 422 for another request.
fn replay_remembered(request: &Checked<CreatePayment>, remembered: Final) -> Result<Responded, ApiError> {
    let known = KnownKey { created_by: remembered.fingerprint, expires_at: remembered.expires_at };
    request.replay_stored(known, remembered.status, remembered.body)
}

/// The body of `POST /v1/payments` (its schema only: the body is validated field by field by
/// `PaymentRequest::from_json`, whose limits this schema states).
pub struct PaymentRequestBody;

impl ToSchema for PaymentRequestBody {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("PaymentRequest")
    }
}

impl PartialSchema for PaymentRequestBody {
    fn schema() -> RefOr<Schema> {
        let amount = amount_schema("What to charge, in minor units of the currency (e.g. cents).").examples([1999]);
        let currency = ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(Currency::codes().iter().copied()))
            .description(Some("An active ISO 4217 code, upper case."))
            .examples(["EUR"]);
        let customer_id = ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(limits::CUSTOMER_ID_MAX_CHARS))
            .pattern(Some(NO_NUL))
            .description(Some("Your reference for the customer being charged."));
        let description = ObjectBuilder::new()
            .schema_type(Type::String)
            .max_length(Some(limits::DESCRIPTION_MAX_CHARS))
            .pattern(Some(NO_NUL))
            .description(Some("Free text, returned as given."));
        let metadata = metadata_schema();
        let reference = |description: &str, example: &str| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(provider_ref::MAX_LEN))
                .pattern(Some(provider_ref::PATTERN))
                .description(Some(description))
                .examples([example])
        };
        let payment_method = reference(
            "The provider's reference of the payment method to charge, e.g. `pm_card_visa` (ASCII letters, \
             digits and `_`), passed to the provider unchanged.",
            "pm_card_visa",
        );
        let provider_customer = reference(
            "The provider's customer that `payment_method` belongs to, e.g. Stripe's `cus_…`, for a payment \
             method saved to a customer. `customer_id` is never sent to the provider as its customer.",
            "cus_NffrFeUfNV2Hib",
        );
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property("amount", amount)
            .property("currency", currency)
            .property("customer_id", customer_id)
            .property("description", description)
            .property("metadata", metadata)
            .property("payment_method", payment_method)
            .property("provider_customer", provider_customer)
            .required("amount")
            .required("currency")
            .required("customer_id")
            .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
            .description(Some(
                "A payment request. Unknown fields, and a member named twice at any depth, are rejected (400).",
            ))
            .into()
    }
}

/// The responses of `POST /v1/payments`, besides those of [`IntakeRefusals`] and
/// [`Admission`].
#[derive(IntoResponses)]
pub enum CreatePaymentResponses {
    #[response(status = 202, description = "Accepted (or, with `Idempotent-Replayed: true`, a retry of a payment that is \
                                            still in progress). Poll the `Location` after `Retry-After` seconds.",
        headers(
            ("Location" = String, description = "`/v1/payments/{id}`"),
            ("Retry-After" = u64, description = "Seconds before polling the payment"),
            ("Idempotency-Key-Expires" = String, description = "HTTP date after which the key may be forgotten"),
            ("Idempotent-Replayed" = bool, description = "`true` when this repeats an earlier request's outcome"),
        ))]
    Accepted(PaymentResource),
    #[response(status = 200, description = "A retry of a payment that has reached its final state: the stored final \
                                            response, with `Idempotent-Replayed: true`.",
        headers(
            ("Idempotency-Key-Expires" = String, description = "HTTP date after which the key may be forgotten"),
            ("Idempotent-Replayed" = bool, description = "Always `true`"),
        ))]
    Replayed(PaymentResource),
    #[response(
        status = 400,
        description = "Missing or malformed `Idempotency-Key`, malformed JSON, a member named twice, or invalid fields \
                                            (each one listed in `errors`); in Stripe connect mode also a tenant with no \
                                            connected account (`no-provider-account`) or a payment with no \
                                            `payment_method`.",
        content_type = "application/problem+json"
    )]
    Invalid(Problem),
    #[response(status = 409, description = "Another request with this key is being processed right now; nothing was \
                                            written. Retry after `Retry-After`.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    KeyInUse(Problem),
    #[response(status = 422, description = "The key was already used with a different request; nothing was written.",
        content_type = "application/problem+json",
        headers(("Idempotency-Key-Expires" = String, description = "HTTP date after which the key may be forgotten")))]
    KeyReused(Problem),
}
