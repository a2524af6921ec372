//! `/v1/webhook-endpoints`: where a tenant wants its events sent, as Standard Webhooks deliveries
//! signed with a secret of the endpoint's own. The merchant makes, reads, changes and removes its
//! endpoints with the tenant's API key, gives one a new secret, sends one a test event, and has
//! events sent again ([`replay`]).
//!
//! Every request is scoped to the caller's tenant: another tenant's endpoint, and an id that is not
//! a UUID, get the same 404 as one that does not exist. A body is checked whole before the store is
//! touched ([`body`]), so a refused request writes nothing. A secret is in the response that makes
//! it (create, rotate) and in no other, and is never logged. A create may carry an
//! `Idempotency-Key`: sent again with the same key and body, it answers the endpoint it made (its
//! secret included) and makes no other; with another body, 422. Without a key, a create sent twice
//! makes two endpoints.

pub mod body;
pub mod replay;

use std::str::FromStr;

use actix_web::http::header::{self, CacheControl, CacheDirective};
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder, web};
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::webhook_endpoint::EndpointResource;
use oncepay_http::problem::Problem;
use oncepay_store::StoreError;
use oncepay_store::merchant_endpoints::{self, CreateKey, Created, Endpoint};
use oncepay_webhook_signature::WebhookSecret;
use serde::Serialize;
use sqlx::PgConnection;
use time::OffsetDateTime;
use tracing::Span;
use utoipa::{IntoParams, IntoResponses, ToSchema};
use uuid::Uuid;

use self::body::{EndpointChangeBody, NewEndpointBody};
use crate::auth::Caller;
use crate::endpoints::{Admission, JsonBodyRefusals, OptionalIdempotencyKeyHeader};
use crate::errors::ApiError;
use crate::idempotent_request;
use crate::json_body;
use crate::request_span;
use crate::resource_response;
use crate::state::AppState;

/// An endpoint with its signing secret: the response of a create and of a rotation, and of no
/// other.
#[derive(Serialize, ToSchema)]
pub struct EndpointWithSecret {
    /// The endpoint.
    #[serde(flatten)]
    pub endpoint: EndpointResource,
    /// The secret deliveries are signed with, `whsec_` and the base64 of its bytes. It is shown in
    /// this response only: keep it.
    pub secret: String,
}

impl From<&Endpoint> for EndpointWithSecret {
    fn from(endpoint: &Endpoint) -> Self {
        Self { endpoint: EndpointResource::from(endpoint), secret: endpoint.secret.clone() }
    }
}

/// The body of the list: `{"data": [endpoint, ...]}`, room left beside `data` for paging later.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointList {
    /// The tenant's endpoints, oldest first.
    pub data: Vec<EndpointResource>,
}

/// Makes an endpoint with a new secret.
#[utoipa::path(
    post,
    path = "/v1/webhook-endpoints",
    tag = "webhook-endpoints",
    operation_id = "create_webhook_endpoint",
    security(("api_key" = [])),
    params(OptionalIdempotencyKeyHeader),
    request_body(content = NewEndpointBody, content_type = "application/json",
        description = "At most 64 KiB by default. Only `url` is required. Unknown fields, and a member named twice \
                       at any depth, are rejected."),
    responses(CreateEndpointResponses, JsonBodyRefusals, StoreUnavailable, Admission),
)]
pub async fn create_endpoint(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (span, caller) = admit(&request, &state).await?;
    let key = idempotent_request::optional_idempotency_key(request.headers())?;
    let json = json_body::read(request.headers(), payload, state.intake.max_body_bytes).await?;
    let body = NewEndpointBody::from_json(&json, state.events.urls).map_err(ApiError::InvalidEndpoint)?;

    let secret = WebhookSecret::generate();
    let new = body.with_secret(&secret);
    let mut response = HttpResponse::Created();
    let endpoint = match key {
        None => {
            on_connection(&state, async |conn| merchant_endpoints::create(conn, caller.tenant_id, &new).await).await?
        }
        Some(key) => {
            let fingerprint = Fingerprint::of(idempotent_request::METHOD, CREATE_PATH, &json);
            let key = CreateKey {
                key: key.as_str(),
                fingerprint: fingerprint.as_bytes(),
                retention: state.intake.key_retention(),
            };
            let created = on_connection(&state, async |conn| {
                merchant_endpoints::create_once(conn, caller.tenant_id, &new, &key).await
            })
            .await?;
            let (endpoint, replayed, key_expires_at) = answer_for(created, &fingerprint)?;
            if replayed {
                response.insert_header((resource_response::IDEMPOTENT_REPLAYED, "true"));
            }
            if let Some(expires) = resource_response::http_date(key_expires_at) {
                response.insert_header((resource_response::IDEMPOTENCY_KEY_EXPIRES, expires));
            }
            endpoint
        }
    };
    span.record("endpoint.id", tracing::field::display(endpoint.endpoint_id));
    response.insert_header((header::LOCATION, format!("/v1/webhook-endpoints/{}", endpoint.endpoint_id)));
    Ok(secret_response(response, &endpoint))
}

