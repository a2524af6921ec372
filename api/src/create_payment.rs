//! `POST /v1/payments`: accepts a payment request exactly once per (tenant, idempotency key).
//!
//! Every check of the request itself runs before anything is read from or written to the store. A
//! key whose payment is final is replayed from memory ([`crate::replay_cache`]); any other request
//! goes to the store with the requests of its tenant that arrive meanwhile
//! ([`crate::accept_groups`]), where a known key is replayed and a new payment accepted. What the
//! provider could never charge is refused only for a new key: a stored key replays, whatever the
//! provider's rules or the tenant's account say now. A store that cannot be reached fails closed.
//! Never logged: the API key, the idempotency key, the body.

use std::sync::Arc;

use actix_web::http::header::{self, HeaderMap};
use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse, web};
use anyhow::anyhow;
use futures::StreamExt;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::ids::TenantId;
use oncepay_domain::payment::PaymentResource;
use oncepay_domain::payment_request::{FieldError, PaymentRequest};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::strict_json::{self, StrictJsonError};
use oncepay_service::telemetry;
use oncepay_store::intake::{self, ExistingKey, Intake, NewPayment};
use oncepay_store::{StoreError, payments};
use serde_json::Value;
use sqlx::PgConnection;
use time::OffsetDateTime;

use crate::accept_groups::LOCK_NOT_AVAILABLE;
use crate::auth::Caller;
use crate::errors::ApiError;
use crate::openapi::{Admission, CreatePaymentHeaders, CreatePaymentResponses, PaymentRequestBody};
use crate::payment_response::{self, KeyInfo};
use crate::replay_cache::Final;
use crate::request_span;
use crate::startup::AppState;

/// The method and path a fingerprint covers.
const METHOD: &str = "POST";
const PATH: &str = "/v1/payments";

/// Accepts a payment request, or replays the outcome of the first request with the same key.
#[utoipa::path(
    post,
    path = "/v1/payments",
    tag = "payments",
    operation_id = "create_payment",
    security(("api_key" = [])),
    params(CreatePaymentHeaders),
    request_body(content = PaymentRequestBody, content_type = "application/json",
        description = "At most 64 KiB by default. Unknown fields, and a member named twice at any depth, are \
                       rejected."),
    responses(CreatePaymentResponses, Admission),
)]
pub async fn create_payment(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = take(&request, payload, &state).await;
    let label = match &result {
        Ok(responded) if responded.replayed => "replayed",
        Ok(_) => "created",
        Err(error) => error_label(error),
    };
    metrics::counter!(crate::metrics::INTAKE, "outcome" => label).increment(1);
    result.map(|responded| responded.response)
}

/// A response, and whether it repeats an earlier request's outcome.
struct Responded {
    response: HttpResponse,
    replayed: bool,
}

/// Checks the request in this order, and refuses it before the store is touched: API key (401),
/// rate limit (429), `Idempotency-Key` (400), `Content-Type` (415), body size (413), JSON (400; a
/// member named twice is named like a wrong field), fields (400, listing every invalid field). Then
/// serves it from memory or from the store; what the configured provider could never charge (400,
/// naming the field) or a tenant without the provider account it needs (400) is refused only once
/// the key is known to be new.
async fn take(request: &HttpRequest, payload: web::Payload, state: &AppState) -> Result<Responded, ApiError> {
    let span = request_span::of(request);
    let caller = state.admit(request).await?;
    span.record("tenant.id", tracing::field::display(caller.tenant_id));

    let headers = request.headers();
    let key = idempotency_key(headers)?;
    require_json(headers)?;
    let body = read_body(headers, payload, state.intake.max_body_bytes).await?;
    let json = json_body(&body)?;
    let payment_request = PaymentRequest::from_json(&json).map_err(ApiError::InvalidFields)?;
    let fingerprint = Fingerprint::of(METHOD, PATH, &json);
    // A key whose payment this process has seen final needs no round trip: its stored final
    // response, or 422 for another request.
    if let Some(remembered) = state.replays.get(caller.tenant_id, &key, OffsetDateTime::now_utc()) {
        span.record("payment.id", tracing::field::display(remembered.payment_id));
        return replay_remembered(remembered, &fingerprint);
    }
    match state.provider_intake.admit(&payment_request, caller.provider_account.as_ref()) {
        Ok(account) => store(state, &span, &caller, key, fingerprint, payment_request, account).await,
        Err(refusal) => replay_or_refuse(state, &span, &caller, &key, &fingerprint, refusal).await,
    }
}

