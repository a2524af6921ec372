//! The OpenAPI 3.1 document of the public API, generated from the code with `utoipa` and served at
//! `GET /openapi.json`.
//!
//! The paths come from the handlers' `#[utoipa::path]` attributes, the response schemas from the
//! shared types' `ToSchema` derives (`PaymentResource`, `Problem`, ...), and the request body's
//! schema from the same limits `PaymentRequest::from_json` enforces, so the document cannot drift
//! from the behaviour. Nothing here is hand-written JSON.

use std::borrow::Cow;

use oncepay_shared::money::Amount;
use oncepay_shared::payment::{Failure, PaymentResource};
use oncepay_shared::payment_request::{FieldError, limits};
use oncepay_shared::problem::Problem;
use oncepay_shared::status::PaymentStatus;
use utoipa::openapi::schema::{AdditionalProperties, KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, RefOr};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "oncepay",
        description = "Payment intake that charges each accepted request at most once and always ends in an \
                       explained state. Every error is an RFC 9457 problem document (`application/problem+json`).",
    ),
    paths(crate::intake::create_payment, crate::status::get_payment),
    components(schemas(PaymentRequestBody, PaymentResource, PaymentStatus, Failure, Problem, FieldError)),
    modifiers(&BearerApiKey),
    tags((name = "payments", description = "Accepting payments and following them to their final state")),
)]
pub struct ApiDoc;

/// The document as JSON, rendered once at startup.
pub fn json() -> Result<String, serde_json::Error> {
    ApiDoc::openapi().to_json()
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
        let amount = ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(Amount::MIN))
            .maximum(Some(Amount::MAX))
            .description(Some("What to charge, in minor units of the currency (e.g. cents)."))
            .examples([1999]);
        let currency = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[A-Z]{3}$"))
            .description(Some("ISO 4217 code, upper case."))
            .examples(["EUR"]);
        let customer_id = ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(limits::CUSTOMER_ID_MAX_CHARS))
            .description(Some("Your reference for the customer being charged."));
        let description = ObjectBuilder::new()
            .schema_type(Type::String)
            .max_length(Some(limits::DESCRIPTION_MAX_CHARS))
            .description(Some("Free text, returned as given."));
        let metadata_value =
            ObjectBuilder::new().schema_type(Type::String).max_length(Some(limits::METADATA_VALUE_MAX_CHARS));
        let metadata = ObjectBuilder::new()
            .schema_type(Type::Object)
            .max_properties(Some(limits::METADATA_MAX_PAIRS))
            .additional_properties(Some(metadata_value))
            .description(Some(format!(
                "Your own key/value pairs (keys of 1 to {} characters), returned as given.",
                limits::METADATA_KEY_MAX_CHARS
            )));
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property("amount", amount)
            .property("currency", currency)
            .property("customer_id", customer_id)
            .property("description", description)
            .property("metadata", metadata)
            .required("amount")
            .required("currency")
            .required("customer_id")
            .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
            .description(Some("A payment request. Unknown fields are rejected (400)."))
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(document["components"]["securitySchemes"]["api_key"]["scheme"], "bearer");
        let body = &document["components"]["schemas"]["PaymentRequest"];
        assert_eq!(body["properties"]["amount"]["maximum"], Amount::MAX);
        assert_eq!(body["additionalProperties"], false);
    }
}
