//! The operations endpoints: `/healthz` (the process is up), `/readyz` (it serves the protocol),
//! `/metrics` (Prometheus text).
//!
//! The simulator has no database, so unlike `oncepay_http::probes` readiness depends on nothing
//! but the process itself: ready while serving, not ready once shutdown has begun.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};

use super::App;

fn text(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// `GET /healthz`.
pub fn healthz() -> Response<Full<Bytes>> {
    text(StatusCode::OK, "text/plain", "ok\n")
}

/// `GET /readyz`.
pub fn readyz(app: &App) -> Response<Full<Bytes>> {
    if app.shutdown.is_cancelled() {
        text(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "shutting down\n")
    } else {
        text(StatusCode::OK, "text/plain", "ready\n")
    }
}

/// `GET /metrics`.
pub fn metrics(app: &App) -> Response<Full<Bytes>> {
    text(StatusCode::OK, "text/plain; version=0.0.4", app.metrics.render())
}
