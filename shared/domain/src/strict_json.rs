//! JSON read strictly: a member named twice in one object, at any depth, is an error, and so is a
//! member named `$serde_json::private::…`.
//!
//! serde_json keeps the last of repeated members where another reader (a proxy, a log, a client
//! library) may keep the first, so one body would mean two things; and it reads an object whose
//! first member is named `$serde_json::private::RawValue` as the text that member holds, leniently,
//! even into a typed field. Payment requests, provider responses and webhooks are read here.
//! Otherwise a body reads exactly as `serde_json::from_slice` reads it, in one pass over the bytes.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{Map, Number, Value};

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StrictJsonError {
    /// An object names a member twice.
    #[error("the member `{path}` appears more than once")]
    RepeatedMember {
        /// Where, as the api names fields: `amount`, `metadata.order`, `items[0].id`.
        path: String,
    },
    /// A member is named as one of serde_json's private markers.
    #[error("the member `{path}` has a name serde_json reserves for itself")]
    ReservedMember {
        /// Where, as for a repeated member.
        path: String,
    },
    /// Not JSON, or not the JSON that was expected.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Reads a JSON document.
pub fn parse(bytes: &[u8]) -> Result<Value, StrictJsonError> {
    let refused = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let read = Strict { refused: &refused }.deserialize(&mut deserializer).and_then(|value| {
        // Nothing but white space may follow the document, as `serde_json::from_slice` requires.
        deserializer.end()?;
        Ok(value)
    });
    match (read, refused.into_inner()) {
        (_, Some(Refused { why: Why::Repeated, steps })) => {
            Err(StrictJsonError::RepeatedMember { path: render(steps) })
        }
        (_, Some(Refused { why: Why::Reserved, steps })) => {
            Err(StrictJsonError::ReservedMember { path: render(steps) })
        }
        (Ok(value), None) => Ok(value),
        (Err(error), None) => Err(StrictJsonError::Json(error)),
    }
}

/// Reads a JSON document as a `T`: strictly into a [`Value`] first, so that a repeat is refused
/// even where `T` would keep the last (a map) or ignore the member (a field it does not name).
pub fn from_slice<T: de::DeserializeOwned>(bytes: &[u8]) -> Result<T, StrictJsonError> {
    let value = parse(bytes)?;
    Ok(T::deserialize(&value)?)
}

/// How serde_json names its private markers, e.g. `$serde_json::private::RawValue`.
const RESERVED_PREFIX: &str = "$serde_json::private::";

/// A member refused, why, and the path to it, innermost step first.
struct Refused {
    why: Why,
    steps: Vec<Step>,
}

enum Why {
    Repeated,
    Reserved,
}

/// One step of the path to a refused member.
enum Step {
    Member(String),
    Index(usize),
}

/// The steps, innermost first as they were collected, written as the api names fields.
fn render(mut steps: Vec<Step>) -> String {
    steps.reverse();
    let mut path = String::new();
    for (at, step) in steps.into_iter().enumerate() {
        match step {
            Step::Member(name) => {
                if at > 0 {
                    path.push('.');
                }
                path.push_str(&name);
            }
            Step::Index(index) => {
                path.push('[');
                path.push_str(&index.to_string());
                path.push(']');
            }
        }
    }
    path
}

/// Builds a [`Value`] as serde_json's own does, but refuses a member name already in its object or
/// reserved by serde_json. serde_json's errors carry no data of ours, so the refused member is kept
/// aside in `refused`: the object that meets it records its name, and every enclosing value adds
/// its own step as the error passes through it.
#[derive(Clone, Copy)]
struct Strict<'a> {
    refused: &'a RefCell<Option<Refused>>,
}