/// What a create with a key answers: the endpoint, whether it is a retry's answer (the key made it
/// before, from this same request), and when the key is forgotten. A key that made an endpoint from
/// another request refuses this one (422).
fn answer_for(created: Created, fingerprint: &Fingerprint) -> Result<(Endpoint, bool, OffsetDateTime), ApiError> {
    match created {
        Created::New { endpoint, key_expires_at } => Ok((endpoint, false, key_expires_at)),
        Created::Existing { endpoint, fingerprint: made_by, key_expires_at } => {
            if made_by != fingerprint.as_bytes() {
                return Err(ApiError::KeyReused { key_expires_at });
            }
            Ok((endpoint, true, key_expires_at))
        }
    }
}

/// The path creates are sent to: part of a keyed create's fingerprint.
const CREATE_PATH: &str = "/v1/webhook-endpoints";

/// The tenant's endpoints.
#[utoipa::path(
    get,
    path = "/v1/webhook-endpoints",
    tag = "webhook-endpoints",
    operation_id = "list_webhook_endpoints",
    security(("api_key" = [])),
    responses(ListEndpointsResponses, StoreUnavailable, Admission),
)]
pub async fn list_endpoints(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (_, caller) = admit(&request, &state).await?;

    let endpoints = on_connection(&state, async |conn| merchant_endpoints::list(conn, caller.tenant_id).await).await?;
    Ok(HttpResponse::Ok().json(EndpointList { data: endpoints.iter().map(EndpointResource::from).collect() }))
}

/// One of the tenant's endpoints.
#[utoipa::path(
    get,
    path = "/v1/webhook-endpoints/{id}",
    tag = "webhook-endpoints",
    operation_id = "get_webhook_endpoint",
    security(("api_key" = [])),
    params(EndpointPath),
    responses(GetEndpointResponses, NoSuchEndpoint, StoreUnavailable, Admission),
)]
pub async fn get_endpoint(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (span, caller) = admit(&request, &state).await?;
    let endpoint_id = path_endpoint_id(&request, &span)?;

    let found =
        on_connection(&state, async |conn| merchant_endpoints::find(conn, caller.tenant_id, endpoint_id).await).await?;
    let endpoint = found.ok_or(ApiError::NotFound)?;
    Ok(HttpResponse::Ok().json(EndpointResource::from(&endpoint)))
}

/// Changes an endpoint: its URL, description or event types, or whether deliveries are made.
#[utoipa::path(
    patch,
    path = "/v1/webhook-endpoints/{id}",
    tag = "webhook-endpoints",
    operation_id = "update_webhook_endpoint",
    security(("api_key" = [])),
    params(EndpointPath),
    request_body(content = EndpointChangeBody, content_type = "application/json",
        description = "At most 64 KiB by default. Every field is optional; those left out stay as they are. Unknown \
                       fields, and a member named twice at any depth, are rejected."),
    responses(UpdateEndpointResponses, NoSuchEndpoint, EndpointBodyRefusals, JsonBodyRefusals, StoreUnavailable, Admission),
)]
pub async fn update_endpoint(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (span, caller) = admit(&request, &state).await?;
    let endpoint_id = path_endpoint_id(&request, &span)?;
    let json = json_body::read(request.headers(), payload, state.intake.max_body_bytes).await?;
    let body = EndpointChangeBody::from_json(&json, state.events.urls).map_err(ApiError::InvalidEndpoint)?;

    let change = body.change();
    let updated = on_connection(&state, async |conn| {
        merchant_endpoints::update(conn, caller.tenant_id, endpoint_id, &change).await
    })
    .await?;
    let endpoint = updated.ok_or(ApiError::NotFound)?;
    Ok(HttpResponse::Ok().json(EndpointResource::from(&endpoint)))
}

