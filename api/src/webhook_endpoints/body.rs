//! The bodies of `POST /v1/webhook-endpoints` and `PATCH /v1/webhook-endpoints/{id}`: read field by
//! field, every wrong field reported in a message that names it, and their schemas in the OpenAPI
//! document, stated from the same limits.
//!
//! Pure: no I/O. A URL is kept as [`endpoint_url::destination`] parsed it (normalised, so every response
//! and the worker see the same text); event types must be ones oncepay sends, each kept once, in
//! the order given. A string PostgreSQL cannot store (U+0000) is refused here, never by the store.

use std::borrow::Cow;

use oncepay_domain::endpoint_url::{self, MAX_URL_LEN, UrlPolicy};
use oncepay_domain::merchant_event::EventType;
use oncepay_domain::payment_request::FieldError;
use oncepay_store::merchant_endpoints::{EndpointChange, NewEndpoint};
use serde_json::Value;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AdditionalProperties, ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::endpoints::NO_NUL;

/// The longest description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 1000;

/// The body of `POST /v1/webhook-endpoints`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEndpointBody {
    /// Where deliveries go, normalised.
    pub url: String,
    /// The merchant's note; empty if none was given.
    pub description: String,
    /// The types it receives; empty means every type.
    pub event_types: Vec<String>,
}

/// The body of `PATCH /v1/webhook-endpoints/{id}`, checked; `None` keeps the field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointChangeBody {
    /// A new URL, normalised.
    pub url: Option<String>,
    /// A new note.
    pub description: Option<String>,
    /// New types; empty means every type.
    pub event_types: Option<Vec<String>>,
    /// `false` stops deliveries; `true` starts them again, whatever stopped them.
    pub enabled: Option<bool>,
}

impl NewEndpointBody {
    /// Reads the body of a create under the installation's URL `policy`, naming every wrong field.
    pub fn from_json(body: &Value, policy: UrlPolicy) -> Result<Self, Vec<FieldError>> {
        let (fields, mut errors) = Fields::read(body, &["url", "description", "event_types"], policy);
        if body.is_object() && body.get("url").is_none() {
            errors.push(refused("url", "`url` is required".to_owned()));
        }
        match fields.url {
            Some(url) if errors.is_empty() => Ok(Self {
                url,
                description: fields.description.unwrap_or_default(),
                event_types: fields.event_types.unwrap_or_default(),
            }),
            _ => Err(errors),
        }
    }

    /// The endpoint to make, with its first `secret`.
    pub fn with_secret<'a>(&'a self, secret: &'a str) -> NewEndpoint<'a> {
        NewEndpoint { url: &self.url, description: &self.description, event_types: &self.event_types, secret }
    }
}

impl EndpointChangeBody {
    /// Reads the body of a change under the installation's URL `policy`, naming every wrong field.
    pub fn from_json(body: &Value, policy: UrlPolicy) -> Result<Self, Vec<FieldError>> {
        let (fields, errors) = Fields::read(body, &["url", "description", "event_types", "enabled"], policy);
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self {
            url: fields.url,
            description: fields.description,
            event_types: fields.event_types,
            enabled: fields.enabled,
        })
    }

    /// The change to make.
    pub fn change(&self) -> EndpointChange<'_> {
        EndpointChange {
            url: self.url.as_deref(),
            description: self.description.as_deref(),
            event_types: self.event_types.as_deref(),
            enabled: self.enabled,
        }
    }
}

/// The fields a body has that passed their checks.
#[derive(Default)]
struct Fields {
    url: Option<String>,
    description: Option<String>,
    event_types: Option<Vec<String>>,
    enabled: Option<bool>,
}

impl Fields {
    /// Reads the fields of `body`, which may have those named in `allowed` and no other: those
    /// that passed their checks, and a refusal for each wrong one.
    fn read(body: &Value, allowed: &[&str], policy: UrlPolicy) -> (Self, Vec<FieldError>) {
        let Some(object) = body.as_object() else {
            return (Self::default(), vec![refused("(body)", "the body must be a JSON object".to_owned())]);
        };
        let mut errors: Vec<FieldError> = object
            .keys()
            .filter(|name| !allowed.contains(&name.as_str()))
            .map(|name| refused(name, format!("`{name}` is not a field of this request")))
            .collect();
        let take = |name: &str| object.get(name).filter(|_| allowed.contains(&name));
        let fields = Self {
            url: take("url").and_then(|value| note(url(value, policy), &mut errors)),
            description: take("description").and_then(|value| note(description(value), &mut errors)),
            event_types: take("event_types").and_then(|value| note(event_types(value), &mut errors)),
            enabled: take("enabled").and_then(|value| note(enabled(value), &mut errors)),
        };
        (fields, errors)
    }
}

/// The value `result` holds, or `None` with its errors added to `errors`.
fn note<T>(result: Result<T, Vec<FieldError>>, errors: &mut Vec<FieldError>) -> Option<T> {
    result.map_err(|refusals| errors.extend(refusals)).ok()
}

/// A refusal of `field`; `message` names it, so the problem's detail reads on its own.
fn refused(field: &str, message: String) -> FieldError {
    FieldError { field: field.to_owned(), message }
}

