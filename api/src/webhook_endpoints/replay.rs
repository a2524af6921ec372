//! Sending events again, and a test event: `POST /v1/webhook-endpoints/{id}/test`,
//! `POST /v1/webhook-endpoints/{id}/replay` (every dead-lettered delivery to the endpoint since a
//! time) and `POST /v1/events/{id}/replay` (one event, to every endpoint that takes it).
//!
//! A replay keeps the event, so its `webhook-id`: a receiver that dropped it as seen must forget
//! it first. The deliveries are queued; the worker sends them as it sends the others.

use std::str::FromStr;

use actix_web::{HttpRequest, HttpResponse, web};
use oncepay_domain::payment_request::FieldError;
use oncepay_store::merchant_deliveries::{self, Replayed};
use oncepay_store::{StoreError, merchant_endpoints, merchant_events};
use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::{IntoParams, IntoResponses, ToSchema};
use uuid::Uuid;

use super::{EndpointPath, NoSuchEndpoint, StoreUnavailable, admit, on_connection, path_endpoint_id};
use crate::endpoints::{Admission, JsonBodyRefusals};
use crate::errors::ApiError;
use crate::json_body;
use crate::state::AppState;

/// How many deliveries a replay queued.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReplayQueued {
    /// Deliveries queued again (or for the first time, to an endpoint made after the event).
    pub deliveries: u64,
}

/// The test event queued for an endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct TestQueued {
    /// The event's id: its delivery's `webhook-id`.
    pub event_id: Uuid,
}

/// The body of `POST /v1/webhook-endpoints/{id}/replay`.
#[derive(ToSchema)]
#[schema(as = ReplayRequest)]
pub struct ReplayBody {
    /// Replays the dead-lettered deliveries of events written at or after this time (RFC 3339).
    #[schema(format = DateTime)]
    pub since: String,
}

/// Queues an `endpoint.test` event for the endpoint alone, whatever types it takes.
#[utoipa::path(
    post,
    path = "/v1/webhook-endpoints/{id}/test",
    tag = "webhook-endpoints",
    operation_id = "test_webhook_endpoint",
    security(("api_key" = [])),
    params(EndpointPath),
    responses(TestResponses, NoSuchEndpoint, StoreUnavailable, Admission),
)]
pub async fn send_test(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (span, caller) = admit(&request, &state).await?;
    let endpoint_id = path_endpoint_id(&request, &span)?;

    let queued = on_connection(&state, async |conn| {
        let Some(endpoint) = merchant_endpoints::find(conn, caller.tenant_id, endpoint_id).await? else {
            return Ok(None);
        };
        merchant_events::send_test(conn, &endpoint).await.map(Some)
    })
    .await?;
    let event_id = queued.ok_or(ApiError::NotFound)?;
    Ok(HttpResponse::Accepted().json(TestQueued { event_id }))
}

/// Queues again every dead-lettered delivery to the endpoint of an event written since `since`.
#[utoipa::path(
    post,
    path = "/v1/webhook-endpoints/{id}/replay",
    tag = "webhook-endpoints",
    operation_id = "replay_webhook_endpoint",
    security(("api_key" = [])),
    params(EndpointPath),
    request_body(content = ReplayBody, content_type = "application/json"),
    responses(ReplayResponses, NoSuchEndpoint, ReplayBodyRefusals, JsonBodyRefusals, StoreUnavailable, Admission),
)]
pub async fn replay_failed(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (span, caller) = admit(&request, &state).await?;
    let endpoint_id = path_endpoint_id(&request, &span)?;
    let json = json_body::read(request.headers(), payload, state.intake.max_body_bytes).await?;
    let since = since_of(&json).map_err(|error| ApiError::InvalidEndpoint(vec![error]))?;

    let replayed = on_connection(&state, async |conn| {
        merchant_deliveries::replay_failed_since(conn, caller.tenant_id, endpoint_id, since).await
    })
    .await?;
    queued(replayed)
}