/// A request the provider's rules refuse now: if its key is stored, the payment it names is
/// replayed (or 422 for another request), as for any retry; only a new key gets `refusal`, and
/// nothing is written.
async fn replay_or_refuse(
    state: &AppState,
    span: &tracing::Span,
    caller: &Caller,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    refusal: ApiError,
) -> Result<Responded, ApiError> {
    let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let stored = intake::stored(&mut conn, caller.tenant_id, key).await.map_err(ApiError::from_store)?;
    conn.release();
    match stored {
        Some(existing) => replay_existing(state, span, caller, key, existing, fingerprint).await,
        None => Err(refusal),
    }
}

/// The store's part: intake, together with the tenant's requests that arrive meanwhile, then for a
/// known key the replay (one more read while its payment is not terminal). A known key comes back as
/// stored and nothing is written: the same fingerprint is replayed, another one is refused (422). A
/// new key's payment is charged to `account`.
async fn store(
    state: &AppState,
    span: &tracing::Span,
    caller: &Caller,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    payment_request: PaymentRequest,
    account: Option<ProviderAccount>,
) -> Result<Responded, ApiError> {
    let new = NewPayment {
        tenant_id: caller.tenant_id,
        key: key.clone(),
        fingerprint,
        request: payment_request,
        provider_account: account,
        retention: state.intake.key_retention(),
        trace: telemetry::trace_context_of(span),
    };
    // A new key is written in one statement with the other new keys of its group: key, payment,
    // outbox row and audit row each. If a concurrent request with the same key committed first,
    // intake waited for it (at most `lock_timeout`), wrote nothing and read the key again, so every
    // concurrent duplicate gets the same payment id.
    let accepted = Arc::clone(&state.accepts).accept(Arc::clone(&state.connections), new).await;
    match accepted.map_err(accept_error)? {
        Intake::Created(created) => {
            // Committed: wake the workers, one coalesced `NOTIFY` for many accepts, naming the
            // tenants whose rows they queued (`oncepay_store::notify`).
            state.wake.announce(caller.tenant_id);
            span.record("payment.id", tracing::field::display(created.payment.payment_id));
            let resource = PaymentResource::from(&created.payment);
            let key = KeyInfo { expires_at: created.key_expires_at, replayed: false };
            Ok(Responded {
                response: payment_response::accepted(&resource, state.intake.retry_after_secs, key),
                replayed: false,
            })
        }
        Intake::Existing(existing) => replay_existing(state, span, caller, &key, existing, &fingerprint).await,
    }
}

/// The response for a known key: its stored final response, or the payment as it stands, read once
/// more (422 for another request either way).
async fn replay_existing(
    state: &AppState,
    span: &tracing::Span,
    caller: &Caller,
    key: &IdempotencyKey,
    existing: ExistingKey,
    fingerprint: &Fingerprint,
) -> Result<Responded, ApiError> {
    span.record("payment.id", tracing::field::display(existing.payment_id));
    // No stored response yet: the payment as it stands, read once more.
    let Some((status, body)) = existing.stored_response else {
        let poll_after_secs = state.intake.retry_after_secs;
        let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
        let response = replay_in_progress(&mut conn, caller.tenant_id, existing, fingerprint, poll_after_secs).await;
        // Reused unless the read failed (its state is then unknown).
        if !matches!(response, Err(ApiError::Unavailable(_) | ApiError::Internal(_))) {
            conn.release();
        }
        return Ok(Responded { response: response?, replayed: true });
    };
    let remembered = Final {
        fingerprint: existing.fingerprint,
        payment_id: existing.payment_id,
        expires_at: existing.expires_at,
        status,
        body: Bytes::from(String::from(Box::<str>::from(body))),
    };
    // A stored response is final, so the next retry can be served from memory.
    state.replays.remember(caller.tenant_id, key, remembered.clone());
    replay_remembered(remembered, fingerprint)
}

