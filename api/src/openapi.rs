//! The OpenAPI 3.1 document of the public API, generated from the code with `utoipa` and served at
//! `GET /openapi.json`.
//!
//! The paths come from the handlers' `#[utoipa::path]` attributes, which name their parameters and
//! responses by the types at the end of this file (one set per operation, and [`Admission`] for the
//! refusals all share; types that are never built, only derived from). The response schemas come
//! from the shared types' `ToSchema` derives (`PaymentResource`, `RefundResource`, `Problem`, ...),
//! and the request bodies' schemas from the same limits `PaymentRequest::from_json` and
//! `RefundRequest::from_json` enforce, so the document cannot drift from the behaviour. Nothing here
//! is hand-written JSON.

use std::borrow::Cow;

use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::payment::{Failure, PaymentResource};
use oncepay_domain::payment_request::{FieldError, limits};
use oncepay_domain::provider_ref;
use oncepay_domain::refund::{RefundReason, RefundResource};
use oncepay_domain::status::PaymentStatus;
use oncepay_http::problem::Problem;
use utoipa::openapi::link::{Link, LinkBuilder};
use utoipa::openapi::schema::{AdditionalProperties, KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};

use crate::list_refunds::RefundList;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, RefOr};
use utoipa::{IntoParams, IntoResponses, Modify, OpenApi, PartialSchema, ToSchema};

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "oncepay",
        description = "Payment intake that charges each accepted request at most once and always ends in an \
                       explained state. Every error is an RFC 9457 problem document (`application/problem+json`).",
    ),
    paths(
        crate::create_payment::create_payment,
        crate::get_payment::get_payment,
        crate::create_refund::create_refund,
        crate::get_refund::get_refund,
        crate::list_refunds::list_refunds,
    ),
    components(schemas(
        PaymentRequestBody,
        PaymentResource,
        PaymentStatus,
        Failure,
        Problem,
        FieldError,
        RefundRequestBody,
        RefundResource,
        RefundReason,
        RefundList,
    )),
    modifiers(&BearerApiKey, &Follow),
    tags(
        (name = "payments", description = "Accepting payments and following them to their final state"),
        (name = "refunds", description = "Giving money back from succeeded payments, at most once, and following \
                                          refunds to their final state"),
    ),
)]
pub struct ApiDoc;

/// The document as JSON, rendered once at startup.
pub fn json() -> Result<String, serde_json::Error> {
    let mut document = serde_json::to_value(ApiDoc::openapi())?;
    camel_case_links(&mut document);
    serde_json::to_string(&document)
}

/// utoipa 5 writes a Link object's fields in snake case (`operation_id`; fixed in utoipa 6), which
/// no OpenAPI tool reads: rename them to the specification's `operationId`, `operationRef` and
/// `requestBody`.
fn camel_case_links(document: &mut serde_json::Value) {
    let Some(paths) = document.get_mut("paths").and_then(serde_json::Value::as_object_mut) else {
        return;
    };
    let responses = paths
        .values_mut()
        .filter_map(serde_json::Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(|operation| operation.get_mut("responses").and_then(serde_json::Value::as_object_mut))
        .flat_map(|responses| responses.values_mut());
    for response in responses {
        let Some(links) = response.get_mut("links").and_then(serde_json::Value::as_object_mut) else {
            continue;
        };
        for link in links.values_mut().filter_map(serde_json::Value::as_object_mut) {
            for (snake, camel) in
                [("operation_id", "operationId"), ("operation_ref", "operationRef"), ("request_body", "requestBody")]
            {
                if let Some(value) = link.remove(snake) {
                    link.insert(camel.to_owned(), value);
                }
            }
        }
    }
}

/// The `api_key` security scheme: `Authorization: Bearer opk_...`.
struct BearerApiKey;

impl Modify for BearerApiKey {
    fn modify(&self, openapi: &mut Document) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .bearer_format("opk_...")
            .description(Some("A tenant's API key, shown once when an operator creates it."))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("api_key", SecurityScheme::Http(scheme));
    }
}

/// Strings that PostgreSQL can store: no U+0000 (`PaymentRequest::from_json` refuses it).
const NO_NUL: &str = "^[^\\u0000]*$";

/// Links from each response that carries a new payment or refund (202, 200) to the operations
/// that follow it, so clients and API test tools can go from a creation to its status, and from a
/// payment to its refunds.
struct Follow;

impl Follow {
    /// `(path of a creating POST, link name, operation linked to, description)`; the linked
    /// operation's `id` is the created resource's `id`.
    const LINKS: [(&str, &str, &str, &str); 4] = [
        ("/v1/payments", "get_payment", "get_payment", "The payment as it stands (the `Location` of a 202)."),
        ("/v1/payments", "list_refunds", "list_refunds", "The payment's refunds."),
        ("/v1/payments", "create_refund", "create_refund", "A refund of the payment, once it has succeeded."),
        ("/v1/payments/{id}/refunds", "get_refund", "get_refund", "The refund as it stands (the `Location` of a 202)."),
    ];

