//! The client's `Idempotency-Key` header: 1 to 255 characters of visible ASCII.
//!
//! Two spellings are accepted and mean the same key: the bare token `abc-123`, and the RFC 8941
//! sf-string `"abc-123"` that the IETF `Idempotency-Key` draft specifies. Anything else is rejected
//! with a reason a client developer can act on. A parsed key is never logged.

use std::fmt;

/// A validated idempotency key, in its unquoted form.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a header value is not an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdempotencyKeyError {
    /// No characters.
    #[error("must not be empty")]
    Empty,
    /// More than 255 characters once unquoted.
    #[error("must be at most {max} characters, got {len}", max = IdempotencyKey::MAX_LEN)]
    TooLong {
        /// The length seen.
        len: usize,
    },
    /// A character outside visible ASCII (`!` to `~`).
    #[error("must be visible ASCII (no spaces or control characters); byte {position} is not")]
    NotVisibleAscii {
        /// Zero-based position in the unquoted key.
        position: usize,
    },
    /// Starts with `"` but is not a well-formed RFC 8941 string.
    #[error("starts with a quote but is not a valid quoted string (RFC 8941): {0}")]
    BadQuotedString(&'static str),
}

impl IdempotencyKey {
    /// The longest key accepted.
    pub const MAX_LEN: usize = 255;

    /// Parses a raw header value.
    pub fn parse(raw: &[u8]) -> Result<Self, IdempotencyKeyError> {
        let trimmed = trim_ows(raw);
        let key = match trimmed.first() {
            Some(b'"') => unquote(trimmed)?,
            _ => trimmed.to_vec(),
        };
        if key.is_empty() {
            return Err(IdempotencyKeyError::Empty);
        }
        if let Some(position) = key.iter().position(|b| !(0x21..=0x7e).contains(b)) {
            return Err(IdempotencyKeyError::NotVisibleAscii { position });
        }
        if key.len() > Self::MAX_LEN {
            return Err(IdempotencyKeyError::TooLong { len: key.len() });
        }
        // Every byte is visible ASCII, hence valid UTF-8.
        String::from_utf8(key).map(Self).map_err(|_| IdempotencyKeyError::NotVisibleAscii { position: 0 })
    }

    /// The key, unquoted. It can carry client data: never log it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys can carry client data; keep them out of logs and panics.
        f.write_str("IdempotencyKey(..)")
    }
}

fn trim_ows(raw: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = raw.iter().position(|b| !is_ows(b)).unwrap_or(raw.len());
    let end = raw.iter().rposition(|b| !is_ows(b)).map_or(start, |i| i + 1);
    &raw[start..end]
}