fn url(value: &Value, policy: UrlPolicy) -> Result<String, Vec<FieldError>> {
    let text = value.as_str().ok_or_else(|| vec![refused("url", "`url` must be a string".to_owned())])?;
    endpoint_url::destination(text, policy)
        .map(|destination| destination.to_string())
        .map_err(|refusal| vec![refused("url", refusal.to_string())])
}

fn description(value: &Value) -> Result<String, Vec<FieldError>> {
    let message = match value.as_str() {
        Some(text) if text.chars().count() > MAX_DESCRIPTION_CHARS => {
            format!("`description` must be at most {MAX_DESCRIPTION_CHARS} characters")
        }
        Some(text) if text.contains('\0') => "`description` must not contain the NUL character (U+0000)".to_owned(),
        Some(text) => return Ok(text.to_owned()),
        None => "`description` must be a string".to_owned(),
    };
    Err(vec![refused("description", message)])
}

fn event_types(value: &Value) -> Result<Vec<String>, Vec<FieldError>> {
    let items = value
        .as_array()
        .ok_or_else(|| vec![refused("event_types", "`event_types` must be an array of event types".to_owned())])?;
    let mut types: Vec<String> = Vec::with_capacity(items.len());
    let mut errors = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let field = format!("event_types[{index}]");
        match item.as_str().map(|name| (name, EventType::parse(name))) {
            Some((_, Some(event_type))) if types.iter().any(|kept| kept == event_type.as_str()) => {}
            Some((_, Some(event_type))) => types.push(event_type.as_str().to_owned()),
            Some((name, None)) => {
                let message = format!("`{field}`: there is no event type `{name}`");
                errors.push(refused(&field, message));
            }
            None => {
                let message = format!("`{field}` must be a string");
                errors.push(refused(&field, message));
            }
        }
    }
    if errors.is_empty() { Ok(types) } else { Err(errors) }
}

fn enabled(value: &Value) -> Result<bool, Vec<FieldError>> {
    value.as_bool().ok_or_else(|| vec![refused("enabled", "`enabled` must be true or false".to_owned())])
}

impl ToSchema for NewEndpointBody {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("EndpointRequest")
    }
}

impl PartialSchema for NewEndpointBody {
    fn schema() -> RefOr<Schema> {
        with_fields(ObjectBuilder::new())
            .required("url")
            .description(Some(
                "A new webhook endpoint. Unknown fields, and a member named twice at any depth, are rejected.",
            ))
            .into()
    }
}

impl ToSchema for EndpointChangeBody {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("EndpointChange")
    }
}

impl PartialSchema for EndpointChangeBody {
    fn schema() -> RefOr<Schema> {
        let enabled = ObjectBuilder::new().schema_type(Type::Boolean).description(Some(
            "`false` stops deliveries (`disabled_reason` becomes `merchant`); `true` starts them again, whatever \
             stopped them.",
        ));
        with_fields(ObjectBuilder::new())
            .property("enabled", enabled)
            .description(Some(
                "A change to a webhook endpoint: the fields given replace its own, the others stay. Unknown fields, \
                 and a member named twice at any depth, are rejected.",
            ))
            .into()
    }
}