    fn link(operation_id: &str, description: &str) -> Link {
        LinkBuilder::new()
            .operation_id(operation_id)
            .parameter("id", "$response.body#/id")
            .description(description)
            .build()
    }
}

impl Modify for Follow {
    fn modify(&self, openapi: &mut Document) {
        for (path, name, operation_id, description) in Self::LINKS {
            let Some(create) = openapi.paths.paths.get_mut(path).and_then(|item| item.post.as_mut()) else {
                continue;
            };
            for status in ["200", "202"] {
                if let Some(RefOr::T(response)) = create.responses.responses.get_mut(status) {
                    response.links.insert(name.to_owned(), RefOr::T(Self::link(operation_id, description)));
                }
            }
        }
    }
}

/// `amount`: minor units, within the limits of [`Amount`].
fn amount_schema(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(Amount::MIN))
        .maximum(Some(Amount::MAX))
        .description(Some(description))
}

/// `metadata`: the merchant's key/value pairs, within the limits `from_json` enforces.
fn metadata_schema() -> ObjectBuilder {
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

/// The responses of `POST /v1/payments`, besides those of [`Admission`].
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
    #[response(status = 422, description = "The key was already used with a different request; nothing was written.",
        content_type = "application/problem+json",
        headers(("Idempotency-Key-Expires" = String, description = "HTTP date after which the key may be forgotten")))]
    KeyReused(Problem),
    #[response(status = 503, description = "The store cannot be reached; nothing was written. Retry with the same key.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    Unavailable(Problem),
}

/// The path of `GET /v1/payments/{id}` and of a payment's refunds.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PaymentPath {
    /// The payment's id, from `Location`
    #[param(format = Uuid)]
    pub id: String,
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

/// The responses of `GET /v1/payments/{id}`, besides those of [`Admission`].
#[derive(IntoResponses)]
pub enum GetPaymentResponses {
    #[response(status = 200, description = "The payment.",
        headers(
            ("Retry-After" = u64, description = "Present while the payment is not final: seconds before polling again"),
            ("Preference-Applied" = String, description = "`wait=N` when a long poll was honoured, N as applied"),
        ))]
    Payment(PaymentResource),
    #[response(
        status = 404,
        description = "No such payment for this tenant.",
        content_type = "application/problem+json"
    )]
    NotFound(Problem),
    #[response(status = 503, description = "The store cannot be reached.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    Unavailable(Problem),
}

/// The path of `GET /v1/refunds/{id}`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct GetRefundPath {
    /// The refund's id, from `Location`
    #[param(format = Uuid)]
    pub id: String,
}

/// The responses of `POST /v1/payments/{id}/refunds`, besides those of [`Admission`].
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
    #[response(status = 422, description = "`idempotency-key-reused`: the key was already used with a different \
                                            request. `nothing-to-refund`: the payment's refunds that have not failed \
                                            already add up to its amount. `refund-exceeds-payment`: the refund asks \
                                            for more than is left (the detail says how much, in which currency). \
                                            Nothing was written.",
        content_type = "application/problem+json",
        headers(("Idempotency-Key-Expires" = String, description = "HTTP date after which the key may be forgotten, \
                                                                   for `idempotency-key-reused`")))]
    Unprocessable(Problem),
    #[response(status = 503, description = "The store cannot be reached; nothing was written. Retry with the same key.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    Unavailable(Problem),
}

/// The responses of `GET /v1/refunds/{id}`, besides those of [`Admission`].
#[derive(IntoResponses)]
pub enum GetRefundResponses {
    #[response(status = 200, description = "The refund.",
        headers(
            ("Retry-After" = u64, description = "Present while the refund is not final: seconds before polling again"),
            ("Preference-Applied" = String, description = "`wait=N` when a long poll was honoured, N as applied"),
        ))]
    Refund(RefundResource),
    #[response(
        status = 404,
        description = "No such refund for this tenant.",
        content_type = "application/problem+json"
    )]
    NotFound(Problem),
    #[response(status = 503, description = "The store cannot be reached.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    Unavailable(Problem),
}

