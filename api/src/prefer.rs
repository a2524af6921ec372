//! The RFC 7240 `Prefer` header, as far as the api honours it: the `wait` preference that turns
//! `GET /v1/payments/{id}` and `GET /v1/refunds/{id}` into long polls.
//!
//! Per RFC 7240 a preference the server does not understand, or cannot parse, is ignored (the
//! request is served as if it were absent), and when a preference appears more than once only the
//! first is considered. Pure: no I/O.

use actix_web::http::header::HeaderMap;

/// The `Prefer` header's name.
const PREFER: &str = "prefer";

/// The seconds asked for by the first `wait` preference, if it is a well-formed number.
pub fn wait_secs(headers: &HeaderMap) -> Option<u64> {
    let first_wait = headers
        .get_all(PREFER)
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|preference| {
            // `token [= word] *(; parameter)`: parameters do not matter for `wait`.
            let head = preference.split(';').next().unwrap_or_default();
            let (name, value) = head.split_once('=').unwrap_or((head, ""));
            name.trim().eq_ignore_ascii_case("wait").then_some(value.trim())
        })
        .next()?;
    let unquoted = first_wait.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(first_wait);
    if unquoted.is_empty() || !unquoted.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // More digits than a u64 holds is still "a very long wait": the caller caps it anyway.
    Some(unquoted.parse().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;

    fn wait(values: &[&str]) -> Option<u64> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(HeaderName::from_static(PREFER), HeaderValue::from_str(value).unwrap());
        }
        wait_secs(&headers)
    }

    #[test]
    fn the_first_well_formed_wait_preference_is_honoured() {
        let cases: [(&[&str], Option<u64>); 14] = [
            (&[], None),
            (&["wait=10"], Some(10)),
            (&["Wait = 7"], Some(7)),
            (&["wait=\"5\""], Some(5)),
            (&["respond-async, wait=3"], Some(3)),
            (&["respond-async", "wait=4"], Some(4)),
            (&["wait=2; foo=bar"], Some(2)),
            (&["wait=0"], Some(0)),
            (&["wait=1", "wait=9"], Some(1)),
            (&["wait=99999999999999999999999"], Some(u64::MAX)),
            (&["wait"], None),
            (&["wait=-1"], None),
            (&["wait=1.5"], None),
            (&["handling=lenient"], None),
        ];
        for (values, expected) in cases {
            assert_eq!(wait(values), expected, "{values:?}");
        }
    }
}
