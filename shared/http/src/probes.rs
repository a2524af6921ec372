//! The probes every binary serves: `/healthz` (the process is up), `/readyz` (the database
//! responds and the schema is current) and `/metrics` (Prometheus text). Their settings and docs
//! call them the operations endpoints (`http.ops_port`).
//!
//! They need no authentication and reveal nothing beyond up/down and counters, so the platform can
//! probe and scrape them. [`configure`] mounts them beside a binary's public endpoints; [`server`]
//! serves them alone, and [`serve_apart`] does so on `http.ops_port` when a binary has one.

use std::net::{SocketAddr, TcpListener};

use actix_web::dev::Server;
use actix_web::{App, HttpResponse, HttpServer, web};
use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;

use oncepay_store::db;

use crate::problem::{Problem, ProblemType};

/// What the endpoints need.
#[derive(Clone)]
pub struct ProbeState {
    /// The binary's pool, for `/readyz`.
    pub pool: PgPool,
    /// The process's metrics.
    pub metrics: PrometheusHandle,
}

/// Mounts the endpoints; the app must hold `web::Data<ProbeState>`.
pub fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics));
}

/// A server of only the operations endpoints on `listener` (anything else is a 404 problem), with
/// one worker thread of its own and no signal handlers: stop it through its handle.
///
/// On a listener and a thread of their own, a busy or attacked public listener never delays a probe,
/// and the endpoints need not be exposed with the public ones.
pub fn server(listener: TcpListener, state: ProbeState) -> std::io::Result<Server> {
    let state = web::Data::new(state);
    let server = HttpServer::new(move || {
        App::new().app_data(state.clone()).configure(configure).default_service(web::to(not_found))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)?
    .run();
    Ok(server)
}

/// The operations endpoints served on a port of their own.
pub struct Apart {
    /// The bound address (with the port picked, when 0 was asked for).
    pub address: SocketAddr,
    /// Their server, not yet awaited.
    pub server: Server,
}

/// Serves the endpoints on `host:port`, apart from the binary's public endpoints, when `port` is
/// set (`http.ops_port`), with the state `state` makes; `None` when there is no such port and they
/// belong on the public one.
pub fn serve_apart(host: &str, port: Option<u16>, state: impl FnOnce() -> ProbeState) -> anyhow::Result<Option<Apart>> {
    let Some(port) = port else { return Ok(None) };
    let listener = TcpListener::bind((host, port)).with_context(|| format!("cannot listen on {host}:{port}"))?;
    let address = listener.local_addr().context("the listening socket has no address")?;
    let server = server(listener, state()).context("cannot serve the operations endpoints")?;
    Ok(Some(Apart { address, server }))
}

async fn not_found() -> HttpResponse {
    Problem::new(ProblemType::NotFound, "There is nothing here.").to_response()
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn readyz(state: web::Data<ProbeState>) -> HttpResponse {
    match db::check_ready(&state.pool).await {
        Ok(()) => HttpResponse::Ok().content_type("text/plain").body("ready\n"),
        Err(reason) => {
            tracing::warn!(error = %reason, "not ready");
            Problem::new(ProblemType::ServiceUnavailable, reason.to_string()).with_retry_after(1).to_response()
        }
    }
}

async fn metrics(state: web::Data<ProbeState>) -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.metrics.render())
}