/// Parses an RFC 8941 sf-string (section 4.2.5) that must make up the whole value.
fn unquote(quoted: &[u8]) -> Result<Vec<u8>, IdempotencyKeyError> {
    use IdempotencyKeyError::BadQuotedString as Bad;

    let mut out = Vec::with_capacity(quoted.len());
    let mut bytes = quoted.iter().skip(1);
    loop {
        match bytes.next() {
            None => return Err(Bad("no closing quote")),
            Some(b'\\') => match bytes.next() {
                Some(escaped @ (b'"' | b'\\')) => out.push(*escaped),
                _ => return Err(Bad("a backslash may only escape '\"' or '\\'")),
            },
            Some(b'"') => break,
            Some(byte @ 0x20..=0x7e) => out.push(*byte),
            Some(_) => return Err(Bad("only printable ASCII is allowed inside quotes")),
        }
    }
    if bytes.next().is_some() {
        return Err(Bad("nothing may follow the closing quote"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse(raw: &str) -> Result<String, IdempotencyKeyError> {
        IdempotencyKey::parse(raw.as_bytes()).map(|k| k.as_str().to_owned())
    }

    #[test]
    fn bare_and_quoted_forms_parse_to_the_same_key() {
        let cases = [
            ("abc-123", "abc-123"),
            ("\"abc-123\"", "abc-123"),
            ("  abc-123\t", "abc-123"),
            ("\"a\\\"b\"", "a\"b"),
            ("\"a\\\\b\"", "a\\b"),
            ("ab\"c", "ab\"c"),
            ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ];
        for (raw, key) in cases {
            assert_eq!(parse(raw).as_deref(), Ok(key), "{raw:?}");
        }
    }

    #[test]
    fn malformed_keys_are_rejected_with_a_reason() {
        let long = "k".repeat(256);
        let cases: [(&str, IdempotencyKeyError); 10] = [
            ("", IdempotencyKeyError::Empty),
            ("   ", IdempotencyKeyError::Empty),
            ("\"\"", IdempotencyKeyError::Empty),
            ("a b", IdempotencyKeyError::NotVisibleAscii { position: 1 }),
            ("\"a b\"", IdempotencyKeyError::NotVisibleAscii { position: 1 }),
            ("abc\u{e9}", IdempotencyKeyError::NotVisibleAscii { position: 3 }),
            ("\"abc", IdempotencyKeyError::BadQuotedString("no closing quote")),
            ("\"a\\nb\"", IdempotencyKeyError::BadQuotedString("a backslash may only escape '\"' or '\\'")),
            ("\"abc\";x=1", IdempotencyKeyError::BadQuotedString("nothing may follow the closing quote")),
            (&long, IdempotencyKeyError::TooLong { len: 256 }),
        ];
        for (raw, error) in cases {
            assert_eq!(parse(raw), Err(error), "{raw:?}");
        }
        assert!(parse(&"k".repeat(255)).is_ok());
    }

    #[test]
    fn the_debug_form_does_not_reveal_the_key() {
        let key = IdempotencyKey::parse(b"secret-order-42").unwrap();
        assert!(!format!("{key:?}").contains("secret"));
    }

    proptest! {
        #[test]
        fn every_visible_ascii_key_round_trips_through_both_forms(key in "[!-~]{1,255}") {
            prop_assert_eq!(parse(&quote(&key)), Ok(key.clone()));
            if !key.starts_with('"') {
                prop_assert_eq!(parse(&key), Ok(key.clone()));
            }
        }

        #[test]
        fn parsing_never_panics_on_arbitrary_bytes(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = IdempotencyKey::parse(&raw);
        }

        #[test]
        fn white_space_around_either_form_is_not_part_of_the_key(
            key in "[!-~]{1,255}",
            before in "[ \t]{0,3}",
            after in "[ \t]{0,3}",
        ) {
            prop_assert_eq!(parse(&format!("{before}{}{after}", quote(&key))), Ok(key.clone()));
            if !key.starts_with('"') {
                prop_assert_eq!(parse(&format!("{before}{key}{after}")), Ok(key.clone()));
            }
        }

        #[test]
        fn a_byte_outside_visible_ascii_is_reported_where_it_is(
            key in "[!-~&&[^\"]][!-~]{1,100}",
            byte in prop_oneof![0u8..=0x20, 0x7fu8..=0xff],
            at in any::<proptest::sample::Index>(),
        ) {
            // Inside the key, never at its ends, where white space would be trimmed instead.
            let position = 1 + at.index(key.len() - 1);
            let mut raw = key.into_bytes();
            raw.insert(position, byte);

            prop_assert_eq!(
                IdempotencyKey::parse(&raw).map(|_| ()),
                Err(IdempotencyKeyError::NotVisibleAscii { position })
            );
        }

        #[test]
        fn a_key_longer_than_255_is_refused_in_either_form(key in "[!-~&&[^\"]][!-~]{255,400}") {
            let len = key.len();

            prop_assert_eq!(parse(&key), Err(IdempotencyKeyError::TooLong { len }));
            prop_assert_eq!(parse(&quote(&key)), Err(IdempotencyKeyError::TooLong { len }));
        }

        #[test]
        fn nothing_but_white_space_may_follow_the_closing_quote(
            key in "[!-~]{1,50}",
            rest in "[ \t]{0,2}[!-~][ -~]{0,10}",
        ) {
            prop_assert_eq!(
                parse(&format!("{}{rest}", quote(&key))),
                Err(IdempotencyKeyError::BadQuotedString("nothing may follow the closing quote"))
            );
        }

        /// Whatever a hostile header looks like (quotes, escapes, white space, control and non-ASCII
        /// bytes, overlong), what is accepted is a valid key, and it names itself in both spellings:
        /// no two distinct keys can be confused, and none escapes the limits.
        #[test]
        fn whatever_is_accepted_is_a_valid_key_that_spells_itself(
            raw in proptest::collection::vec(
                prop_oneof![
                    4 => "[!-~]{1,80}".prop_map(String::into_bytes),
                    2 => "[ -~]{0,80}".prop_map(|key| quote(&key).into_bytes()),
                    1 => proptest::sample::select(vec!["\"", "\\", "\\\"", "\\\\", " ", "\t", "\r\n"])
                        .prop_map(|s| s.as_bytes().to_vec()),
                    1 => any::<u8>().prop_map(|b| vec![b]),
                ],
                1..5,
            ).prop_map(|fragments| fragments.concat()),
        ) {
            if let Ok(key) = IdempotencyKey::parse(&raw) {
                let text = key.as_str();
                prop_assert!((1..=IdempotencyKey::MAX_LEN).contains(&text.len()), "{} bytes", text.len());
                prop_assert!(text.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{:?}", text);
                prop_assert_eq!(parse(&quote(text)), Ok(text.to_owned()));
                if !text.starts_with('"') {
                    prop_assert_eq!(parse(text), Ok(text.to_owned()));
                }
            }
        }
    }

    /// The RFC 8941 sf-string spelling of `key`.
    fn quote(key: &str) -> String {
        format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""))
    }
}
