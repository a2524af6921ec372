//! The responses about a payment or a refund: the status code, the resource (or the stored final
//! response) as the body, and the headers the contract promises with it — `Location`,
//! `Retry-After` while the resource is not final, `Idempotency-Key-Expires` once the key's
//! retention is known, and `Idempotent-Replayed: true` on a replay.
//!
//! Every endpoint responds through here, so a fresh 202, a replay and a poll cannot disagree about
//! the headers, for payments and refunds alike. Nothing here touches the database.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::{self, ContentType, HeaderName, HeaderValue};
use actix_web::web::Bytes;
use oncepay_domain::payment::PaymentResource;
use oncepay_domain::refund::RefundResource;
use serde::Serialize;
use time::OffsetDateTime;
use time::macros::format_description;

/// When the client's idempotency key may be forgotten (an HTTP date).
pub const IDEMPOTENCY_KEY_EXPIRES: HeaderName = HeaderName::from_static("idempotency-key-expires");

/// `true` on a response that repeats an earlier request's outcome instead of acting anew.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// RFC 7240: which preferences the server honoured.
pub const PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");

/// What an idempotency key says about the response.
#[derive(Debug, Clone, Copy)]
pub struct KeyInfo {
    /// When the key may be reaped.
    pub expires_at: OffsetDateTime,
    /// Whether this response repeats an earlier one.
    pub replayed: bool,
}

/// A resource a client creates under an idempotency key and then follows to its final state.
pub trait Followed: Serialize {
    /// What it is called in words, e.g. `payment`.
    const NAME: &'static str;

    /// Where it is served: the `Location` of its 202.
    fn location(&self) -> String;

    /// Whether it has reached its final state (`succeeded` or `failed`).
    fn is_terminal(&self) -> bool;
}

impl Followed for PaymentResource {
    const NAME: &'static str = "payment";

    fn location(&self) -> String {
        format!("/v1/payments/{}", self.id)
    }

    fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }
}

impl Followed for RefundResource {
    const NAME: &'static str = "refund";

    fn location(&self) -> String {
        format!("/v1/refunds/{}", self.id)
    }

    fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }
}

/// The response for a resource that is not terminal (202 from intake): `Location`, `Retry-After`.
pub fn accepted(resource: &impl Followed, retry_after_secs: u64, key: KeyInfo) -> HttpResponse {
    let mut builder = HttpResponse::Accepted();
    builder
        .insert_header((header::LOCATION, resource.location()))
        .insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
    with_key(&mut builder, key);
    builder.json(resource)
}

/// A replay of a resource that is terminal: the terminal response stored on the key (`status` and
/// `body` as stored when it became terminal), its JSON text sent as PostgreSQL returned it.
pub fn stored(status: u16, body: Bytes, key: KeyInfo) -> HttpResponse {
    let mut builder = HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::OK));
    with_key(&mut builder, key);
    builder.content_type(ContentType::json()).body(body)
}

/// A replay of a resource that became terminal between the key read and the resource read: the
/// same 200 and resource that were stored on the key in the transaction that made it terminal.
pub fn terminal(resource: &impl Followed, key: KeyInfo) -> HttpResponse {
    let mut builder = HttpResponse::Ok();
    with_key(&mut builder, key);
    builder.json(resource)
}

/// A replay of a known key whose resource was read after the key: 200 once it is terminal, else
/// 202 telling the client to poll after `retry_after_secs`.
pub fn replayed(resource: &impl Followed, retry_after_secs: u64, key: KeyInfo) -> HttpResponse {
    if resource.is_terminal() { terminal(resource, key) } else { accepted(resource, retry_after_secs, key) }
}

/// A status endpoint's response: 200 with the resource, `Retry-After` while it is not terminal,
/// and `Preference-Applied` when a long poll was honoured.
pub fn current(resource: &impl Followed, retry_after_secs: u64, waited_secs: Option<u64>) -> HttpResponse {
    let mut builder = HttpResponse::Ok();
    if !resource.is_terminal() {
        builder.insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
    }
    if let Some(secs) = waited_secs {
        builder.insert_header((PREFERENCE_APPLIED, format!("wait={secs}")));
    }
    builder.json(resource)
}

fn with_key(builder: &mut actix_web::HttpResponseBuilder, key: KeyInfo) {
    if let Some(date) = http_date(key.expires_at) {
        builder.insert_header((IDEMPOTENCY_KEY_EXPIRES, date));
    }
    if key.replayed {
        builder.insert_header((IDEMPOTENT_REPLAYED, HeaderValue::from_static("true")));
    }
}

/// `at` as an RFC 9110 HTTP date (IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`), truncated to the
/// second; `None` for a year that cannot be written with four digits.
pub fn http_date(at: OffsetDateTime) -> Option<HeaderValue> {
    let format = format_description!(
        "[weekday repr:short], [day] [month repr:short] [year repr:full] [hour]:[minute]:[second] GMT"
    );
    let utc = at.to_offset(time::UtcOffset::UTC);
    if !(0..=9999).contains(&utc.year()) {
        return None;
    }
    utc.format(&format).ok().and_then(|text| HeaderValue::from_str(&text).ok())
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[test]
    fn http_dates_are_imf_fixdates_in_gmt() {
        let cases = [
            (datetime!(1994-11-06 08:49:37.9 UTC), "Sun, 06 Nov 1994 08:49:37 GMT"),
            (datetime!(2026-11-23 01:00:00 +02:00), "Sun, 22 Nov 2026 23:00:00 GMT"),
            (datetime!(1970-01-01 00:00:00 UTC), "Thu, 01 Jan 1970 00:00:00 GMT"),
        ];
        for (at, expected) in cases {
            assert_eq!(http_date(at).unwrap(), expected, "{at}");
        }
    }

    #[test]
    fn dates_beyond_four_digit_years_are_left_out_rather_than_mangled() {
        assert!(http_date(OffsetDateTime::UNIX_EPOCH.replace_year(-1).unwrap()).is_none());
    }
}
