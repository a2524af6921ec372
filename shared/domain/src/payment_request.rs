//! The body of `POST /v1/payments`, checked field by field.
//!
//! [`PaymentRequest::from_json`] returns a typed request, or every field that is wrong, each with a
//! message that names it. Unknown fields and wrong types are errors, so a typo never silently drops
//! data.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::money::{Amount, Currency};
use crate::provider_ref::{PaymentMethod, ProviderCustomer, ReferenceError};

/// A validated payment request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentRequest {
    /// What to charge, in minor units.
    pub amount: Amount,
    /// In which currency.
    pub currency: Currency,
    /// The merchant's reference for the customer being charged.
    pub customer_id: String,
    /// Free text for the merchant.
    pub description: Option<String>,
    /// The merchant's own key/value pairs, returned as given.
    pub metadata: BTreeMap<String, String>,
    /// What the provider is to charge, e.g. `pm_card_visa`; none leaves it to the provider.
    pub payment_method: Option<PaymentMethod>,
    /// The provider's customer that `payment_method` belongs to, e.g. Stripe's `cus_…`, when the
    /// method is one saved to a customer.
    pub provider_customer: Option<ProviderCustomer>,
}

/// One thing wrong with one field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// The JSON field, e.g. `amount` or `metadata.order_id`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl FieldError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

/// Limits on the request body, beyond the types.
pub mod limits {
    /// Longest `customer_id`, in characters.
    pub const CUSTOMER_ID_MAX_CHARS: usize = 255;
    /// Longest `description`, in characters.
    pub const DESCRIPTION_MAX_CHARS: usize = 1000;
    /// Most `metadata` pairs.
    pub const METADATA_MAX_PAIRS: usize = 50;
    /// Longest `metadata` key, in characters.
    pub const METADATA_KEY_MAX_CHARS: usize = 40;
    /// Longest `metadata` value, in characters.
    pub const METADATA_VALUE_MAX_CHARS: usize = 500;
}

const KNOWN_FIELDS: [&str; 7] =
    ["amount", "currency", "customer_id", "description", "metadata", "payment_method", "provider_customer"];

impl PaymentRequest {
    /// Validates a parsed JSON body, reporting every invalid field at once.
    pub fn from_json(body: &Value) -> Result<Self, Vec<FieldError>> {
        let Some(object) = body.as_object() else {
            return Err(vec![FieldError::new("(body)", "must be a JSON object")]);
        };
        let mut errors: Vec<FieldError> = object
            .keys()
            .filter(|k| !KNOWN_FIELDS.contains(&k.as_str()))
            .map(|k| FieldError::new(k.as_str(), "is not a known field"))
            .collect();

        let amount = required(object, "amount", &mut errors).and_then(|v| note(parse_amount(v), "amount", &mut errors));
        let currency =
            required(object, "currency", &mut errors).and_then(|v| note(parse_currency(v), "currency", &mut errors));
        let customer_id = required(object, "customer_id", &mut errors)
            .and_then(|v| note(parse_customer_id(v), "customer_id", &mut errors));
        let description = optional(object, "description")
            .map(|v| note(parse_description(v), "description", &mut errors))
            .unwrap_or(Some(None));
        let metadata = optional(object, "metadata")
            .map(|v| parse_metadata(v, &mut errors))
            .unwrap_or_else(|| Some(BTreeMap::new()));
        let payment_method = optional(object, "payment_method")
            .map(|v| note(parse_reference(v, PaymentMethod::parse), "payment_method", &mut errors))
            .unwrap_or(Some(None));
        let provider_customer = optional(object, "provider_customer")
            .map(|v| note(parse_reference(v, ProviderCustomer::parse), "provider_customer", &mut errors))
            .unwrap_or(Some(None));

        match (amount, currency, customer_id, description, metadata, payment_method, provider_customer) {
            (
                Some(amount),
                Some(currency),
                Some(customer_id),
                Some(description),
                Some(metadata),
                Some(payment_method),
                Some(provider_customer),
            ) if errors.is_empty() => {
                Ok(Self { amount, currency, customer_id, description, metadata, payment_method, provider_customer })
            }
            _ => Err(errors),
        }
    }
}

