//! The request fingerprint: SHA-256 of the RFC 8785 (JCS) canonical JSON of `{method, path, body}`.
//!
//! Two bodies that mean the same thing hash the same, and any change of a value changes the hash. A
//! key reused with a different fingerprint is misuse (422).

use std::borrow::Cow;
use std::io;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A request fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// The request to fingerprint, borrowed.
#[derive(Serialize)]
struct Envelope<'a> {
    method: &'a str,
    path: &'a str,
    body: &'a Value,
}

impl Fingerprint {
    /// Fingerprints a request.
    pub fn of(method: &str, path: &str, body: &Value) -> Self {
        let body = &*given(body);
        let mut hasher = HashWriter(Sha256::new());
        // JCS sorts object keys, drops insignificant white space and writes every number in its
        // shortest ECMAScript form, so bodies that mean the same thing hash the same.
        // Writing into a hasher cannot fail, and a `serde_json::Value` always serialises: its map keys
        // are strings and its numbers are finite.
        let written = serde_json_canonicalizer::to_writer(&Envelope { method, path, body }, &mut hasher);
        debug_assert!(written.is_ok(), "canonical JSON of a Value cannot fail");
        Self(hasher.0.finalize().into())
    }

    /// The 32 bytes, as stored in PostgreSQL.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Rebuilds a fingerprint read from the database; `None` if it is not 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

/// `body` without its members that are `null`. The request's own parsing reads a field sent as
/// `null` as a field not given, so the fingerprint must too.
fn given(body: &Value) -> Cow<'_, Value> {
    match body {
        Value::Object(fields) if fields.values().any(Value::is_null) => Cow::Owned(Value::Object(
            fields.iter().filter(|(_, value)| !value.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect(),
        )),
        other => Cow::Borrowed(other),
    }
}

struct HashWriter(Sha256);

impl io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Map, Number, json};

    use super::*;

    fn of(body: &str) -> Fingerprint {
        Fingerprint::of("POST", "/v1/payments", &serde_json::from_str(body).unwrap())
    }

    #[test]
    fn key_order_white_space_and_number_spelling_do_not_matter() {
        let reference = of(r#"{"amount":1000,"currency":"EUR","customer_id":"c"}"#);
        for same in [
            r#"{"currency":"EUR","customer_id":"c","amount":1000}"#,
            "{ \"amount\" : 1000 ,\n\t\"currency\":\"EUR\", \"customer_id\":\"c\" }",
            r#"{"amount":1e3,"currency":"EUR","customer_id":"c"}"#,
            r#"{"amount":1000.0,"currency":"EUR","customer_id":"c"}"#,
            r#"{"amount":1.000E+3,"currency":"EUR","customer_id":"c"}"#,
            r#"{"amount":1000,"currency":"\u0045UR","customer_id":"c"}"#,
        ] {
            assert_eq!(of(same), reference, "{same}");
        }
    }

    #[test]
    fn a_field_sent_as_null_is_the_same_request_as_the_field_left_out() {
        let reference = of(r#"{"amount":1000,"currency":"EUR","customer_id":"c"}"#);

        let nulls = of(
            r#"{"amount":1000,"currency":"EUR","customer_id":"c","description":null,"metadata":null,"payment_method":null}"#,
        );
        let nested = of(r#"{"amount":1000,"currency":"EUR","customer_id":"c","metadata":{"a":null}}"#);

        assert_eq!(nulls, reference);
        assert_ne!(nested, reference, "only a member of the body itself is a field");
    }

    #[test]
    fn any_change_of_a_value_the_method_or_the_path_changes_it() {
        let reference = of(r#"{"amount":1000,"currency":"EUR","customer_id":"c"}"#);
        for different in [
            r#"{"amount":1001,"currency":"EUR","customer_id":"c"}"#,
            r#"{"amount":1000,"currency":"USD","customer_id":"c"}"#,
            r#"{"amount":1000,"currency":"EUR","customer_id":"C"}"#,
            r#"{"amount":1000,"currency":"EUR","customer_id":"c","description":"x"}"#,
            r#"{"amount":1000,"currency":"EUR","customer_id":"c","payment_method":"pm_card_visa"}"#,
            r#"{"amount":"1000","currency":"EUR","customer_id":"c"}"#,
        ] {
            assert_ne!(of(different), reference, "{different}");
        }
        let body = json!({"amount":1000,"currency":"EUR","customer_id":"c"});
        assert_ne!(Fingerprint::of("PUT", "/v1/payments", &body), reference);
        assert_ne!(Fingerprint::of("POST", "/v1/payment", &body), reference);
    }

    #[test]
    fn another_payment_method_is_another_request() {
        let visa = of(r#"{"amount":1000,"currency":"EUR","customer_id":"c","payment_method":"pm_card_visa"}"#);

        for other in ["pm_card_mastercard", "pm_card_Visa", "pm_card_visa_"] {
            let body = format!(r#"{{"amount":1000,"currency":"EUR","customer_id":"c","payment_method":"{other}"}}"#);
            assert_ne!(of(&body), visa, "{other}");
        }
    }

    /// JSON values shaped like payment bodies: nested objects, strings, integers, booleans.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<i32>().prop_map(|n| json!(n)),
            "[ -~é€😀]{0,12}".prop_map(Value::String),
            any::<bool>().prop_map(Value::Bool),
            Just(Value::Null),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z_]{1,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
            ]
        })
    }

    /// Writes `value` as JSON with keys in reverse order, extra white space, and integers spelled
    /// as floats with exponents: the same meaning, a different text.
    fn respell(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let members: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| format!(" {} :\n {} ", serde_json::to_string(k).unwrap(), respell(v)))
                    .collect();
                format!("{{ {} }}", members.join(" ,\t"))
            }
            Value::Array(items) => format!("[ {} ]", items.iter().map(respell).collect::<Vec<_>>().join(" , ")),
            Value::Number(n) => match n.as_i64() {
                Some(i) if i != 0 => format!("{}.0e0", i),
                _ => n.to_string(),
            },
            other => other.to_string(),
        }
    }

    /// Changes one leaf of `value` (the `nth` leaf in document order, wrapping around).
    fn change_one_leaf(value: &mut Value, nth: &mut usize) -> bool {
        match value {
            Value::Object(map) => map.values_mut().any(|v| change_one_leaf(v, nth)),
            Value::Array(items) => items.iter_mut().any(|v| change_one_leaf(v, nth)),
            leaf => {
                if *nth > 0 {
                    *nth -= 1;
                    return false;
                }
                *leaf = match leaf {
                    Value::Number(n) => Value::Number(Number::from(n.as_i64().unwrap_or(0).wrapping_add(1))),
                    Value::String(s) => Value::String(format!("{s}!")),
                    Value::Bool(b) => Value::Bool(!*b),
                    _ => json!(0),
                };
                true
            }
        }
    }

    proptest! {
        #[test]
        fn a_respelled_body_has_the_same_fingerprint(body in json_value()) {
            let respelled: Value = serde_json::from_str(&respell(&body)).unwrap();

            prop_assert_eq!(
                Fingerprint::of("POST", "/v1/payments", &respelled),
                Fingerprint::of("POST", "/v1/payments", &body)
            );
        }

        #[test]
        fn changing_any_value_changes_the_fingerprint(
            // Regenerated rather than rejected, so long runs (PROPTEST_CASES) stay within the
            // limit on rejected cases.
            body in json_value().prop_filter("has a value to change", |body| count_leaves(body) > 0),
            pick in 0usize..64,
        ) {
            let mut changed = body.clone();
            let mut nth = pick % count_leaves(&body);
            prop_assert!(change_one_leaf(&mut changed, &mut nth));

            prop_assert_ne!(
                Fingerprint::of("POST", "/v1/payments", &changed),
                Fingerprint::of("POST", "/v1/payments", &body)
            );
        }
    }

    /// JSON with every kind of number a client can spell: the extremes of the integers, any finite
    /// double, and strings with escapes, control characters and astral code points.
    fn hostile_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>().prop_filter("JSON numbers are finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            Just(json!(i64::MIN)),
            Just(json!(u64::MAX)),
            Just(json!(f64::MAX)),
            Just(json!(f64::MIN_POSITIVE)),
            Just(json!(-0.0)),
            any::<String>().prop_map(Value::String),
            any::<bool>().prop_map(Value::Bool),
            Just(Value::Null),
        ];
        leaf.prop_recursive(4, 40, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(any::<String>(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
            ]
        })
    }

    proptest! {
        /// The fingerprint is computed on bodies a client controls; a body that makes the
        /// canonicaliser fail would be a panic (debug) or a hash of a truncated text (release).
        #[test]
        fn every_json_value_is_canonicalised_in_full(body in hostile_json()) {
            let envelope = json!({"method": "POST", "path": "/v1/payments", "body": given(&body)});
            let canonical = serde_json_canonicalizer::to_vec(&envelope);
            prop_assert!(canonical.is_ok(), "{:?}", canonical);
            let canonical = canonical.unwrap_or_default();

            let mut expected = Sha256::new();
            expected.update(&canonical);
            let expected: [u8; 32] = expected.finalize().into();
            prop_assert_eq!(Fingerprint::of("POST", "/v1/payments", &body), Fingerprint(expected));
        }

        /// Whichever way a client spells a number (`1000`, `1e3`, `1000.0`, `1.0E3`), it is the same
        /// request, as the validator also reads it.
        #[test]
        fn every_spelling_of_a_number_has_one_fingerprint(x in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
            let of_text = |number: String| {
                let body: Value = serde_json::from_str(&format!(r#"{{"amount":{number}}}"#)).unwrap();
                Fingerprint::of("POST", "/v1/payments", &body)
            };
            let reference = of_text(format!("{x:?}"));

            prop_assert_eq!(of_text(format!("{x}")), reference);
            prop_assert_eq!(of_text(format!("{x:e}")), reference);
            prop_assert_eq!(of_text(format!("{x:E}")), reference);
            if x.fract() == 0.0 && x.abs() < 9.0e15 {
                prop_assert_eq!(of_text(format!("{}", x as i64)), reference);
            }
        }

        /// Canonical JSON writes every number as a double, so two integers above 2^53 can share a
        /// fingerprint. Validation keeps them out: amounts stop at 10^12, every other value is a
        /// string, unknown fields are refused. So two payment requests that validation tells apart
        /// never share a fingerprint (else a retry of one would replay the other).
        #[test]
        fn requests_that_validation_tells_apart_never_share_a_fingerprint(
            a in valid_body(),
            b in valid_body(),
        ) {
            use crate::payment_request::PaymentRequest;
            let (request_a, request_b) = (PaymentRequest::from_json(&a), PaymentRequest::from_json(&b));
            prop_assert!(request_a.is_ok() && request_b.is_ok(), "{} / {}", a, b);

            if request_a != request_b {
                prop_assert_ne!(
                    Fingerprint::of("POST", "/v1/payments", &a),
                    Fingerprint::of("POST", "/v1/payments", &b)
                );
            }
        }

        #[test]
        fn a_fingerprint_survives_the_database_round_trip(body in json_value()) {
            let fingerprint = Fingerprint::of("POST", "/v1/payments", &body);

            prop_assert_eq!(Fingerprint::from_slice(fingerprint.as_bytes()), Some(fingerprint));
        }
    }

    /// Valid payment bodies from small sets of values, so that pairs often differ in one field
    /// only, with amounts spelled as integers, decimals or exponents, near the largest amount too.
    fn valid_body() -> impl Strategy<Value = Value> {
        let amount = prop_oneof![
            Just("1"),
            Just("1.0"),
            Just("2"),
            Just("999999999999"),
            Just("999999999999.0"),
            Just("1000000000000"),
            Just("1e12"),
            Just("1.0E12"),
        ];
        (
            amount,
            proptest::sample::select(vec!["EUR", "USD"]),
            proptest::sample::select(vec!["c", "C", "c ", r"\u00e9", r"e\u0301"]),
            proptest::option::of(proptest::sample::select(vec!["", "x", r"\u0007"])),
            proptest::option::of(proptest::sample::select(vec![
                r#"{}"#,
                r#"{"a":"1"}"#,
                r#"{"a":"2"}"#,
                r#"{"b":"1"}"#,
            ])),
            proptest::option::of(proptest::sample::select(vec!["pm_card_visa", "pm_card_Visa", "card_1"])),
        )
            .prop_map(|(amount, currency, customer, description, metadata, payment_method)| {
                let mut text = format!(r#"{{"amount":{amount},"currency":"{currency}","customer_id":"{customer}""#);
                if let Some(description) = description {
                    text += &format!(r#","description":"{description}""#);
                }
                if let Some(metadata) = metadata {
                    text += &format!(r#","metadata":{metadata}"#);
                }
                if let Some(payment_method) = payment_method {
                    text += &format!(r#","payment_method":"{payment_method}""#);
                }
                serde_json::from_str(&(text + "}")).unwrap()
            })
    }

    fn count_leaves(value: &Value) -> usize {
        match value {
            Value::Object(map) => map.values().map(count_leaves).sum(),
            Value::Array(items) => items.iter().map(count_leaves).sum(),
            _ => 1,
        }
    }
}
