//! The provider protocol's endpoints: `POST /v1/charges`, `GET /v1/charges/{id}`,
//! `GET /v1/charges?…`.
//!
//! Invariants: every `/v1` request is authenticated first (`Authorization: Bearer <api_key>`,
//! compared in constant time; 401 otherwise) and nothing else happens for an unauthenticated one. A
//! charge request is validated (key, then body) before the provider sees it, and then runs as a
//! task of its own, so a client that hangs up mid-request cannot cut it short.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, HeaderValue, RETRY_AFTER};
use hyper::{HeaderMap, Request, Response, StatusCode};
use oncepay_provider::wire::CreateCharge;
use secrecy::ExposeSecret;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::{App, Refusal, Reply, json, raw_json, read_json};
use crate::ledger::{DEFAULT_PAGE, ListQuery, MAX_PAGE};
use crate::provider::ChargeResponse;

/// `POST /v1/charges`.
pub async fn create_charge(app: &Arc<App>, request: Request<Incoming>) -> Reply {
    let (key, params) = match charge_request(app, request).await {
        Ok(accepted) => accepted,
        Err(refusal) => return refusal.into(),
    };
    let provider = app.provider.clone();
    let work = app.work.spawn(async move { provider.create_charge(key, params).await });
    match work.await {
        Ok(ChargeResponse::Send { response: stored, replayed }) => {
            let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = raw_json(status, stored.body);
            if replayed {
                response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            }
            response.into()
        }
        Ok(ChargeResponse::DropConnection) => Reply::DropConnection,
        Ok(ChargeResponse::RateLimited { retry_after_secs }) => {
            let mut response =
                Refusal::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "Too many requests.").into_response();
            response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
            response.into()
        }
        Err(cause) => {
            tracing::error!(error = %cause, "a charge request failed");
            Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "The provider failed.").into()
        }
    }
}

/// Authenticates, then reads the key and the parameters.
async fn charge_request(app: &App, request: Request<Incoming>) -> Result<(String, CreateCharge), Refusal> {
    authenticate(app, request.headers())?;
    let key = idempotency_key(request.headers())?;
    let params: CreateCharge = read_json(request).await?;
    validate(&params).map_err(|problem| Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", problem))?;
    Ok((key, params))
}

/// `GET /v1/charges/{id}`.
pub async fn get_charge(app: &App, request: &Request<Incoming>, id: &str) -> Result<Response<Full<Bytes>>, Refusal> {
    authenticate(app, request.headers())?;
    lookup_error(app)?;
    match app.provider.charge(id).await {
        Some(charge) => Ok(json(StatusCode::OK, &charge)),
        None => Err(Refusal::new(StatusCode::NOT_FOUND, "resource_missing", "No such charge.")),
    }
}

/// The query of `GET /v1/charges`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    idempotency_key: Option<String>,
    created_gte: Option<i64>,
    created_lt: Option<i64>,
    starting_after: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/charges?idempotency_key=&created_gte=&created_lt=&starting_after=&limit=`.
pub async fn list_charges(app: &App, request: &Request<Incoming>) -> Result<Response<Full<Bytes>>, Refusal> {
    authenticate(app, request.headers())?;
    lookup_error(app)?;
    let invalid = |message: String| Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", message);
    let params: ListParams = serde_urlencoded::from_str(request.uri().query().unwrap_or(""))
        .map_err(|cause| invalid(format!("The query is not valid: {cause}")))?;
    let limit = params.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(invalid(format!("limit must be between 1 and {MAX_PAGE}.")));
    }
    let query = ListQuery {
        idempotency_key: params.idempotency_key,
        created_gte: params.created_gte,
        created_lt: params.created_lt,
        starting_after: params.starting_after,
        limit,
    };
    let page = app.provider.list(&query).await.map_err(|cause| invalid(cause.to_string()))?;
    Ok(json(StatusCode::OK, &page))
}

/// The lookup-error fault: a 503 instead of the charge.
fn lookup_error(app: &App) -> Result<(), Refusal> {
    if app.provider.lookup_fails() {
        return Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "The provider is unavailable."));
    }
    Ok(())
}

fn authenticate(app: &App, headers: &HeaderMap) -> Result<(), Refusal> {
    let presented = headers.get(AUTHORIZATION).map(HeaderValue::as_bytes).unwrap_or_default();
    let expected = format!("Bearer {}", app.api_key.expose_secret());
    if bool::from(presented.ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(Refusal::new(StatusCode::UNAUTHORIZED, "unauthorized", "A valid API key is required."))
    }
}

/// The `Idempotency-Key`: required, 1–255 characters of visible ASCII.
fn idempotency_key(headers: &HeaderMap) -> Result<String, Refusal> {
    let Some(value) = headers.get("idempotency-key") else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "missing_idempotency_key",
            "The Idempotency-Key header is required.",
        ));
    };
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > 255 || !bytes.iter().all(u8::is_ascii_graphic) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_idempotency_key",
            "The Idempotency-Key must be 1 to 255 characters of visible ASCII.",
        ));
    }
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

fn validate(params: &CreateCharge) -> Result<(), &'static str> {
    if params.amount < 1 {
        return Err("amount must be a positive number of minor units.");
    }
    if params.currency.len() != 3 || !params.currency.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err("currency must be three upper-case letters (ISO 4217).");
    }
    if params.customer.is_empty() {
        return Err("customer must not be empty.");
    }
    // The api's rule: as a real provider, refuse what cannot be one of its references.
    let reference = |method: &str| {
        (1..=255).contains(&method.len()) && method.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    if params.payment_method.as_deref().is_some_and(|method| !reference(method)) {
        return Err("payment_method must be 1 to 255 ASCII letters, digits and underscores.");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn keys_must_be_visible_ascii_of_1_to_255_characters() {
        let cases: [(&[u8], bool); 6] = [
            (b"oncepay-0195", true),
            (b"\"quoted\"", true),
            (&[b'k'; 255], true),
            (&[b'k'; 256], false),
            (b"with space", false),
            (b"tab\there", false),
        ];
        for (key, valid) in cases {
            let mut headers = HeaderMap::new();
            headers.insert("idempotency-key", HeaderValue::from_bytes(key).unwrap());
            assert_eq!(idempotency_key(&headers).is_ok(), valid, "{}", String::from_utf8_lossy(key));
        }
        assert_eq!(idempotency_key(&HeaderMap::new()).unwrap_err().code, "missing_idempotency_key");
    }

    #[test]
    fn charge_parameters_are_checked() {
        let params = |amount, currency: &str, customer: &str| CreateCharge {
            amount,
            currency: currency.into(),
            customer: customer.into(),
            metadata: BTreeMap::new(),
            payment_method: None,
        };
        let paying_with = |method: &str| CreateCharge { payment_method: Some(method.into()), ..params(1, "EUR", "c") };
        let cases = [
            (params(1, "EUR", "c"), true),
            (paying_with("pm_card_visa"), true),
            (paying_with(""), false),
            (paying_with("pm-card"), false),
            (paying_with(&"p".repeat(256)), false),
            (params(0, "EUR", "c"), false),
            (params(-5, "EUR", "c"), false),
            (params(1, "eur", "c"), false),
            (params(1, "EURO", "c"), false),
            (params(1, "EUR", ""), false),
        ];
        for (params, valid) in cases {
            assert_eq!(validate(&params).is_ok(), valid, "{params:?}");
        }
    }
}