/// Queues an event again for every enabled endpoint that takes its type.
#[utoipa::path(
    post,
    path = "/v1/events/{id}/replay",
    tag = "webhook-endpoints",
    operation_id = "replay_event",
    security(("api_key" = [])),
    params(EventPath),
    responses(ReplayResponses, NoSuchEvent, StoreUnavailable, Admission),
)]
pub async fn replay_event(request: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let (_, caller) = admit(&request, &state).await?;
    let event_id = request.match_info().get("id").and_then(|raw| Uuid::from_str(raw).ok()).ok_or(ApiError::NotFound)?;

    let replayed = on_connection(&state, async |conn| -> Result<Option<Replayed>, StoreError> {
        merchant_deliveries::replay_event(conn, caller.tenant_id, event_id, None).await
    })
    .await?;
    queued(replayed)
}

fn queued(replayed: Option<Replayed>) -> Result<HttpResponse, ApiError> {
    let Replayed { deliveries } = replayed.ok_or(ApiError::NotFound)?;
    Ok(HttpResponse::Accepted().json(ReplayQueued { deliveries }))
}

/// The body's `since`, the only member it may have.
fn since_of(json: &Value) -> Result<OffsetDateTime, FieldError> {
    let wrong = |message: &str| FieldError { field: "since".into(), message: message.into() };
    let object = json.as_object().ok_or_else(|| wrong("the body must be an object with `since`"))?;
    if let Some(other) = object.keys().find(|key| *key != "since") {
        return Err(FieldError { field: other.clone(), message: "is not a field of a replay".into() });
    }
    let text = object.get("since").and_then(Value::as_str).ok_or_else(|| wrong("is required, as an RFC 3339 time"))?;
    OffsetDateTime::parse(text, &Rfc3339).map_err(|_| wrong("must be an RFC 3339 time, such as 2026-11-30T00:00:00Z"))
}

/// The path of an event.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventPath {
    /// The event's id: its deliveries' `webhook-id`
    #[param(format = Uuid)]
    pub id: String,
}

/// The answer of a test.
#[derive(IntoResponses)]
pub enum TestResponses {
    #[response(status = 202, description = "Queued for the endpoint alone (if it is enabled).")]
    Queued(TestQueued),
}

/// The answer of a replay.
#[derive(IntoResponses)]
pub enum ReplayResponses {
    #[response(status = 202, description = "Queued; `deliveries` says how many (0: nothing to replay).")]
    Queued(ReplayQueued),
}

/// The refusal of a replay of an event that is not the tenant's.
#[derive(IntoResponses)]
pub enum NoSuchEvent {
    #[response(
        status = 404,
        description = "No such event for this tenant; nothing was queued.",
        content_type = "application/problem+json"
    )]
    NotFound(oncepay_http::problem::Problem),
}

/// The refusals of a replay's fields.
#[derive(IntoResponses)]
pub enum ReplayBodyRefusals {
    #[response(status = 400, description = "Malformed JSON.", content_type = "application/problem+json")]
    Invalid(oncepay_http::problem::Problem),
    #[response(
        status = 422,
        description = "`since` is missing or not an RFC 3339 time, or another field is given. Nothing was queued.",
        content_type = "application/problem+json"
    )]
    Unprocessable(oncepay_http::problem::Problem),
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn since_is_an_rfc_3339_time_and_the_only_field() {
        assert_eq!(since_of(&json!({"since": "2026-11-30T00:00:00Z"})).unwrap().unix_timestamp(), 1_795_996_800);
        assert_eq!(since_of(&json!({})).unwrap_err().field, "since");
        assert_eq!(since_of(&json!({"since": "yesterday"})).unwrap_err().field, "since");
        assert_eq!(since_of(&json!({"since": "2026-11-30T00:00:00Z", "until": 1})).unwrap_err().field, "until");
        assert_eq!(since_of(&json!([1])).unwrap_err().field, "since");
    }
}
