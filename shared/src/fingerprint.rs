//! The request fingerprint: SHA-256 of the RFC 8785 (JCS) canonical JSON of `{method, path, body}`.
//!
//! Canonicalisation sorts object keys, drops insignificant white space and writes every number in
//! its shortest ECMAScript form, so two bodies that mean the same thing hash the same, and any change
//! of a value changes the hash. A key reused with a different fingerprint is misuse (422).

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
        let mut hasher = HashWriter(Sha256::new());
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
    fn any_change_of_a_value_the_method_or_the_path_changes_it() {
        let reference = of(r#"{"amount":1000,"currency":"EUR","customer_id":"c"}"#);
        for different in [
            r#"{"amount":1001,"currency":"EUR","customer_id":"c"}"#,
            r#"{"amount":1000,"currency":"USD","customer_id":"c"}"#,
            r#"{"amount":1000,"currency":"EUR","customer_id":"C"}"#,
            r#"{"amount":1000,"currency":"EUR","customer_id":"c","description":"x"}"#,
            r#"{"amount":"1000","currency":"EUR","customer_id":"c"}"#,
        ] {
            assert_ne!(of(different), reference, "{different}");
        }
        let body = json!({"amount":1000,"currency":"EUR","customer_id":"c"});
        assert_ne!(Fingerprint::of("PUT", "/v1/payments", &body), reference);
        assert_ne!(Fingerprint::of("POST", "/v1/payment", &body), reference);
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
        fn changing_any_value_changes_the_fingerprint(body in json_value(), pick in 0usize..64) {
            let mut changed = body.clone();
            let leaves = count_leaves(&body);
            prop_assume!(leaves > 0);
            let mut nth = pick % leaves;
            prop_assert!(change_one_leaf(&mut changed, &mut nth));

            prop_assert_ne!(
                Fingerprint::of("POST", "/v1/payments", &changed),
                Fingerprint::of("POST", "/v1/payments", &body)
            );
        }
    }

    fn count_leaves(value: &Value) -> usize {
        match value {
            Value::Object(map) => map.values().map(count_leaves).sum(),
            Value::Array(items) => items.iter().map(count_leaves).sum(),
            _ => 1,
        }
    }
}
