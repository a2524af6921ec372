//! The OpenAPI 3.1 document of the public API, generated from the code with `utoipa` and served at
//! `GET /openapi.json`.
//!
//! The paths come from the handlers' `#[utoipa::path]` attributes, which name their parameters and
//! responses by types defined beside each handler (one set per operation), or in
//! [`endpoints`](crate::endpoints) for those several operations share, such as the refusals all
//! share; types that are never built, only derived from. The response schemas come from the shared
//! types' `ToSchema` derives (`PaymentResource`, `RefundResource`, `Problem`, ...), and the request
//! bodies' schemas from the same limits `PaymentRequest::from_json`, `RefundRequest::from_json` and
//! the webhook endpoints' bodies enforce, so the document cannot drift from the behaviour. This module gathers them into one
//! document; nothing here is hand-written JSON.

use oncepay_domain::payment::{Failure, PaymentResource};
use oncepay_domain::payment_request::FieldError;
use oncepay_domain::refund::{RefundReason, RefundResource};
use oncepay_domain::refund_status::RefundStatus;
use oncepay_domain::status::PaymentStatus;
use oncepay_domain::webhook_endpoint::EndpointResource;
use oncepay_http::problem::Problem;
use utoipa::openapi::link::{Link, LinkBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, RefOr};
use utoipa::{Modify, OpenApi};

use crate::create_payment::PaymentRequestBody;
use crate::create_refund::RefundRequestBody;
use crate::list_refunds::RefundList;
use crate::webhook_endpoints::body::{EndpointChangeBody, NewEndpointBody};
use crate::webhook_endpoints::replay::{ReplayBody, ReplayQueued, TestQueued};
use crate::webhook_endpoints::{EndpointList, EndpointWithSecret};

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
        crate::webhook_endpoints::create_endpoint,
        crate::webhook_endpoints::list_endpoints,
        crate::webhook_endpoints::get_endpoint,
        crate::webhook_endpoints::update_endpoint,
        crate::webhook_endpoints::delete_endpoint,
        crate::webhook_endpoints::rotate_secret,
        crate::webhook_endpoints::replay::send_test,
        crate::webhook_endpoints::replay::replay_failed,
        crate::webhook_endpoints::replay::replay_event,
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
        RefundStatus,
        RefundReason,
        RefundList,
        NewEndpointBody,
        EndpointChangeBody,
        EndpointResource,
        EndpointWithSecret,
        EndpointList,
        ReplayBody,
        ReplayQueued,
        TestQueued,
    )),
    modifiers(&BearerApiKey, &Follow),
    tags(
        (name = "payments", description = "Accepting payments and following them to their final state"),
        (name = "refunds", description = "Giving money back from succeeded payments, at most once, and following \
                                          refunds to their final state"),
        (name = "webhook-endpoints", description = "Where your events are sent, as Standard Webhooks requests \
                                                    signed with each endpoint's own secret"),
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

#[cfg(test)]
mod tests {
    use oncepay_domain::money::Amount;
    use oncepay_domain::provider_ref;

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

    #[test]
    fn the_document_describes_the_webhook_endpoints_and_their_secrets() {
        let document: serde_json::Value = serde_json::from_str(&json().unwrap()).unwrap();

        let collection = &document["paths"]["/v1/webhook-endpoints"];
        let one = &document["paths"]["/v1/webhook-endpoints/{id}"];
        let rotate = &document["paths"]["/v1/webhook-endpoints/{id}/rotate-secret"]["post"];
        for (operation, statuses) in [
            (&collection["post"], &["201", "400", "401", "413", "415", "422", "429", "503"][..]),
            (&collection["get"], &["200", "401", "429", "503"]),
            (&one["get"], &["200", "401", "404", "429", "503"]),
            (&one["patch"], &["200", "400", "401", "404", "413", "415", "422", "429", "503"]),
            (&one["delete"], &["204", "401", "404", "429", "503"]),
            (rotate, &["200", "401", "404", "429", "503"]),
        ] {
            assert_eq!(operation["tags"][0], "webhook-endpoints", "{operation}");
            for status in statuses {
                assert!(operation["responses"][status].is_object(), "{} {status}", operation["operationId"]);
            }
        }
        for created in [&collection["post"]["responses"]["201"], &rotate["responses"]["200"]] {
            let schema = &created["content"]["application/json"]["schema"]["$ref"];
            assert_eq!(schema, "#/components/schemas/EndpointWithSecret");
        }
        let schemas = &document["components"]["schemas"];
        assert_eq!(schemas["EndpointRequest"]["required"], serde_json::json!(["url"]));
        assert_eq!(schemas["EndpointRequest"]["additionalProperties"], false);
        assert_eq!(schemas["EndpointChange"]["additionalProperties"], false);
        assert!(schemas["EndpointChange"]["properties"]["enabled"].is_object());
        let types = schemas["EndpointRequest"]["properties"]["event_types"]["items"]["enum"].as_array().unwrap();
        assert_eq!(types.len(), oncepay_domain::merchant_event::EventType::ALL.len());
    }
}
