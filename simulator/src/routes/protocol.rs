//! The provider protocol's endpoints: `POST /v1/charges`, `GET /v1/charges/{id}`,
//! `GET /v1/charges?…`, and the same three for `/v1/refunds`.
//!
//! Invariants: every `/v1` request is authenticated first (`Authorization: Bearer <api_key>`,
//! compared in constant time; 401 otherwise) and nothing else happens for an unauthenticated one. A
//! charge or refund request is validated (key, then body) before the provider sees it, and then
//! runs as a task of its own, so a client that hangs up mid-request cannot cut it short.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, HeaderValue, RETRY_AFTER};
use hyper::{HeaderMap, Request, Response, StatusCode};
use oncepay_provider::wire::{CreateCharge, CreateRefund};
use secrecy::ExposeSecret;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::{App, Refusal, Reply, json, raw_json, read_json};
use crate::ledger::{DEFAULT_PAGE, ListQuery, MAX_PAGE};
use crate::provider::CreateResponse;

/// `POST /v1/charges`.
pub async fn create_charge(app: &Arc<App>, request: Request<Incoming>) -> Reply {
    let (key, params) = match create_request(app, request, validate).await {
        Ok(accepted) => accepted,
        Err(refusal) => return refusal.into(),
    };
    let provider = app.provider.clone();
    respond(app.work.spawn(async move { provider.create_charge(key, params).await })).await
}

/// `POST /v1/refunds`.
pub async fn create_refund(app: &Arc<App>, request: Request<Incoming>) -> Reply {
    let (key, params) = match create_request(app, request, validate_refund).await {
        Ok(accepted) => accepted,
        Err(refusal) => return refusal.into(),
    };
    let provider = app.provider.clone();
    respond(app.work.spawn(async move { provider.create_refund(key, params).await })).await
}

/// The response to a create, once its detached work is done.
async fn respond(work: tokio::task::JoinHandle<CreateResponse>) -> Reply {
    match work.await {
        Ok(CreateResponse::Send { response: stored, replayed }) => {
            let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = raw_json(status, stored.body);
            if replayed {
                response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            }
            response.into()
        }
        Ok(CreateResponse::DropConnection) => Reply::DropConnection,
        Ok(CreateResponse::RateLimited { retry_after_secs }) => {
            let mut response =
                Refusal::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "Too many requests.").into_response();
            response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
            response.into()
        }
        Err(cause) => {
            tracing::error!(error = %cause, "a create request failed");
            Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "The provider failed.").into()
        }
    }
}

/// Authenticates, then reads the key and the parameters, and checks them with `validate`.
async fn create_request<T: serde::de::DeserializeOwned>(
    app: &App,
    request: Request<Incoming>,
    validate: fn(&T) -> Result<(), &'static str>,
) -> Result<(String, T), Refusal> {
    authenticate(app, request.headers())?;
    let key = idempotency_key(request.headers())?;
    let params: T = read_json(request).await?;
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

/// `GET /v1/refunds/{id}`.
pub async fn get_refund(app: &App, request: &Request<Incoming>, id: &str) -> Result<Response<Full<Bytes>>, Refusal> {
    authenticate(app, request.headers())?;
    lookup_error(app)?;
    match app.provider.refund(id).await {
        Some(refund) => Ok(json(StatusCode::OK, &refund)),
        None => Err(Refusal::new(StatusCode::NOT_FOUND, "resource_missing", "No such refund.")),
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

/// The query of `GET /v1/refunds`: the charges' filters, and the refunded charge.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RefundListParams {
    charge: Option<String>,
    idempotency_key: Option<String>,
    created_gte: Option<i64>,
    created_lt: Option<i64>,
    starting_after: Option<String>,
    limit: Option<usize>,
}

fn invalid(message: String) -> Refusal {
    Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", message)
}

/// Authenticates a listing and reads its query.
fn list_request<T: serde::de::DeserializeOwned>(app: &App, request: &Request<Incoming>) -> Result<T, Refusal> {
    authenticate(app, request.headers())?;
    lookup_error(app)?;
    serde_urlencoded::from_str(request.uri().query().unwrap_or(""))
        .map_err(|cause| invalid(format!("The query is not valid: {cause}")))
}

/// The listing's filters, with its page size checked.
fn list_query(
    idempotency_key: Option<String>,
    created_gte: Option<i64>,
    created_lt: Option<i64>,
    starting_after: Option<String>,
    limit: Option<usize>,
) -> Result<ListQuery, Refusal> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(invalid(format!("limit must be between 1 and {MAX_PAGE}.")));
    }
    Ok(ListQuery { idempotency_key, created_gte, created_lt, starting_after, limit })
}

/// `GET /v1/charges?idempotency_key=&created_gte=&created_lt=&starting_after=&limit=`.
pub async fn list_charges(app: &App, request: &Request<Incoming>) -> Result<Response<Full<Bytes>>, Refusal> {
    let params: ListParams = list_request(app, request)?;
    let query =
        list_query(params.idempotency_key, params.created_gte, params.created_lt, params.starting_after, params.limit)?;
    let page = app.provider.list(&query).await.map_err(|cause| invalid(cause.to_string()))?;
    Ok(json(StatusCode::OK, &page))
}

/// `GET /v1/refunds?charge=&idempotency_key=&created_gte=&created_lt=&starting_after=&limit=`.
pub async fn list_refunds(app: &App, request: &Request<Incoming>) -> Result<Response<Full<Bytes>>, Refusal> {
    let params: RefundListParams = list_request(app, request)?;
    let query =
        list_query(params.idempotency_key, params.created_gte, params.created_lt, params.starting_after, params.limit)?;
    let page = app
        .provider
        .list_refunds(&query, params.charge.as_deref())
        .await
        .map_err(|cause| invalid(cause.to_string()))?;
    Ok(json(StatusCode::OK, &page))
}

/// The lookup-error fault: a 503 instead of the charge or refund.
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

fn validate_refund(params: &CreateRefund) -> Result<(), &'static str> {
    if params.amount < 1 {
        return Err("amount must be a positive number of minor units.");
    }
    if params.charge.is_empty() {
        return Err("charge must name the charge to refund.");
    }
    if params.reason.as_deref().is_some_and(|reason| !(1..=255).contains(&reason.len())) {
        return Err("reason must be 1 to 255 characters.");
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

    #[test]
    fn refund_parameters_are_checked() {
        let params = |charge: &str, amount, reason: Option<&str>| CreateRefund {
            charge: charge.into(),
            amount,
            reason: reason.map(str::to_owned),
            metadata: BTreeMap::new(),
        };
        let cases = [
            (params("ch_1", 1, None), true),
            (params("ch_1", 1, Some("requested_by_customer")), true),
            (params("ch_1", 0, None), false),
            (params("ch_1", -1, None), false),
            (params("", 1, None), false),
            (params("ch_1", 1, Some("")), false),
            (params("ch_1", 1, Some(&"r".repeat(256))), false),
        ];
        for (params, valid) in cases {
            assert_eq!(validate_refund(&params).is_ok(), valid, "{params:?}");
        }
    }
}