/// Removes an endpoint, and the deliveries still owed to it.
#[utoipa::path(
    delete,
    path = "/v1/webhook-endpoints/{id}",
    tag = "webhook-endpoints",
    operation_id = "delete_webhook_endpoint",
    security(("api_key" = [])),
    params(EndpointPath),
    responses(DeleteEndpointResponses, NoSuchEndpoint, StoreUnavailable, Admission),
)]
pub async fn delete_endpoint(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (span, caller) = admit(&request, &state).await?;
    let endpoint_id = path_endpoint_id(&request, &span)?;

    let deleted =
        on_connection(&state, async |conn| merchant_endpoints::delete(conn, caller.tenant_id, endpoint_id).await)
            .await?;
    if deleted { Ok(HttpResponse::NoContent().finish()) } else { Err(ApiError::NotFound) }
}

/// Gives an endpoint a new secret.
///
/// The previous secret keeps signing beside the new one for a day by default
/// (`events.rotation_overlap_secs`), so the merchant can deploy the new one without missing a
/// delivery.
#[utoipa::path(
    post,
    path = "/v1/webhook-endpoints/{id}/rotate-secret",
    tag = "webhook-endpoints",
    operation_id = "rotate_webhook_endpoint_secret",
    security(("api_key" = [])),
    params(EndpointPath),
    responses(RotateSecretResponses, NoSuchEndpoint, StoreUnavailable, Admission),
)]
pub async fn rotate_secret(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (span, caller) = admit(&request, &state).await?;
    let endpoint_id = path_endpoint_id(&request, &span)?;

    let secret = WebhookSecret::generate();
    let overlap = state.events.rotation_overlap();
    let rotated = on_connection(&state, async |conn| {
        merchant_endpoints::rotate(conn, caller.tenant_id, endpoint_id, &secret, overlap).await
    })
    .await?;
    let endpoint = rotated.ok_or(ApiError::NotFound)?;
    Ok(secret_response(HttpResponse::Ok(), &endpoint))
}

/// Admits the request (401, 429) and records its tenant on the request's span, which it returns.
async fn admit(request: &HttpRequest, state: &AppState) -> Result<(Span, Caller), ApiError> {
    let span = request_span::of(request);
    let caller = state.admit(request).await?;
    span.record("tenant.id", tracing::field::display(caller.tenant_id));
    Ok((span, caller))
}

/// The endpoint id in the path (`{id}`), recorded on `span`; an id that is not a UUID names no
/// endpoint (404).
fn path_endpoint_id(request: &HttpRequest, span: &Span) -> Result<Uuid, ApiError> {
    let endpoint_id =
        request.match_info().get("id").and_then(|raw| Uuid::from_str(raw).ok()).ok_or(ApiError::NotFound)?;
    span.record("endpoint.id", tracing::field::display(endpoint_id));
    Ok(endpoint_id)
}

/// Runs `work` on one of the worker's connections. The connection is given back for the next
/// request once `work` has succeeded; after a failure its state is unknown, and it is closed.
async fn on_connection<T>(
    state: &AppState,
    work: impl AsyncFnOnce(&mut PgConnection) -> Result<T, StoreError>,
) -> Result<T, ApiError> {
    let mut conn = state.connections.acquire().await.map_err(|e| ApiError::from_store(e.into()))?;
    let done = work(&mut *conn).await.map_err(ApiError::from_store)?;
    conn.release();
    Ok(done)
}

/// `response` with the endpoint and its secret, which no cache may keep.
fn secret_response(mut response: HttpResponseBuilder, endpoint: &Endpoint) -> HttpResponse {
    response.insert_header(CacheControl(vec![CacheDirective::NoStore])).json(EndpointWithSecret::from(endpoint))
}

/// The path of an endpoint's operations.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EndpointPath {
    /// The endpoint's id, from `Location` or the list
    #[param(format = Uuid)]
    pub id: String,
}