/// The response for a key whose payment is final: its stored response, or 422 for another request.
fn replay_remembered(remembered: Final, fingerprint: &Fingerprint) -> Result<Responded, ApiError> {
    if remembered.fingerprint != *fingerprint {
        return Err(ApiError::KeyReused { key_expires_at: remembered.expires_at });
    }
    let key = KeyInfo { expires_at: remembered.expires_at, replayed: true };
    Ok(Responded { response: payment_response::stored(remembered.status, remembered.body, key), replayed: true })
}

/// The response for a key whose payment was not final when the key was read (a 202 tells the
/// client to poll after `poll_after_secs`).
async fn replay_in_progress(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    existing: ExistingKey,
    fingerprint: &Fingerprint,
    poll_after_secs: u64,
) -> Result<HttpResponse, ApiError> {
    if existing.fingerprint != *fingerprint {
        return Err(ApiError::KeyReused { key_expires_at: existing.expires_at });
    }
    let key = KeyInfo { expires_at: existing.expires_at, replayed: true };
    let payment = payments::fetch(conn, tenant_id, existing.payment_id)
        .await
        .map_err(ApiError::from_store)?
        .ok_or_else(|| ApiError::Internal(anyhow!("an idempotency key names a payment that does not exist")))?;
    let resource = PaymentResource::from(&payment);
    // Settled between the two reads: `settle` stored exactly this 200 and resource on the key.
    Ok(if payment.status.is_terminal() {
        payment_response::terminal(&resource, key)
    } else {
        payment_response::accepted(&resource, poll_after_secs, key)
    })
}

/// Accept's failures: a lock wait past `lock_timeout` is the key being written right now (409 +
/// `Retry-After`).
fn accept_error(error: StoreError) -> ApiError {
    if error.sqlstate().as_deref() == Some(LOCK_NOT_AVAILABLE) {
        ApiError::KeyInUse
    } else {
        // 503 + `Retry-After`, never cached. Accept is a single statement, so nothing was written,
        // unless the connection broke after the commit was sent: the 503 tells the client to retry
        // with the same key (which then replays the payment), never that nothing was recorded.
        ApiError::from_store(error)
    }
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
/// or a log that keeps the first of them would see another payment than the one charged. So is a
/// member named as serde_json's private markers, which serde_json would read as something else.
fn json_body(body: &[u8]) -> Result<Value, ApiError> {
    let refused =
        |field, message: &str| ApiError::InvalidFields(vec![FieldError { field, message: message.to_owned() }]);
    strict_json::parse(body).map_err(|error| match error {
        StrictJsonError::RepeatedMember { path } => refused(path, "appears more than once"),
        StrictJsonError::ReservedMember { path } => refused(path, "is a name reserved by the JSON parser"),
        StrictJsonError::Json(error) => ApiError::MalformedJson(error),
    })
}

/// The `outcome` label of a refused request.
fn error_label(error: &ApiError) -> &'static str {
    match error {
        ApiError::Unauthorized(_) => "unauthorized",
        ApiError::RateLimited { .. } => "rate_limited",
        ApiError::KeyReused { .. } => "key_reused",
        ApiError::KeyInUse => "key_in_use",
        ApiError::Unavailable(_) => "store_unavailable",
        ApiError::KeyCheckBusy => "key_check_busy",
        ApiError::MissingIdempotencyKey
        | ApiError::RepeatedIdempotencyKey
        | ApiError::InvalidIdempotencyKey(_)
        | ApiError::UnsupportedMediaType
        | ApiError::PayloadTooLarge { .. }
        | ApiError::UnreadableBody
        | ApiError::MalformedJson(_)
        | ApiError::InvalidFields(_)
        | ApiError::NoProviderAccount => "invalid",
        ApiError::NotFound | ApiError::MethodNotAllowed { .. } | ApiError::Internal(_) => "error",
    }
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
}
