//! Reading a request's JSON body, for every endpoint that takes one: `Content-Type` (415), size
//! (413, before and while reading), then the JSON itself (400), read in one strict pass that
//! refuses a member named twice at any depth.
//!
//! Pure checks of the request: nothing here reads or writes the store, and nothing here logs the
//! body. What the fields must be is each endpoint's own business.

use actix_web::http::header::{self, HeaderMap};
use actix_web::web;
use futures::StreamExt;
use oncepay_domain::payment_request::FieldError;
use oncepay_domain::strict_json::{self, StrictJsonError};
use serde_json::Value;

use crate::errors::ApiError;

/// Reads the body of a request, at most `max_bytes` of it, checking in order: `Content-Type` (415),
/// size (413), JSON (400).
pub async fn read(headers: &HeaderMap, payload: web::Payload, max_bytes: usize) -> Result<Value, ApiError> {
    require_json(headers)?;
    let body = read_bytes(headers, payload, max_bytes).await?;
    parse(&body)
}

/// The body as JSON, in one pass. A member named twice, at any depth, is refused by its name: a proxy
/// or a log that keeps the first of them would see another request than the one carried out. So is
/// a member named as serde_json's private markers, which serde_json would read as something else.
pub fn parse(body: &[u8]) -> Result<Value, ApiError> {
    let refused =
        |field, message: &str| ApiError::InvalidFields(vec![FieldError { field, message: message.to_owned() }]);
    strict_json::parse(body).map_err(|error| match error {
        StrictJsonError::RepeatedMember { path } => refused(path, "appears more than once"),
        StrictJsonError::ReservedMember { path } => refused(path, "is a name reserved by the JSON parser"),
        StrictJsonError::Json(error) => ApiError::MalformedJson(error),
    })
}

/// `Content-Type: application/json` (parameters such as `charset` allowed), else 415.
fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
    if is_json { Ok(()) } else { Err(ApiError::UnsupportedMediaType) }
}

/// The body, at most `max_bytes`: refused from `Content-Length` before reading, and again while
/// reading a body that did not declare its length (or lied about it).
async fn read_bytes(headers: &HeaderMap, mut payload: web::Payload, max_bytes: usize) -> Result<Vec<u8>, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > max_bytes as u64) {
        return Err(ApiError::PayloadTooLarge { max_bytes });
    }
    let capacity = declared.and_then(|length| usize::try_from(length).ok()).unwrap_or(0).min(max_bytes);
    let mut body = Vec::with_capacity(capacity);
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|error| match error {
            actix_web::error::PayloadError::Overflow => ApiError::PayloadTooLarge { max_bytes },
            _ => ApiError::UnreadableBody,
        })?;
        if body.len() + chunk.len() > max_bytes {
            return Err(ApiError::PayloadTooLarge { max_bytes });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;

    #[test]
    fn a_body_is_json_without_a_member_named_twice() {
        let reserved = "$serde_json::private::RawValue";
        let cases = [
            (r#"{"amount":100,"amount":5000}"#.to_owned(), Some(("amount", "appears more than once"))),
            (
                r#"{"metadata":{"order":"1","order":"1"}}"#.to_owned(),
                Some(("metadata.order", "appears more than once")),
            ),
            (r#"{"amount":100,"metadata":{"order":"1"},"order":"1"}"#.to_owned(), None),
            (format!(r#"{{"{reserved}":"{{}}"}}"#), Some((reserved, "is a name reserved by the JSON parser"))),
        ];
        for (text, refused) in cases {
            match (parse(text.as_bytes()), refused) {
                (Err(ApiError::InvalidFields(errors)), Some((field, message))) => {
                    assert_eq!(errors, [FieldError { field: field.into(), message: message.into() }]);
                }
                (Ok(json), None) => assert_eq!(json, serde_json::from_str::<Value>(&text).unwrap()),
                (other, _) => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(parse(b"{"), Err(ApiError::MalformedJson(_))));
    }

    #[test]
    fn only_json_bodies_are_accepted() {
        for (value, ok) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("text/plain", false),
            ("application/jsonx", false),
            ("application/problem+json", false),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(HeaderName::from_static("content-type"), HeaderValue::from_str(value).unwrap());

            assert_eq!(require_json(&headers).is_ok(), ok, "{value}");
        }
        assert!(require_json(&HeaderMap::new()).is_err());
    }
}
