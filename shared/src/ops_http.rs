//! The operations endpoints every binary serves: `/healthz` (the process is up), `/readyz` (the
//! database answers and the schema is current) and `/metrics` (Prometheus text).
//!
//! They answer without authentication and reveal nothing beyond up/down and counters, so they can be
//! scraped and probed by the platform.

use actix_web::{HttpResponse, web};
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;

use crate::db;
use crate::problem::{Problem, ProblemType};

/// What the endpoints need.
#[derive(Clone)]
pub struct OpsState {
    /// The binary's pool, for `/readyz`.
    pub pool: PgPool,
    /// The process's metrics.
    pub metrics: PrometheusHandle,
}

/// Mounts the endpoints; the app must hold `web::Data<OpsState>`.
pub fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics));
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn readyz(state: web::Data<OpsState>) -> HttpResponse {
    match db::check_ready(&state.pool).await {
        Ok(()) => HttpResponse::Ok().content_type("text/plain").body("ready\n"),
        Err(reason) => {
            tracing::warn!(error = %reason, "not ready");
            Problem::new(ProblemType::ServiceUnavailable, reason.to_string()).with_retry_after(1).to_response()
        }
    }
}

async fn metrics(state: web::Data<OpsState>) -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.metrics.render())
}
