//! What every idempotent `POST` (a payment, a refund), and every payment request from the broker,
//! reads before it touches the store: the one `Idempotency-Key`, a JSON body of bounded size read
//! in one strict pass, and, once the key is known to the store, whether a request with it is a
//! retry (replayed) or a reuse (422).
//!
//! Pure checks of the request, in the order both endpoints promise: key (400), `Content-Type` (415),
//! size (413), JSON (400). Nothing here reads or writes the store, and nothing here logs the key or
//! the body.

use actix_web::http::header::{self, HeaderMap};
use actix_web::web;
use actix_web::web::Bytes;
use futures::StreamExt;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::payment_request::FieldError;
use oncepay_domain::strict_json::{self, StrictJsonError};
use serde_json::Value;
use serde_json::value::RawValue;
use time::OffsetDateTime;

use crate::errors::ApiError;
use crate::resource_response::KeyInfo;

/// The method every fingerprint of an idempotent request covers.
pub const METHOD: &str = "POST";

/// An idempotent request, read and parsed; its fields are still to be checked by the endpoint.
#[derive(Debug)]
pub struct IdempotentRequest {
    /// The client's key.
    pub key: IdempotencyKey,
    /// The body, parsed without a member named twice.
    pub json: Value,
}

impl IdempotentRequest {
    /// Reads the key and the body of a request, at most `max_body_bytes` of it, checking in order:
    /// `Idempotency-Key` (400), `Content-Type` (415), size (413), JSON (400).
    pub async fn read(headers: &HeaderMap, payload: web::Payload, max_body_bytes: usize) -> Result<Self, ApiError> {
        let key = idempotency_key(headers)?;
        require_json(headers)?;
        let body = read_body(headers, payload, max_body_bytes).await?;
        let json = json_body(&body)?;
        Ok(Self { key, json })
    }

    /// Reads a request that came as a broker's message: its `key` (the message's `idempotency-key`
    /// header, if it has one) and its `body`, at most `max_body_bytes`, checking in order: key
    /// (400), size (413), JSON (400).
    pub fn of_message(key: Option<&[u8]>, body: &[u8], max_body_bytes: usize) -> Result<Self, ApiError> {
        let key = IdempotencyKey::parse(key.ok_or(ApiError::MissingIdempotencyKey)?)?;
        if body.len() > max_body_bytes {
            return Err(ApiError::PayloadTooLarge { max_bytes: max_body_bytes });
        }
        Ok(Self { key, json: json_body(body)? })
    }

    /// The fingerprint of this request to `path`: SHA-256 of the canonical `{method, path, body}`.
    pub fn fingerprint(&self, path: &str) -> Fingerprint {
        Fingerprint::of(METHOD, path, &self.json)
    }
}

/// A request with a key the store already holds: a replay if it is the request that created the key
/// (`created_by`), else 422 (the key stays the other request's until `key_expires_at`).
pub fn replay(
    created_by: &Fingerprint,
    key_expires_at: OffsetDateTime,
    fingerprint: &Fingerprint,
) -> Result<KeyInfo, ApiError> {
    if created_by != fingerprint {
        return Err(ApiError::KeyReused { key_expires_at });
    }
    Ok(KeyInfo { expires_at: key_expires_at, replayed: true })
}

/// A stored final response's body, its JSON text sent on as PostgreSQL returned it.
pub fn stored_body(body: Box<RawValue>) -> Bytes {
    Bytes::from(String::from(Box::<str>::from(body)))
}

/// The one `Idempotency-Key` header, parsed.
fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    let mut values = headers.get_all("idempotency-key");
    let value = values.next().ok_or(ApiError::MissingIdempotencyKey)?;
    if values.next().is_some() {
        return Err(ApiError::RepeatedIdempotencyKey);
    }
    Ok(IdempotencyKey::parse(value.as_bytes())?)
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
async fn read_body(headers: &HeaderMap, mut payload: web::Payload, max_bytes: usize) -> Result<Vec<u8>, ApiError> {
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

/// The body as JSON, in one pass. A member named twice, at any depth, is refused by its name: a proxy
/// or a log that keeps the first of them would see another request than the one carried out. So is
/// a member named as serde_json's private markers, which serde_json would read as something else.
fn json_body(body: &[u8]) -> Result<Value, ApiError> {
    let refused =
        |field, message: &str| ApiError::InvalidFields(vec![FieldError { field, message: message.to_owned() }]);
    strict_json::parse(body).map_err(|error| match error {
        StrictJsonError::RepeatedMember { path } => refused(path, "appears more than once"),
        StrictJsonError::ReservedMember { path } => refused(path, "is a name reserved by the JSON parser"),
        StrictJsonError::Json(error) => ApiError::MalformedJson(error),
    })
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(HeaderName::from_static(name), HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn the_idempotency_key_header_must_be_present_once_and_well_formed() {
        assert!(matches!(idempotency_key(&headers(&[])), Err(ApiError::MissingIdempotencyKey)));
        assert!(matches!(
            idempotency_key(&headers(&[("idempotency-key", "a"), ("idempotency-key", "a")])),
            Err(ApiError::RepeatedIdempotencyKey)
        ));
        assert!(matches!(
            idempotency_key(&headers(&[("idempotency-key", "a b")])),
            Err(ApiError::InvalidIdempotencyKey(_))
        ));
        let bare = idempotency_key(&headers(&[("idempotency-key", "order-42")])).unwrap();
        let quoted = idempotency_key(&headers(&[("idempotency-key", "\"order-42\"")])).unwrap();
        assert_eq!(bare, quoted);
    }

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
            match (json_body(text.as_bytes()), refused) {
                (Err(ApiError::InvalidFields(errors)), Some((field, message))) => {
                    assert_eq!(errors, [FieldError { field: field.into(), message: message.into() }]);
                }
                (Ok(json), None) => assert_eq!(json, serde_json::from_str::<Value>(&text).unwrap()),
                (other, _) => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(json_body(b"{"), Err(ApiError::MalformedJson(_))));
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
            assert_eq!(require_json(&headers(&[("content-type", value)])).is_ok(), ok, "{value}");
        }
        assert!(require_json(&headers(&[])).is_err());
    }

    #[test]
    fn a_known_key_replays_its_own_request_and_refuses_any_other() {
        let first = Fingerprint::of(METHOD, "/v1/payments", &serde_json::json!({"amount": 1}));
        let other = Fingerprint::of(METHOD, "/v1/payments", &serde_json::json!({"amount": 2}));
        let expires_at = OffsetDateTime::UNIX_EPOCH;

        let replayed = replay(&first, expires_at, &first).unwrap();
        let reused = replay(&first, expires_at, &other);

        assert!(replayed.replayed);
        assert_eq!(replayed.expires_at, expires_at);
        assert!(matches!(reused, Err(ApiError::KeyReused { key_expires_at }) if key_expires_at == expires_at));
    }
}
