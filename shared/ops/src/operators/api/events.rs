//! The operations API's view of a tenant's events to merchants: its webhook endpoints, stopping
//! and starting one, and replaying an event or an endpoint's failed deliveries (docs/events.md).
//!
//! Reads need the viewer role; the changes need the operator role, a reason, and write their audit
//! row in their own transaction. None moves money, so none waits for a second operator. Each change
//! is one public function ([`switch_endpoint`], [`replay_endpoint`], [`replay_event_of`]) that the
//! console calls too.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use anyhow::Context as _;
use oncepay_domain::webhook_endpoint::EndpointResource;
use oncepay_store::merchant_deliveries::{self, Replayed};
use oncepay_store::merchant_endpoints;
use serde::Deserialize;
use serde_json::json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::signing_in::{Caller, caller};
use super::tenants::see_tenant;
use super::{OperatorsState, body, change, connection, ok, problem, respond};
use crate::dead_letters::actions::require_reason;
use crate::operator_error::OperatorError;
use crate::operators::Role;
use crate::operators::audit::{self, Entry, Outcome};

/// The routes.
pub(super) fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/v1/tenants/{name}/webhook-endpoints", web::get().to(list))
        .route("/v1/tenants/{name}/webhook-endpoints/{endpoint_id}", web::patch().to(switch))
        .route("/v1/tenants/{name}/webhook-endpoints/{endpoint_id}/replay", web::post().to(replay_failed))
        .route("/v1/tenants/{name}/events/{event_id}/replay", web::post().to(replay_event));
}

/// `GET /v1/tenants/{name}/webhook-endpoints`: the tenant's endpoints, without their secrets.
async fn list(state: web::Data<OperatorsState>, request: HttpRequest, path: web::Path<String>) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let mut conn = connection(&state).await?;
            let tenant_id = see_tenant(&mut conn, &caller, &path).await.map_err(problem)?;
            let endpoints = merchant_endpoints::list(&mut conn, tenant_id)
                .await
                .context("cannot read the tenant's endpoints")
                .map_err(|e| problem(e.into()))?;
            let data: Vec<EndpointResource> = endpoints.iter().map(EndpointResource::from).collect();
            Ok(ok(StatusCode::OK, &json!({ "data": data })))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Switch {
    enabled: bool,
    reason: String,
}

/// `PATCH /v1/tenants/{name}/webhook-endpoints/{id}` `{enabled, reason}`: the endpoint as it now is.
async fn switch(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let (name, endpoint) = path.into_inner();
            let asked: Result<Switch, _> = body(&bytes);
            let action = switch_action(!matches!(&asked, Ok(Switch { enabled: false, .. })));
            let outcome = async {
                let asked = asked?;
                switch_endpoint(&state, &caller, &name, &endpoint, asked.enabled, &asked.reason).await
            };
            change(&state, &caller, Entry::new(action, Outcome::Done), outcome.await.map(|e| ok(StatusCode::OK, &e)))
                .await
        }
        .await,
    )
}

/// What starting (`true`) or stopping an endpoint is recorded as in the audit trail.
pub const fn switch_action(enabled: bool) -> &'static str {
    if enabled { "webhook_endpoint.enable" } else { "webhook_endpoint.disable" }
}

/// What replaying an endpoint's failed deliveries is recorded as in the audit trail.
pub const REPLAY_ENDPOINT_ACTION: &str = "webhook_endpoint.replay";

/// What replaying one event is recorded as in the audit trail.
pub const REPLAY_EVENT_ACTION: &str = "event.replay";