impl Strict<'_> {
    /// Refuses the member `name` of the object being read.
    fn refuse<E: de::Error>(self, why: Why, name: String) -> E {
        *self.refused.borrow_mut() = Some(Refused { why, steps: vec![Step::Member(name)] });
        E::custom("a refused member name")
    }

    /// Adds `step` to the path of a member refused below it; any other error passes unchanged.
    fn within<E>(self, step: impl FnOnce() -> Step, error: E) -> E {
        if let Some(refused) = self.refused.borrow_mut().as_mut() {
            refused.steps.push(step());
        }
        error
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut values = Vec::new();
        loop {
            match items.next_element_seed(self) {
                Ok(Some(value)) => values.push(value),
                Ok(None) => return Ok(Value::Array(values)),
                Err(error) => return Err(self.within(|| Step::Index(values.len()), error)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(name) = members.next_key::<String>()? {
            if name.starts_with(RESERVED_PREFIX) {
                return Err(self.refuse(Why::Reserved, name));
            }
            let value = match members.next_value_seed(self) {
                Ok(value) => value,
                Err(error) => return Err(self.within(|| Step::Member(name), error)),
            };
            // One lookup for both the check and the insert.
            match object.entry(name) {
                Entry::Vacant(slot) => {
                    slot.insert(value);
                }
                Entry::Occupied(slot) => return Err(self.refuse(Why::Repeated, slot.key().clone())),
            }
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    fn repeated(text: &str) -> Option<String> {
        match parse(text.as_bytes()) {
            Err(StrictJsonError::RepeatedMember { path }) => Some(path),
            _ => None,
        }
    }

    #[test]
    fn a_repeated_member_is_named_wherever_it_is() {
        let cases = [
            (r#"{"amount":100,"amount":5000}"#, "amount"),
            (r#"{"amount":100,"currency":"EUR","amount":100}"#, "amount"),
            (r#"{"metadata":{"order":"1","order":"2"}}"#, "metadata.order"),
            (r#"{"a":{"b":{"c":1,"d":2,"c":{}}}}"#, "a.b.c"),
            (r#"{"items":[1,{"id":"x","id":"y"}]}"#, "items[1].id"),
            (r#"[{"k":1},[{"k":1,"k":1}]]"#, "[1][0].k"),
            (r#"{"":1,"":2}"#, ""),
            // The same name, spelled with an escape, is the same name.
            (r#"{"amount":1,"\u0061mount":2}"#, "amount"),
            // Repeated inside the value of a repeated member: the inner one is found first.
            (r#"{"m":{},"m":{"x":1,"x":2}}"#, "m.x"),
        ];
        for (text, path) in cases {
            assert_eq!(repeated(text).as_deref(), Some(path), "{text}");
        }
    }

    #[test]
    fn the_same_name_in_different_objects_is_no_repeat() {
        let cases = [
            r#"{"id":1,"data":{"id":2,"metadata":{"id":"3"}}}"#,
            r#"[{"id":1},{"id":1}]"#,
            r#"{"a":1,"A":2,"a ":3}"#,
            r#"{}"#,
            r#"[]"#,
            r#""just a string""#,
        ];
        for text in cases {
            let strict = parse(text.as_bytes()).unwrap();
            assert_eq!(strict, serde_json::from_str::<Value>(text).unwrap(), "{text}");
        }
    }

    #[test]
    fn what_is_not_json_fails_as_serde_json_says() {
        for text in ["", "{", r#"{"amount": 1,}"#, "[1, 2", r#"{"amount": 1} trailing"#, "NaN", "1e400", "\"\\ud800\""]
        {
            let strict = parse(text.as_bytes()).unwrap_err();
            let expected = serde_json::from_str::<Value>(text).unwrap_err();
            assert!(matches!(strict, StrictJsonError::Json(_)), "{text:?}");
            assert_eq!(strict.to_string(), expected.to_string(), "{text:?}");
        }
    }

    #[test]
    fn nesting_is_limited_as_serde_json_limits_it() {
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));

        let strict = parse(deep.as_bytes()).unwrap_err();

        assert!(strict.to_string().contains("recursion limit exceeded"), "{strict}");
    }

    #[test]
    fn a_name_serde_json_reserves_for_itself_is_refused_wherever_it_is() {
        // serde_json reads an object whose first member has this name as the JSON text it holds.
        let cases = [
            (r#"{"$serde_json::private::RawValue":"{\"amount\":1,\"amount\":2}"}"#, "$serde_json::private::RawValue"),
            (
                r#"{"data":{"object":{"$serde_json::private::RawValue":"[]"}}}"#,
                "data.object.$serde_json::private::RawValue",
            ),
            (r#"[{"a":1,"$serde_json::private::Number":"1"}]"#, "[0].$serde_json::private::Number"),
        ];
        for (text, path) in cases {
            match parse(text.as_bytes()) {
                Err(StrictJsonError::ReservedMember { path: found }) => assert_eq!(found, path, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(parse(br#"{"$serde_json":1,"serde_json::private::RawValue":2}"#).is_ok());
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Event {
        object: Value,
    }

    #[test]
    fn a_typed_read_never_reads_json_text_as_an_object() {
        let text = br#"{"object":{"$serde_json::private::RawValue":"{\"a\":1,\"a\":2}"}}"#;

        let read = from_slice::<Event>(text);

        assert!(matches!(read, Err(StrictJsonError::ReservedMember { .. })), "{read:?}");
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Charge {
        id: String,
        #[serde(default)]
        metadata: std::collections::BTreeMap<String, String>,
    }

    #[test]
    fn a_typed_read_refuses_a_repeat_even_where_the_type_would_keep_the_last_or_ignore_it() {
        let cases = [
            (r#"{"id":"ch_1","metadata":{"payment":"a","payment":"b"}}"#, "metadata.payment"),
            (r#"{"id":"ch_1","unread":1,"unread":2}"#, "unread"),
            (r#"{"id":"ch_1","id":"ch_2"}"#, "id"),
        ];
        for (text, path) in cases {
            match from_slice::<Charge>(text.as_bytes()) {
                Err(StrictJsonError::RepeatedMember { path: found }) => assert_eq!(found, path, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let read: Charge = from_slice(br#"{"id":"ch_1","metadata":{"a":"1"},"other":[1]}"#).unwrap();
        assert_eq!(read, Charge { id: "ch_1".into(), metadata: [("a".into(), "1".into())].into() });
        assert!(matches!(from_slice::<Charge>(br#"{"metadata":{}}"#), Err(StrictJsonError::Json(_))));
    }

    #[test]
    fn the_error_names_the_member() {
        let error = parse(br#"{"metadata":{"order":"1","order":"2"}}"#).unwrap_err();

        assert_eq!(error.to_string(), "the member `metadata.order` appears more than once");
        assert_eq!(parse(br#"{"a":1}"#).unwrap(), json!({"a": 1}));
    }

    mod properties {
        use proptest::prelude::*;
        use serde_json::{Value, json};

        use super::super::*;

        /// Names from a small set, so that objects nest the same names, plus any text.
        fn name() -> impl Strategy<Value = String> {
            prop_oneof![
                3 => proptest::sample::select(vec!["amount", "id", "metadata", "a", "", "é", "\"", "a.b", "[0]"])
                    .prop_map(str::to_owned),
                1 => any::<String>(),
            ]
        }

        /// Any JSON value; object names are unique, as a `Map` keeps them.
        fn any_json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(|n| json!(n)),
                any::<u64>().prop_map(|n| json!(n)),
                any::<f64>().prop_filter("JSON numbers are finite", |f| f.is_finite()).prop_map(|f| json!(f)),
                any::<String>().prop_map(Value::String),
            ];
            leaf.prop_recursive(5, 80, 6, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                    proptest::collection::btree_map(name(), inner, 0..6)
                        .prop_map(|members| Value::Object(members.into_iter().collect())),
                ]
            })
        }

        #[derive(Debug, Clone)]
        enum Step {
            Member(String),
            Index(usize),
        }

        /// Every object in `value` that has a member, as the steps that lead to it.
        fn objects(value: &Value, at: &mut Vec<Step>, found: &mut Vec<Vec<Step>>) {
            match value {
                Value::Object(members) => {
                    if !members.is_empty() {
                        found.push(at.clone());
                    }
                    for (name, member) in members {
                        at.push(Step::Member(name.clone()));
                        objects(member, at, found);
                        at.pop();
                    }
                }
                Value::Array(items) => {
                    for (index, item) in items.iter().enumerate() {
                        at.push(Step::Index(index));
                        objects(item, at, found);
                        at.pop();
                    }
                }
                _ => {}
            }
        }

        fn get<'a>(value: &'a Value, path: &[Step]) -> &'a Value {
            path.iter().fold(value, |value, step| match step {
                Step::Member(name) => &value[name.as_str()],
                Step::Index(index) => &value[*index],
            })
        }

        fn get_mut<'a>(value: &'a mut Value, path: &[Step]) -> &'a mut Value {
            path.iter().fold(value, |value, step| match step {
                Step::Member(name) => &mut value[name.as_str()],
                Step::Index(index) => &mut value[*index],
            })
        }

        /// A path as the api names fields: `metadata.order`, `items[0].id`, `[1].k`.
        fn render(path: &[Step]) -> String {
            let mut rendered = String::new();
            for (at, step) in path.iter().enumerate() {
                match step {
                    Step::Member(name) => {
                        if at > 0 {
                            rendered.push('.');
                        }
                        rendered.push_str(name);
                    }
                    Step::Index(index) => rendered.push_str(&format!("[{index}]")),
                }
            }
            rendered
        }

        /// `value` written as JSON text with the member `name` of the object at `path` written a
        /// second time, with the value `again`. A stand-in name is put in the object and replaced in
        /// the text; objects keep their members sorted, so the stand-in lands before the others
        /// (`early`) or after them.
        fn with_repeat(value: &Value, path: &[Step], name: &str, again: &Value, early: bool) -> Option<String> {
            let stand_in = if early { "\u{0}\u{1}repeat" } else { "\u{10ffff}\u{10ffff}repeat" };
            let mut marked = value.clone();
            let Value::Object(members) = get_mut(&mut marked, path) else { return None };
            if members.insert(stand_in.to_owned(), again.clone()).is_some() {
                return None;
            }
            let text = serde_json::to_string(&marked).ok()?;
            let quoted = serde_json::to_string(stand_in).ok()?;
            let name = serde_json::to_string(name).ok()?;
            (text.matches(&quoted).count() == 1).then(|| text.replacen(&quoted, &name, 1))
        }

        proptest! {
            /// Without a repeat, a body reads exactly as serde_json reads it, however it is written.
            #[test]
            fn json_without_repeats_reads_as_serde_json_reads_it(value in any_json()) {
                for text in [serde_json::to_vec(&value).unwrap(), serde_json::to_vec_pretty(&value).unwrap()] {
                    let strict = parse(&text).unwrap();
                    prop_assert_eq!(&strict, &serde_json::from_slice::<Value>(&text).unwrap());
                    prop_assert_eq!(&strict, &value);
                }
            }

            /// Bytes that are not JSON, or barely, fail alike or read alike.
            #[test]
            fn any_bytes_read_as_serde_json_reads_them_unless_a_member_repeats(
                bytes in prop_oneof![
                    proptest::collection::vec(any::<u8>(), 0..64),
                    "[\\[\\]{}:, \"a0-9.e]{0,40}".prop_map(String::into_bytes),
                ],
            ) {
                match (parse(&bytes), serde_json::from_slice::<Value>(&bytes)) {
                    (Ok(strict), Ok(lenient)) => prop_assert_eq!(strict, lenient),
                    (Err(StrictJsonError::Json(strict)), Err(lenient)) => {
                        prop_assert_eq!(strict.to_string(), lenient.to_string());
                    }
                    (Err(StrictJsonError::RepeatedMember { .. }), Ok(_)) => {}
                    // serde_json reads the text such a member holds, which may or may not be JSON.
                    (Err(StrictJsonError::ReservedMember { .. }), _) => {}
                    (strict, lenient) => prop_assert!(false, "{:?} against {:?}", strict, lenient),
                }
            }

            /// A member written twice, in any object at any depth, before or after the others and
            /// with any second value, is refused with its path.
            #[test]
            fn a_member_written_twice_anywhere_is_refused_with_its_path(
                // An object at the top, so there is always a member to repeat.
                value in proptest::collection::btree_map(name(), any_json(), 1..6)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
                which in any::<proptest::sample::Index>(),
                member in any::<proptest::sample::Index>(),
                again in any_json(),
                early in any::<bool>(),
            ) {
                let mut found = Vec::new();
                objects(&value, &mut Vec::new(), &mut found);
                let path = which.get(&found).clone();
                let Value::Object(members) = get(&value, &path) else { unreachable!("a path to an object") };
                let name = member.get(&members.keys().collect::<Vec<_>>()).to_string();
                let text = with_repeat(&value, &path, &name, &again, early);
                prop_assume!(text.is_some());
                let text = text.unwrap_or_default();

                let read = parse(text.as_bytes());

                let mut expected = path;
                expected.push(Step::Member(name));
                match read {
                    Err(StrictJsonError::RepeatedMember { path: found }) => {
                        prop_assert_eq!(found, render(&expected), "{}", text);
                    }
                    other => prop_assert!(false, "{:?} for {}", other, text),
                }
            }
        }
    }
}
