//! The control endpoints tests drive the simulator with (`/_sim/*`): the ground truth of charges
//! and of refunds, planted charges, faults, forgetting keys, the webhook target. Their JSON is in [`crate::control`].
//!
//! They need no credential: the simulator is a test tool on a private address, and its control
//! plane must stay usable when a test deliberately breaks `/v1` authentication. Every change is
//! validated whole before it takes effect.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::{App, Refusal, json, read_json};
use crate::config::parse_webhook_url;
use crate::control::{ExpiredKeys, PlantCharge, WebhookTarget};
use crate::faults::FaultsPatch;

/// `GET /_sim/charges`: every charge and every key's history.
pub fn ground_truth(app: &App) -> Response<Full<Bytes>> {
    json(StatusCode::OK, &app.provider.ground_truth())
}

/// `GET /_sim/refunds`: every refund and every refund key's history.
pub fn refund_truth(app: &App) -> Response<Full<Bytes>> {
    json(StatusCode::OK, &app.provider.refund_truth())
}

/// `POST /_sim/charges`: plants a charge (and fires its webhook).
pub async fn plant_charge(app: &Arc<App>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Refusal> {
    let plant: PlantCharge = read_json(request).await?;
    Ok(json(StatusCode::CREATED, &app.provider.plant(plant)))
}

/// `GET /_sim/faults`.
pub fn faults(app: &App) -> Response<Full<Bytes>> {
    json(StatusCode::OK, &app.faults.get())
}

/// `POST /_sim/faults`: a partial change; responds with the faults now in force.
pub async fn change_faults(app: &App, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Refusal> {
    let patch: FaultsPatch = read_json(request).await?;
    let faults = app
        .faults
        .update(&patch)
        .map_err(|invalid| Refusal::new(StatusCode::BAD_REQUEST, "invalid_faults", invalid.to_string()))?;
    tracing::info!(faults = ?faults, "faults changed");
    Ok(json(StatusCode::OK, &faults))
}

/// `POST /_sim/keys/expire`: forgets every decided idempotency key now.
pub fn expire_keys(app: &App) -> Response<Full<Bytes>> {
    let forgotten = app.provider.forget_keys();
    tracing::info!(keys.forgotten = forgotten, "idempotency keys expired on demand");
    json(StatusCode::OK, &ExpiredKeys { forgotten })
}

/// `GET /_sim/webhook`.
pub fn webhook_target(app: &App) -> Response<Full<Bytes>> {
    json(StatusCode::OK, &WebhookTarget { url: app.destination.get().map(String::from) })
}

/// `POST /_sim/webhook`: changes where the events from now on go.
pub async fn change_webhook_target(app: &App, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Refusal> {
    let target: WebhookTarget = read_json(request).await?;
    let url = target
        .url
        .as_deref()
        .map(parse_webhook_url)
        .transpose()
        .map_err(|problem| Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", problem))?;
    tracing::info!(webhook.url = url.as_ref().map(|u| u.as_str()), "webhook target changed");
    app.destination.set(url);
    Ok(webhook_target(app))
}
