//! The reconciler's HTTP server: `POST /webhooks/provider` and the operations endpoints
//! (`/healthz`, `/readyz`, `/metrics`).
//!
//! The server installs no signal handlers of its own: the service stops it through its handle when
//! the shutdown token fires, letting in-flight deliveries finish. Any other path answers a
//! problem+json 404, any other method on the webhook path a 405.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{App, HttpResponse, HttpServer, web};
use oncepay_shared::ops_http::{self, OpsState};
use oncepay_shared::problem::{Problem, ProblemType};

use crate::webhooks::{self, WebhookState};

/// How long in-flight requests may take to finish once shutdown starts.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Builds the server on an already bound listener (port 0 in tests).
pub fn server(listener: TcpListener, webhook: WebhookState, ops: OpsState, workers: usize) -> std::io::Result<Server> {
    let webhook = web::Data::new(webhook);
    let ops = web::Data::new(ops);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(webhook.clone())
            .app_data(ops.clone())
            .configure(webhooks::configure)
            .configure(ops_http::configure)
            .default_service(web::to(not_found))
    })
    .workers(workers)
    .disable_signals()
    .shutdown_timeout(SHUTDOWN_GRACE.as_secs())
    .listen(listener)?
    .run();
    Ok(server)
}

async fn not_found() -> HttpResponse {
    Problem::new(ProblemType::NotFound, "there is nothing here").to_response()
}
