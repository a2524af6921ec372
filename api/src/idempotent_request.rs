//! What every idempotent `POST` (a payment, a refund, and a webhook endpoint's create when it sends
//! a key), and every payment request from the broker, reads before it touches the store: the one
//! `Idempotency-Key`, a JSON body of bounded size read in one strict pass, and, once the key is
//! known to the store, whether a request with it is a retry (replayed) or a reuse (422).
//!
//! Pure checks of the request, in the order the endpoints promise: key (400), then the body as
//! [`json_body`] reads it: `Content-Type` (415), size (413), JSON (400). Nothing here reads or writes
//! the store, and nothing here logs the key or the body.

use actix_web::http::header::HeaderMap;
use actix_web::web;
use actix_web::web::Bytes;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use serde_json::Value;
use serde_json::value::RawValue;
use time::OffsetDateTime;

use crate::errors::ApiError;
use crate::json_body;
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
        let json = json_body::read(headers, payload, max_body_bytes).await?;
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
        Ok(Self { key, json: json_body::parse(body)? })
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
    optional_idempotency_key(headers)?.ok_or(ApiError::MissingIdempotencyKey)
}

/// The `Idempotency-Key` header, parsed, where a request may go without one (a webhook endpoint's
/// create); a key sent twice, or malformed, is refused as where one is required.
pub fn optional_idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let mut values = headers.get_all("idempotency-key");
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::RepeatedIdempotencyKey);
    }
    Ok(Some(IdempotencyKey::parse(value.as_bytes())?))
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