pub(crate) fn required<'a>(
    object: &'a Map<String, Value>,
    field: &str,
    errors: &mut Vec<FieldError>,
) -> Option<&'a Value> {
    match object.get(field) {
        None | Some(Value::Null) => {
            errors.push(FieldError::new(field, "is required"));
            None
        }
        Some(value) => Some(value),
    }
}

/// An absent field and an explicit `null` both mean "not given".
pub(crate) fn optional<'a>(object: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    object.get(field).filter(|v| !v.is_null())
}

pub(crate) fn note<T>(result: Result<T, String>, field: &str, errors: &mut Vec<FieldError>) -> Option<T> {
    result.map_err(|message| errors.push(FieldError::new(field, message))).ok()
}

pub(crate) fn parse_amount(value: &Value) -> Result<Amount, String> {
    let range = || format!("must be an integer number of minor units between {} and {}", Amount::MIN, Amount::MAX);
    let Value::Number(number) = value else {
        return Err(format!("must be a number, got {}", type_name(value)));
    };
    let units = if let Some(units) = number.as_i64() {
        units
    } else if let Some(float) = number.as_f64() {
        // `1e3` and `1000.0` spell the integer 1000, as the fingerprint reads them too; anything with
        // a fraction is not minor units. The range check comes first so the cast below is exact.
        if float.fract() != 0.0 || !(Amount::MIN as f64..=Amount::MAX as f64).contains(&float) {
            return Err(range());
        }
        float as i64
    } else {
        return Err(range());
    };
    Amount::new(units).map_err(|_| range())
}

fn parse_currency(value: &Value) -> Result<Currency, String> {
    let Value::String(code) = value else {
        return Err(format!("must be a string, got {}", type_name(value)));
    };
    Currency::parse(code).map_err(|e| e.to_string())
}

fn parse_customer_id(value: &Value) -> Result<String, String> {
    let Value::String(id) = value else {
        return Err(format!("must be a string, got {}", type_name(value)));
    };
    let chars = id.chars().count();
    if chars == 0 || chars > limits::CUSTOMER_ID_MAX_CHARS {
        return Err(format!("must be 1 to {} characters", limits::CUSTOMER_ID_MAX_CHARS));
    }
    storable(id)?;
    Ok(id.clone())
}

fn parse_description(value: &Value) -> Result<Option<String>, String> {
    let Value::String(text) = value else {
        return Err(format!("must be a string, got {}", type_name(value)));
    };
    if text.chars().count() > limits::DESCRIPTION_MAX_CHARS {
        return Err(format!("must be at most {} characters", limits::DESCRIPTION_MAX_CHARS));
    }
    storable(text)?;
    Ok(Some(text.clone()))
}

/// A reference to something at the provider, checked by `parse`.
fn parse_reference<T>(value: &Value, parse: fn(&str) -> Result<T, ReferenceError>) -> Result<Option<T>, String> {
    let Value::String(reference) = value else {
        return Err(format!("must be a string, got {}", type_name(value)));
    };
    parse(reference).map(Some).map_err(|e| e.to_string())
}

pub(crate) fn parse_metadata(value: &Value, errors: &mut Vec<FieldError>) -> Option<BTreeMap<String, String>> {
    let Value::Object(pairs) = value else {
        errors.push(FieldError::new("metadata", format!("must be an object, got {}", type_name(value))));
        return None;
    };
    if pairs.len() > limits::METADATA_MAX_PAIRS {
        errors.push(FieldError::new(
            "metadata",
            format!("must have at most {} pairs, got {}", limits::METADATA_MAX_PAIRS, pairs.len()),
        ));
        return None;
    }
    let before = errors.len();
    let mut metadata = BTreeMap::new();
    for (key, value) in pairs {
        let field = format!("metadata.{key}");
        let key_chars = key.chars().count();
        if key_chars == 0 || key_chars > limits::METADATA_KEY_MAX_CHARS {
            errors.push(FieldError::new(
                &field,
                format!("keys must be 1 to {} characters", limits::METADATA_KEY_MAX_CHARS),
            ));
            continue;
        }
        if let Err(message) = storable(key) {
            errors.push(FieldError::new(&field, format!("keys {message}")));
            continue;
        }
        match value {
            Value::String(text) if text.chars().count() > limits::METADATA_VALUE_MAX_CHARS => {
                errors.push(FieldError::new(
                    &field,
                    format!("values must be at most {} characters", limits::METADATA_VALUE_MAX_CHARS),
                ))
            }
            Value::String(text) => match storable(text) {
                Ok(()) => {
                    metadata.insert(key.clone(), text.clone());
                }
                Err(message) => errors.push(FieldError::new(&field, format!("values {message}"))),
            },
            other => errors.push(FieldError::new(&field, format!("must be a string, got {}", type_name(other)))),
        }
    }
    (errors.len() == before).then_some(metadata)
}