/// Starts (`enabled`) or stops tenant `name`'s endpoint `endpoint` as `caller`, with its audit row
/// in the same transaction; the endpoint as it now is. Starting one clears what stopped it;
/// stopping one records `merchant` as the reason. The JSON API and the console both call this.
pub async fn switch_endpoint(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    endpoint: &str,
    enabled: bool,
    reason: &str,
) -> Result<EndpointResource, OperatorError> {
    caller.account.require(Role::Operator, "stop or start a merchant's webhook endpoint")?;
    let reason = require_reason(reason)?;
    let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
    let tenant_id = see_tenant(&mut tx, caller, name).await?;
    let endpoint_id = endpoint_id(endpoint)?;
    let before = merchant_endpoints::find(&mut tx, tenant_id, endpoint_id).await.context("cannot read the endpoint")?;
    let before = before.ok_or_else(|| no_endpoint(endpoint))?;
    let change = merchant_endpoints::EndpointChange { enabled: Some(enabled), ..Default::default() };
    let after = merchant_endpoints::update(&mut tx, tenant_id, endpoint_id, &change)
        .await
        .context("cannot change the endpoint")?;
    let after = EndpointResource::from(&after.ok_or_else(|| no_endpoint(endpoint))?);
    let entry = Entry::new(switch_action(enabled), Outcome::Done)
        .on(tenant_id, None)
        .reason(reason)
        .before(json!(EndpointResource::from(&before)))
        .after(json!(after));
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the change")?;
    Ok(after)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplaySince {
    /// RFC 3339.
    #[serde(with = "time::serde::rfc3339")]
    since: OffsetDateTime,
    reason: String,
}

/// `POST /v1/tenants/{name}/webhook-endpoints/{id}/replay` `{since, reason}`: queues again every
/// dead-lettered delivery to the endpoint of an event written since `since`; answers how many.
async fn replay_failed(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let (name, endpoint) = path.into_inner();
            let outcome = async {
                let asked: ReplaySince = body(&bytes)?;
                let replayed = replay_endpoint(&state, &caller, &name, &endpoint, asked.since, &asked.reason).await?;
                Ok(ok(StatusCode::ACCEPTED, &json!({ "deliveries": replayed.deliveries })))
            };
            change(&state, &caller, Entry::new(REPLAY_ENDPOINT_ACTION, Outcome::Done), outcome.await).await
        }
        .await,
    )
}

/// Queues again, as `caller`, every dead-lettered delivery to tenant `name`'s endpoint `endpoint`
/// of an event written since `since`, with its audit row in the same transaction. The JSON API
/// and the console both call this.
pub async fn replay_endpoint(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    endpoint: &str,
    since: OffsetDateTime,
    reason: &str,
) -> Result<Replayed, OperatorError> {
    caller.account.require(Role::Operator, "replay a merchant's events")?;
    let reason = require_reason(reason)?;
    let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
    let tenant_id = see_tenant(&mut tx, caller, name).await?;
    let endpoint_id = endpoint_id(endpoint)?;
    let replayed = merchant_deliveries::replay_failed_since(&mut tx, tenant_id, endpoint_id, since)
        .await
        .context("cannot queue the deliveries again")?
        .ok_or_else(|| no_endpoint(endpoint))?;
    let entry = Entry::new(REPLAY_ENDPOINT_ACTION, Outcome::Done).on(tenant_id, None).reason(reason).after(
        json!({ "endpoint_id": endpoint_id, "since": since.unix_timestamp(), "deliveries": replayed.deliveries }),
    );
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the replay")?;
    Ok(replayed)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reason {
    reason: String,
}

/// `POST /v1/tenants/{name}/events/{id}/replay` `{reason}`: queues the event again for every enabled
/// endpoint that takes it, under its `webhook-id`; answers how many deliveries.
async fn replay_event(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let (name, event) = path.into_inner();
            let outcome = async {
                let asked: Reason = body(&bytes)?;
                let replayed = replay_event_of(&state, &caller, &name, &event, &asked.reason).await?;
                Ok(ok(StatusCode::ACCEPTED, &json!({ "deliveries": replayed.deliveries })))
            };
            change(&state, &caller, Entry::new(REPLAY_EVENT_ACTION, Outcome::Done), outcome.await).await
        }
        .await,
    )
}

/// Queues tenant `name`'s event `event` again, as `caller`, for every enabled endpoint that takes
/// it, with its audit row in the same transaction. The JSON API and the console both call this.
pub async fn replay_event_of(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    event: &str,
    reason: &str,
) -> Result<Replayed, OperatorError> {
    caller.account.require(Role::Operator, "replay a merchant's events")?;
    let reason = require_reason(reason)?;
    let no_event = || OperatorError::NotFound(format!("there is no event {event:?}"));
    let event_id = Uuid::parse_str(event).map_err(|_| no_event())?;
    let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
    let tenant_id = see_tenant(&mut tx, caller, name).await?;
    let replayed = merchant_deliveries::replay_event(&mut tx, tenant_id, event_id, None)
        .await
        .context("cannot queue the event again")?
        .ok_or_else(no_event)?;
    let entry = Entry::new(REPLAY_EVENT_ACTION, Outcome::Done)
        .on(tenant_id, None)
        .reason(reason)
        .after(json!({ "event_id": event_id, "deliveries": replayed.deliveries }));
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the replay")?;
    Ok(replayed)
}

fn endpoint_id(text: &str) -> Result<Uuid, OperatorError> {
    Uuid::parse_str(text).map_err(|_| no_endpoint(text))
}

fn no_endpoint(text: &str) -> OperatorError {
    OperatorError::NotFound(format!("there is no webhook endpoint {text:?}"))
}