/// The responses of `POST /v1/webhook-endpoints`, besides the refusals every body and every
/// request can get.
#[derive(IntoResponses)]
pub enum CreateEndpointResponses {
    #[response(status = 201, description = "Made, with the secret its deliveries are signed with: shown here only, \
                                            and again to a retry with the same `Idempotency-Key` and body.",
        headers(
            ("Location" = String, description = "`/v1/webhook-endpoints/{id}`"),
            ("Cache-Control" = String, description = "`no-store`: the response holds a secret"),
            ("Idempotent-Replayed" = String, description = "`true` on a retry's answer: nothing new was made"),
            ("Idempotency-Key-Expires" = String, description = "With a key: HTTP date after which it may be forgotten"),
        ))]
    Created(EndpointWithSecret),
    #[response(
        status = 400,
        description = "A malformed `Idempotency-Key` or one sent twice, malformed JSON, or a \
                                            member named twice.",
        content_type = "application/problem+json"
    )]
    Invalid(Problem),
    #[response(status = 422, description = "`invalid-request`: a field is wrong, each one listed in `errors` (a URL that \
                                            is not `https` or not public, an unknown event type, a description too \
                                            long, an unknown field). Or `idempotency-key-reused`: the key made an \
                                            endpoint with a different request. Nothing was saved.",
        content_type = "application/problem+json",
        headers(("Idempotency-Key-Expires" = String, description = "With `idempotency-key-reused`: HTTP date after \
                                                                    which the key may be forgotten")))]
    Unprocessable(Problem),
}

/// The responses of `GET /v1/webhook-endpoints`, besides the refusals every request can get.
#[derive(IntoResponses)]
pub enum ListEndpointsResponses {
    #[response(status = 200, description = "The tenant's endpoints, oldest first (an empty list if it has none).")]
    Endpoints(EndpointList),
}

/// The responses of `GET /v1/webhook-endpoints/{id}`, besides the refusals every request can get.
#[derive(IntoResponses)]
pub enum GetEndpointResponses {
    #[response(status = 200, description = "The endpoint.")]
    Endpoint(EndpointResource),
}

/// The responses of `PATCH /v1/webhook-endpoints/{id}`, besides the refusals every body and every
/// request can get.
#[derive(IntoResponses)]
pub enum UpdateEndpointResponses {
    #[response(status = 200, description = "The endpoint as changed.")]
    Endpoint(EndpointResource),
}

/// The responses of `DELETE /v1/webhook-endpoints/{id}`, besides the refusals every request can
/// get.
#[derive(IntoResponses)]
pub enum DeleteEndpointResponses {
    #[response(status = 204, description = "Removed, with the deliveries still owed to it.")]
    Deleted,
}

/// The responses of `POST /v1/webhook-endpoints/{id}/rotate-secret`, besides the refusals every
/// request can get.
#[derive(IntoResponses)]
pub enum RotateSecretResponses {
    #[response(status = 200, description = "The endpoint with its new secret, shown here only. The previous secret \
                                            keeps signing beside it for a day by default.",
        headers(("Cache-Control" = String, description = "`no-store`: the response holds a secret")))]
    Rotated(EndpointWithSecret),
}

/// The refusal of every operation on one endpoint.
#[derive(IntoResponses)]
pub enum NoSuchEndpoint {
    #[response(
        status = 404,
        description = "No such endpoint for this tenant; nothing was changed.",
        content_type = "application/problem+json"
    )]
    NotFound(Problem),
}

/// The refusals of a change's fields, before the store.
#[derive(IntoResponses)]
pub enum EndpointBodyRefusals {
    #[response(
        status = 400,
        description = "Malformed JSON, or a member named twice.",
        content_type = "application/problem+json"
    )]
    Invalid(Problem),
    #[response(
        status = 422,
        description = "`invalid-request`: a field is wrong, each one listed in `errors` (a URL that is not `https` or \
                       not public, an unknown event type, a description too long, an unknown field). Nothing was \
                       saved.",
        content_type = "application/problem+json"
    )]
    Unprocessable(Problem),
}

/// The refusal of every operation when the store cannot be reached.
#[derive(IntoResponses)]
pub enum StoreUnavailable {
    #[response(status = 503, description = "The store cannot be reached.",
        content_type = "application/problem+json",
        headers(("Retry-After" = u64, description = "Seconds before retrying")))]
    Unavailable(Problem),
}