/// `object` with the fields both bodies have, and no other.
fn with_fields(object: ObjectBuilder) -> ObjectBuilder {
    let url = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(MAX_URL_LEN))
        .description(Some(
            "Where deliveries are sent: an absolute `https` URL, without a user name, a password or a fragment, at \
             a public address. Returned normalised (e.g. `https://merchant.example` as `https://merchant.example/`). \
             Where the installation allows it, `rabbitmq:merchant.<name>` instead: each event is published to that \
             exchange on oncepay's RabbitMQ node, with the routing key `<tenant>.<event type>`.",
        ))
        .examples(["https://merchant.example/oncepay/events"]);
    let description = ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(MAX_DESCRIPTION_CHARS))
        .pattern(Some(NO_NUL))
        .description(Some("Your note, returned as given."));
    let event_type = ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(EventType::ALL.iter().map(|event_type| event_type.as_str())));
    let event_types = ArrayBuilder::new()
        .items(event_type)
        .description(Some("The event types sent to it, each kept once; left out or empty, every type."));
    object
        .schema_type(Type::Object)
        .property("url", url)
        .property("description", description)
        .property("event_types", event_types)
        .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const STRICT: UrlPolicy = UrlPolicy { allow_http: false, allow_private_addresses: false, allow_exchanges: false };

    fn fields_of(errors: &[FieldError]) -> Vec<&str> {
        errors.iter().map(|error| error.field.as_str()).collect()
    }

    #[test]
    fn a_new_endpoint_needs_only_a_url_and_keeps_it_normalised() {
        let body = NewEndpointBody::from_json(&json!({"url": "https://merchant.example"}), STRICT).unwrap();

        assert_eq!(
            body,
            NewEndpointBody {
                url: "https://merchant.example/".into(),
                description: String::new(),
                event_types: vec![]
            }
        );
    }

    #[test]
    fn event_types_are_kept_once_in_the_order_given() {
        let body = json!({
            "url": "https://merchant.example/hooks",
            "description": "orders",
            "event_types": ["refund.failed", "payment.succeeded", "refund.failed"],
        });

        let body = NewEndpointBody::from_json(&body, STRICT).unwrap();

        assert_eq!(body.event_types, ["refund.failed", "payment.succeeded"]);
        assert_eq!(body.description, "orders");
    }

    #[test]
    fn every_wrong_field_is_named_in_its_own_message() {
        let cases = [
            (json!({}), vec!["url"]),
            (json!({"colour": "red", "description": 1}), vec!["colour", "description", "url"]),
            (json!([]), vec!["(body)"]),
            (json!({"url": "http://merchant.example/"}), vec!["url"]),
            (json!({"url": "https://127.0.0.1/"}), vec!["url"]),
            (json!({"url": 1}), vec!["url"]),
            (json!({"url": null}), vec!["url"]),
            (json!({"url": "https://merchant.example/", "enabled": false}), vec!["enabled"]),
            (
                json!({"url": "https://merchant.example/", "description": "a".repeat(MAX_DESCRIPTION_CHARS + 1)}),
                vec!["description"],
            ),
            (json!({"url": "https://merchant.example/", "description": "a\u{0}"}), vec!["description"]),
            (json!({"url": "https://merchant.example/", "event_types": "payment.succeeded"}), vec!["event_types"]),
            (
                json!({"url": "https://merchant.example/", "event_types": ["payment.succeeded", "payment.charged", 7]}),
                vec!["event_types[1]", "event_types[2]"],
            ),
            (
                json!({"url": "ftp://x/", "colour": "red", "event_types": ["x"]}),
                vec!["colour", "url", "event_types[0]"],
            ),
        ];
        for (body, fields) in cases {
            let errors = NewEndpointBody::from_json(&body, STRICT).unwrap_err();

            assert_eq!(fields_of(&errors), fields, "{body}");
            for error in &errors {
                let named = error.field.split('[').next().unwrap_or_default();
                assert!(error.message.contains(named) || error.field == "(body)", "{error:?}");
            }
        }
    }

    #[test]
    fn an_unknown_event_type_is_named() {
        let body = json!({"url": "https://merchant.example/", "event_types": ["payment.charged"]});

        let errors = NewEndpointBody::from_json(&body, STRICT).unwrap_err();

        assert!(errors[0].message.contains("`payment.charged`"), "{errors:?}");
    }

    #[test]
    fn the_description_may_be_exactly_as_long_as_allowed_in_characters() {
        let longest = "é".repeat(MAX_DESCRIPTION_CHARS);

        let body = json!({"url": "https://merchant.example/", "description": longest});

        assert!(NewEndpointBody::from_json(&body, STRICT).is_ok());
    }

    #[test]
    fn the_installation_may_allow_plain_http_and_private_addresses() {
        let body = json!({"url": "http://127.0.0.1:8000/hooks"});
        let open = UrlPolicy { allow_http: true, allow_private_addresses: true, allow_exchanges: false };

        assert!(NewEndpointBody::from_json(&body, STRICT).is_err());
        assert_eq!(NewEndpointBody::from_json(&body, open).unwrap().url, "http://127.0.0.1:8000/hooks");
    }

    #[test]
    fn an_exchange_is_an_endpoint_only_where_the_installation_allows_it() {
        let body = json!({"url": "rabbitmq:merchant.acme-orders"});
        let exchanges = UrlPolicy { allow_exchanges: true, ..STRICT };

        let refused = NewEndpointBody::from_json(&body, STRICT).unwrap_err();
        assert_eq!(fields_of(&refused), ["url"]);
        assert!(refused[0].message.contains("https only"), "{}", refused[0].message);
        assert_eq!(NewEndpointBody::from_json(&body, exchanges).unwrap().url, "rabbitmq:merchant.acme-orders");
        let oncepays_own = NewEndpointBody::from_json(&json!({"url": "rabbitmq:oncepay.payments"}), exchanges);
        assert_eq!(fields_of(&oncepays_own.unwrap_err()), ["url"]);
    }

    #[test]
    fn a_change_keeps_what_it_leaves_out() {
        let empty = EndpointChangeBody::from_json(&json!({}), STRICT).unwrap();
        let disable = EndpointChangeBody::from_json(&json!({"enabled": false}), STRICT).unwrap();
        let every_type = EndpointChangeBody::from_json(&json!({"event_types": []}), STRICT).unwrap();

        assert_eq!(empty, EndpointChangeBody::default());
        assert_eq!(disable, EndpointChangeBody { enabled: Some(false), ..EndpointChangeBody::default() });
        assert_eq!(every_type.change().event_types, Some(&[][..]));
    }

    #[test]
    fn a_change_is_checked_as_a_new_endpoint_is() {
        let body = json!({"url": "https://10.0.0.1/", "enabled": "no", "secret": "whsec_x"});

        let errors = EndpointChangeBody::from_json(&body, STRICT).unwrap_err();

        assert_eq!(fields_of(&errors), ["secret", "url", "enabled"]);
    }
}