/// PostgreSQL stores neither `text` nor `jsonb` strings containing U+0000, so such a string is
/// refused here, as a field error, rather than failing the write.
fn storable(text: &str) -> Result<(), String> {
    if text.contains('\0') { Err("must not contain the NUL character (U+0000)".to_owned()) } else { Ok(()) }
}

pub(crate) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(body: Value) -> Vec<String> {
        PaymentRequest::from_json(&body).err().unwrap_or_default().into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn a_complete_request_parses() {
        let body = json!({
            "amount": 1999, "currency": "EUR", "customer_id": "cus_42",
            "description": "Order #42", "metadata": {"order": "42"}, "payment_method": "pm_card_visa",
            "provider_customer": "cus_Q1"
        });

        let request = PaymentRequest::from_json(&body).unwrap();

        assert_eq!(request.amount.minor_units(), 1999);
        assert_eq!(request.currency.as_str(), "EUR");
        assert_eq!(request.customer_id, "cus_42");
        assert_eq!(request.description.as_deref(), Some("Order #42"));
        assert_eq!(request.metadata.get("order").map(String::as_str), Some("42"));
        assert_eq!(request.payment_method.as_ref().map(PaymentMethod::as_str), Some("pm_card_visa"));
        assert_eq!(request.provider_customer.as_ref().map(ProviderCustomer::as_str), Some("cus_Q1"));
    }

    #[test]
    fn optional_fields_may_be_absent_or_null() {
        let minimal = json!({"amount": 1, "currency": "JPY", "customer_id": "c"});
        let nulls = json!({
            "amount": 1, "currency": "JPY", "customer_id": "c", "description": null, "metadata": null,
            "payment_method": null, "provider_customer": null
        });

        for body in [minimal, nulls] {
            let request = PaymentRequest::from_json(&body).unwrap();
            assert_eq!(request.description, None);
            assert!(request.metadata.is_empty());
            assert_eq!(request.payment_method, None);
            assert_eq!(request.provider_customer, None);
        }
    }

    #[test]
    fn integral_spellings_of_an_amount_are_the_same_amount() {
        for spelling in ["1000", "1000.0", "1e3", "1.0E3", "10000e-1"] {
            let body: Value =
                serde_json::from_str(&format!(r#"{{"amount": {spelling}, "currency": "EUR", "customer_id": "c"}}"#))
                    .unwrap();
            assert_eq!(PaymentRequest::from_json(&body).unwrap().amount.minor_units(), 1000, "{spelling}");
        }
    }

    #[test]
    fn each_invalid_field_is_named() {
        let cases = [
            (json!([]), vec!["(body)"]),
            (json!({}), vec!["amount", "currency", "customer_id"]),
            (json!({"amount": 0, "currency": "EUR", "customer_id": "c"}), vec!["amount"]),
            (json!({"amount": 10.5, "currency": "EUR", "customer_id": "c"}), vec!["amount"]),
            (json!({"amount": 1e13, "currency": "EUR", "customer_id": "c"}), vec!["amount"]),
            (json!({"amount": "10", "currency": "EUR", "customer_id": "c"}), vec!["amount"]),
            (json!({"amount": 10, "currency": "eur", "customer_id": "c"}), vec!["currency"]),
            (json!({"amount": 10, "currency": "EUR", "customer_id": ""}), vec!["customer_id"]),
            (json!({"amount": 10, "currency": "EUR", "customer_id": 7}), vec!["customer_id"]),
            (
                json!({"amount": 10, "currency": "EUR", "customer_id": "c", "description": "x".repeat(1001)}),
                vec!["description"],
            ),
            (json!({"amount": 10, "currency": "EUR", "customer_id": "c", "metadata": []}), vec!["metadata"]),
            (json!({"amount": 10, "currency": "EUR", "customer_id": "c", "metadata": {"n": 1}}), vec!["metadata.n"]),
            (json!({"amount": 10, "currency": "EUR", "customer_id": "c", "amout": 10}), vec!["amout"]),
            (json!({"amount": 10, "currency": "EUR", "customer_id": "c\u{0}"}), vec!["customer_id"]),
            (json!({"amount": 10, "currency": "EUR", "customer_id": "c", "description": "\u{0}"}), vec!["description"]),
            (
                json!({"amount": 10, "currency": "EUR", "customer_id": "c", "metadata": {"k": "\u{0}"}}),
                vec!["metadata.k"],
            ),
            (
                json!({"amount": 10, "currency": "EUR", "customer_id": "c", "metadata": {"k\u{0}": "v"}}),
                vec!["metadata.k\u{0}"],
            ),
            (
                json!({"amount": 10, "currency": "EUR", "customer_id": "c", "payment_method": ""}),
                vec!["payment_method"],
            ),
            (
                json!({"amount": 10, "currency": "EUR", "customer_id": "c", "payment_method": "pm-card"}),
                vec!["payment_method"],
            ),
            (
                json!({"amount": 10, "currency": "EUR", "customer_id": "c", "payment_method": "p".repeat(256)}),
                vec!["payment_method"],
            ),
            (
                json!({"amount": 10, "currency": "EUR", "customer_id": "c", "payment_method": 42}),
                vec!["payment_method"],
            ),
            (
                json!({"amount": 0, "currency": "EUR", "customer_id": "c", "payment_method": {"id": "pm_1"}}),
                vec!["amount", "payment_method"],
            ),
            (
                json!({"amount": 10, "currency": "EUR", "customer_id": "c", "provider_customer": "cus-1"}),
                vec!["provider_customer"],
            ),
        ];
        for (body, expected) in cases {
            let mut got = fields(body.clone());
            got.sort();
            let mut expected: Vec<String> = expected.into_iter().map(String::from).collect();
            expected.sort();
            assert_eq!(got, expected, "{body}");
        }
    }

    #[test]
    fn metadata_is_limited_in_pairs_and_sizes() {
        let many: Map<String, Value> = (0..51).map(|i| (format!("k{i}"), json!("v"))).collect();
        let fifty: Map<String, Value> = (0..50).map(|i| (format!("k{i}"), json!("v"))).collect();
        let base = |metadata: Value| json!({"amount": 1, "currency": "EUR", "customer_id": "c", "metadata": metadata});

        assert_eq!(fields(base(Value::Object(many))), ["metadata"]);
        assert!(PaymentRequest::from_json(&base(Value::Object(fifty))).is_ok());
        assert_eq!(fields(base(json!({"k".repeat(41): "v"}))), [format!("metadata.{}", "k".repeat(41))]);
        assert_eq!(fields(base(json!({"k": "v".repeat(501)}))), ["metadata.k"]);
    }

    mod properties {
        use proptest::prelude::*;
        use serde_json::{Map, Value, json};

        use super::super::*;

        /// Codes from every corner of the ISO list.
        const CURRENCIES: [&str; 6] = ["AED", "EUR", "JPY", "USD", "XCG", "ZWG"];

        /// Text of `chars` characters of any Unicode scalar value but U+0000 (which PostgreSQL cannot
        /// store), control characters, new lines and quotes included.
        fn text(chars: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = String> {
            // Mapped rather than filtered, so long runs (PROPTEST_CASES) reject nothing.
            let storable = any::<char>().prop_map(|c| if c == '\0' { '\u{1}' } else { c });
            proptest::collection::vec(storable, chars).prop_map(|chars| chars.into_iter().collect())
        }

        /// `text` with a U+0000 somewhere.
        fn with_nul(chars: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = String> {
            (text(chars), any::<proptest::sample::Index>()).prop_map(|(text, at)| {
                let mut chars: Vec<char> = text.chars().collect();
                chars.insert(at.index(chars.len() + 1), '\0');
                chars.into_iter().collect()
            })
        }

        /// The fields of a valid request: amount, currency, customer, description, metadata, payment
        /// method.
        type Fields = (i64, &'static str, String, Option<String>, BTreeMap<String, String>, Option<String>);

        /// A request every rule allows, with its fields at any length up to their limits.
        fn valid_request() -> impl Strategy<Value = Fields> {
            (
                Amount::MIN..=Amount::MAX,
                proptest::sample::select(&CURRENCIES[..]),
                text(1..=limits::CUSTOMER_ID_MAX_CHARS),
                proptest::option::of(text(0..=limits::DESCRIPTION_MAX_CHARS)),
                proptest::collection::btree_map(
                    text(1..=limits::METADATA_KEY_MAX_CHARS),
                    text(0..=limits::METADATA_VALUE_MAX_CHARS),
                    0..=limits::METADATA_MAX_PAIRS,
                ),
                proptest::option::of("[A-Za-z0-9_]{1,255}"),
            )
        }

        fn body_of(
            (amount, currency, customer_id, description, metadata, payment_method): &Fields,
        ) -> Map<String, Value> {
            let mut body = Map::new();
            body.insert("amount".into(), json!(amount));
            body.insert("currency".into(), json!(currency));
            body.insert("customer_id".into(), json!(customer_id));
            if let Some(description) = description {
                body.insert("description".into(), json!(description));
            }
            if !metadata.is_empty() {
                body.insert("metadata".into(), json!(metadata));
            }
            if let Some(payment_method) = payment_method {
                body.insert("payment_method".into(), json!(payment_method));
            }
            body
        }

        /// One way to break one field of a valid body, and the field the error must name.
        #[derive(Debug, Clone)]
        enum Breakage {
            Remove(&'static str),
            Set(&'static str, Value),
            MetadataPair(String, Value),
            TooManyMetadataPairs,
            UnknownField(String),
        }

        fn breakage() -> impl Strategy<Value = Breakage> {
            let over = |max: usize| text(max + 1..=max + 20).prop_map(Value::String);
            prop_oneof![
                proptest::sample::select(vec!["amount", "currency", "customer_id"]).prop_map(Breakage::Remove),
                proptest::sample::select(vec!["amount", "currency", "customer_id"])
                    .prop_map(|field| Breakage::Set(field, Value::Null)),
                prop_oneof![
                    (i64::MIN..Amount::MIN).prop_map(|n| json!(n)),
                    (Amount::MAX + 1..=i64::MAX).prop_map(|n| json!(n)),
                    (i64::MAX as u64 + 1..=u64::MAX).prop_map(|n| json!(n)),
                    (1..Amount::MAX, 1..1000)
                        .prop_map(|(units, thousandths)| json!(units as f64 + f64::from(thousandths) / 1000.0)),
                    (1.000_001e12f64..1e300).prop_map(|f| json!(f)),
                    Just(json!("1000")),
                    Just(json!(true)),
                    Just(json!([1000])),
                ]
                .prop_map(|v| Breakage::Set("amount", v)),
                prop_oneof![
                    "[a-z]{3}".prop_map(Value::String),
                    "[A-Z]{0,2}|[A-Z]{4,6}".prop_map(Value::String),
                    Just(json!("QQQ")),
                    Just(json!("XAU")),
                    Just(json!("EUR ")),
                    Just(json!(978)),
                ]
                .prop_map(|v| Breakage::Set("currency", v)),
                prop_oneof![
                    Just(json!("")),
                    over(limits::CUSTOMER_ID_MAX_CHARS),
                    with_nul(0..=limits::CUSTOMER_ID_MAX_CHARS - 1).prop_map(Value::String),
                    Just(json!(42)),
                    Just(json!({})),
                ]
                .prop_map(|v| Breakage::Set("customer_id", v)),
                prop_oneof![
                    over(limits::DESCRIPTION_MAX_CHARS),
                    with_nul(0..=limits::DESCRIPTION_MAX_CHARS - 1).prop_map(Value::String),
                    Just(json!(1)),
                    Just(json!(["x"])),
                ]
                .prop_map(|v| Breakage::Set("description", v)),
                prop_oneof![Just(json!([])), Just(json!("k=v")), Just(json!(0))]
                    .prop_map(|v| Breakage::Set("metadata", v)),
                prop_oneof![
                    Just(json!("")),
                    "[A-Za-z0-9_]{256,300}".prop_map(Value::String),
                    // Any character outside the rule, anywhere: `-`, white space, U+0000, non-ASCII.
                    ("[A-Za-z0-9_]{0,20}", "[^A-Za-z0-9_]", "[A-Za-z0-9_]{0,20}")
                        .prop_map(|(before, bad, after)| Value::String(format!("{before}{bad}{after}"))),
                    Just(json!(7)),
                    Just(json!(["pm_card_visa"])),
                    Just(json!({"id": "pm_card_visa"})),
                ]
                .prop_map(|v| Breakage::Set("payment_method", v)),
                prop_oneof![
                    Just(json!("")),
                    ("[A-Za-z0-9_]{0,20}", "[^A-Za-z0-9_]", "[A-Za-z0-9_]{0,20}")
                        .prop_map(|(before, bad, after)| Value::String(format!("{before}{bad}{after}"))),
                    Just(json!(["cus_1"])),
                ]
                .prop_map(|v| Breakage::Set("provider_customer", v)),
                prop_oneof![
                    (Just(String::new()), Just(json!("v"))),
                    (text(limits::METADATA_KEY_MAX_CHARS + 1..=60), Just(json!("v"))),
                    (text(1..=10), over(limits::METADATA_VALUE_MAX_CHARS)),
                    (with_nul(0..=limits::METADATA_KEY_MAX_CHARS - 1), Just(json!("v"))),
                    (text(1..=10), with_nul(0..=limits::METADATA_VALUE_MAX_CHARS - 1).prop_map(Value::String)),
                    (text(1..=10), prop_oneof![Just(json!(1)), Just(json!(null)), Just(json!({"a": "b"}))]),
                ]
                .prop_map(|(key, value)| Breakage::MetadataPair(key, value)),
                Just(Breakage::TooManyMetadataPairs),
                text(1..=20)
                    .prop_filter("not a known field", |k| !KNOWN_FIELDS.contains(&k.as_str()))
                    .prop_map(Breakage::UnknownField),
            ]
        }

        impl Breakage {
            /// Breaks `body`; returns the one field the error must name.
            fn apply(self, body: &mut Map<String, Value>) -> String {
                match self {
                    Self::Remove(field) => {
                        body.remove(field);
                        field.to_owned()
                    }
                    Self::Set(field, value) => {
                        body.insert(field.to_owned(), value);
                        field.to_owned()
                    }
                    Self::MetadataPair(key, value) => {
                        // Alone, so no other metadata pair can be named as well.
                        body.insert("metadata".into(), json!({ key.clone(): value }));
                        format!("metadata.{key}")
                    }
                    Self::TooManyMetadataPairs => {
                        let pairs: Map<String, Value> =
                            (0..=limits::METADATA_MAX_PAIRS).map(|i| (format!("k{i}"), json!("v"))).collect();
                        body.insert("metadata".into(), Value::Object(pairs));
                        "metadata".to_owned()
                    }
                    Self::UnknownField(name) => {
                        body.insert(name.clone(), json!("x"));
                        name
                    }
                }
            }
        }

        /// Any JSON a client could send, with the known field names over-represented.
        fn hostile_json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                any::<i64>().prop_map(|n| json!(n)),
                any::<u64>().prop_map(|n| json!(n)),
                any::<f64>().prop_filter("JSON numbers are finite", |f| f.is_finite()).prop_map(|f| json!(f)),
                (Amount::MIN..=Amount::MAX).prop_map(|n| json!(n)),
                // Any character, U+0000 included.
                prop_oneof![
                    proptest::collection::vec(any::<char>(), 0..=3).prop_map(|c| c.into_iter().collect::<String>()),
                    "[A-Z]{3}".prop_map(String::from),
                    "pm_[A-Za-z0-9_ -]{0,8}".prop_map(String::from),
                ]
                .prop_map(Value::String),
                any::<bool>().prop_map(Value::Bool),
                Just(Value::Null),
            ];
            let name = prop_oneof![
                4 => proptest::sample::select(&KNOWN_FIELDS[..]).prop_map(str::to_owned),
                1 => proptest::collection::vec(any::<char>(), 0..=5).prop_map(|c| c.into_iter().collect::<String>()),
            ];
            leaf.prop_recursive(3, 60, 8, move |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    proptest::collection::btree_map(name.clone(), inner, 0..7)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #[test]
            fn every_request_within_the_limits_is_accepted_exactly_as_sent(request in valid_request()) {
                let parsed = PaymentRequest::from_json(&Value::Object(body_of(&request)));

                let (amount, currency, customer_id, description, metadata, payment_method) = request;
                let parsed = parsed.map(|p| {
                    let payment_method = p.payment_method.map(|m| m.as_str().to_owned());
                    (p.amount.minor_units(), p.currency.as_str().to_owned(), p.customer_id, p.description, p.metadata, payment_method)
                });
                let expected = (amount, currency.to_owned(), customer_id, description, metadata, payment_method);
                prop_assert_eq!(parsed, Ok(expected));
            }

            #[test]
            fn one_broken_field_is_refused_and_named_alone(request in valid_request(), breakage in breakage()) {
                let mut body = body_of(&request);
                let field = breakage.apply(&mut body);

                let named: Vec<String> = PaymentRequest::from_json(&Value::Object(body))
                    .err()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|e| e.field)
                    .collect();

                prop_assert_eq!(named, vec![field]);
            }

            /// Hostile JSON never panics, never passes outside the limits, and never fails without
            /// saying which field, present in the body, is wrong.
            #[test]
            fn any_json_is_either_a_request_within_the_limits_or_named_errors(body in hostile_json()) {
                match PaymentRequest::from_json(&body) {
                    Ok(request) => {
                        let chars = |text: &str| text.chars().count();
                        prop_assert!((Amount::MIN..=Amount::MAX).contains(&request.amount.minor_units()));
                        prop_assert!(Currency::parse(request.currency.as_str()).is_ok());
                        prop_assert!((1..=limits::CUSTOMER_ID_MAX_CHARS).contains(&chars(&request.customer_id)));
                        prop_assert!(request.description.iter().all(|d| chars(d) <= limits::DESCRIPTION_MAX_CHARS));
                        prop_assert!(request.metadata.len() <= limits::METADATA_MAX_PAIRS);
                        if let Some(method) = &request.payment_method {
                            let method = method.as_str();
                            prop_assert!((1..=crate::provider_ref::MAX_LEN).contains(&method.len()), "{:?}", method);
                            prop_assert!(method.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "{:?}", method);
                        }
                        let stored = [request.customer_id.as_str()]
                            .into_iter()
                            .chain(request.description.as_deref())
                            .chain(request.metadata.iter().flat_map(|(k, v)| [k.as_str(), v.as_str()]));
                        for text in stored {
                            prop_assert!(!text.contains('\0'), "{:?} would fail the write", text);
                        }
                    }
                    Err(errors) => {
                        prop_assert!(!errors.is_empty());
                        for error in &errors {
                            let field = error.field.as_str();
                            let named_a_real_place = match &body {
                                Value::Object(object) => {
                                    object.contains_key(field)
                                        || ["amount", "currency", "customer_id"].contains(&field)
                                        || field.strip_prefix("metadata.").is_some_and(|key| {
                                            object.get("metadata").and_then(|m| m.get(key)).is_some()
                                        })
                                }
                                _ => field == "(body)",
                            };
                            prop_assert!(named_a_real_place, "{:?} for {}", error, body);
                            prop_assert!(!error.message.is_empty());
                        }
                    }
                }
            }
        }
    }
}