/// The responses of `GET /v1/payments/{id}/refunds`, besides those of [`Admission`].
#[derive(IntoResponses)]
pub enum ListRefundsResponses {
    #[response(status = 200, description = "The payment's refunds, oldest first (an empty list if it has none).")]
    Refunds(RefundList),
    #[response(
        status = 404,
        description = "No such payment for this tenant.",
        content_type = "application/problem+json"
    )]
    NotFound(Problem),
    #[response(status = 503, description = "The store cannot be reached.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    Unavailable(Problem),
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// `api/openapi.json` holds the served document byte for byte, so a change to the public API
    /// shows in review as a change to that file. `ONCEPAY_WRITE_OPENAPI=1 cargo test -p oncepay-api
    /// --lib openapi` rewrites it after an intended change.
    #[test]
    fn the_served_document_is_the_published_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
        let served = json().unwrap();
        if std::env::var_os("ONCEPAY_WRITE_OPENAPI").is_some() {
            std::fs::write(path, &served).unwrap();
        }

        let published = std::fs::read_to_string(path).unwrap();

        assert!(served == published, "the OpenAPI document differs from {path}; rewrite it if the change is intended");
    }

    #[test]
    fn the_document_describes_both_endpoints_their_problems_and_the_bearer_scheme() {
        let document: serde_json::Value = serde_json::from_str(&json().unwrap()).unwrap();

        let create = &document["paths"]["/v1/payments"]["post"];
        let get = &document["paths"]["/v1/payments/{id}"]["get"];
        for status in ["202", "200", "400", "401", "409", "413", "415", "422", "429", "503"] {
            assert!(create["responses"][status].is_object(), "POST {status}");
        }
        for status in ["200", "401", "404", "429", "503"] {
            assert!(get["responses"][status].is_object(), "GET {status}");
        }
        assert!(create["responses"]["409"]["content"]["application/problem+json"].is_object());
        for status in ["200", "202"] {
            let link = &create["responses"][status]["links"]["get_payment"];
            assert_eq!(link["operationId"], get["operationId"], "POST {status}");
            assert_eq!(link["parameters"]["id"], "$response.body#/id", "POST {status}");
        }
        assert_eq!(document["components"]["securitySchemes"]["api_key"]["scheme"], "bearer");
        let body = &document["components"]["schemas"]["PaymentRequest"];
        assert_eq!(body["properties"]["amount"]["maximum"], Amount::MAX);
        assert_eq!(body["additionalProperties"], false);
        let currencies = body["properties"]["currency"]["enum"].as_array().unwrap();
        assert!(currencies.contains(&"EUR".into()) && !currencies.contains(&"XAU".into()));
        assert_eq!(body["properties"]["payment_method"]["pattern"], provider_ref::PATTERN);
        assert_eq!(body["properties"]["provider_customer"]["pattern"], provider_ref::PATTERN);
        let resource = &document["components"]["schemas"]["PaymentResource"];
        assert!(resource["properties"]["payment_method"].is_object(), "{resource}");
        assert!(resource["properties"]["provider_customer"].is_object(), "{resource}");
        assert!(resource["required"].as_array().unwrap().contains(&"amount_refunded".into()), "{resource}");
    }

    #[test]
    fn the_document_describes_the_refund_endpoints_their_problems_and_links() {
        let document: serde_json::Value = serde_json::from_str(&json().unwrap()).unwrap();

        let create = &document["paths"]["/v1/payments/{id}/refunds"]["post"];
        let list = &document["paths"]["/v1/payments/{id}/refunds"]["get"];
        let get = &document["paths"]["/v1/refunds/{id}"]["get"];
        for status in ["202", "200", "400", "401", "404", "409", "413", "415", "422", "429", "503"] {
            assert!(create["responses"][status].is_object(), "POST refunds {status}");
        }
        for status in ["200", "401", "404", "429", "503"] {
            assert!(get["responses"][status].is_object(), "GET refund {status}");
            assert!(list["responses"][status].is_object(), "GET refunds {status}");
        }
        for slug in ["payment-not-refundable", "idempotency-key-in-use"] {
            assert!(create["responses"]["409"]["description"].as_str().unwrap().contains(slug), "409 {slug}");
        }
        for slug in ["idempotency-key-reused", "nothing-to-refund", "refund-exceeds-payment"] {
            assert!(create["responses"]["422"]["description"].as_str().unwrap().contains(slug), "422 {slug}");
        }
        let parameters: Vec<&str> =
            create["parameters"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(parameters, ["id", "Idempotency-Key"]);
        for status in ["200", "202"] {
            let link = &create["responses"][status]["links"]["get_refund"];
            assert_eq!(link["operationId"], get["operationId"], "POST refunds {status}");
            let from_payment = &document["paths"]["/v1/payments"]["post"]["responses"][status]["links"];
            assert_eq!(from_payment["create_refund"]["operationId"], create["operationId"], "POST {status}");
            assert_eq!(from_payment["list_refunds"]["operationId"], list["operationId"], "POST {status}");
        }
        let body = &document["components"]["schemas"]["RefundRequest"];
        assert_eq!(body["additionalProperties"], false);
        assert!(body.get("required").is_none(), "every field is optional: {body}");
        let reasons = body["properties"]["reason"]["enum"].as_array().unwrap();
        assert_eq!(reasons.len(), RefundReason::ALL.len());
        let list_schema = &document["components"]["schemas"]["RefundList"];
        assert_eq!(list_schema["properties"]["data"]["items"]["$ref"], "#/components/schemas/RefundResource");
    }
}
