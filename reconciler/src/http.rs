//! The reconciler's HTTP servers: the public one (`POST /webhooks/provider`, `POST
//! /webhooks/stripe` and, unless they have a listener of their own (`http.ops_port`), the probes
//! `/healthz`, `/readyz` and `/metrics`), and the operator API with its console ([`operator_api`]).
//! Neither installs signal handlers of its own.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{App, HttpResponse, HttpServer, web};
use oncepay_http::probes::{self, ProbeState};
use oncepay_http::problem::{Problem, ProblemType};

use oncepay_ops::operators::api::{self, OperatorsState};

use crate::stripe_webhooks;
use crate::webhooks::{self, WebhookState};

/// How long in-flight requests may take to finish once shutdown starts.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Builds the server on an already bound listener (port 0 in tests); with `ops`, it also serves the
/// operations endpoints.
pub fn server(
    listener: TcpListener,
    webhook: WebhookState,
    ops: Option<ProbeState>,
    workers: usize,
) -> std::io::Result<Server> {
    let webhook = web::Data::new(webhook);
    let ops = ops.map(web::Data::new);
    let server = HttpServer::new(move || {
        let app =
            App::new().app_data(webhook.clone()).configure(webhooks::configure).configure(stripe_webhooks::configure);
        let app = match &ops {
            Some(ops) => app.app_data(ops.clone()).configure(probes::configure),
            None => app,
        };
        app.default_service(web::to(not_found))
    })
    .workers(workers)
    // The service stops the server through its handle when the shutdown token fires.
    .disable_signals()
    .shutdown_timeout(SHUTDOWN_GRACE.as_secs())
    .listen(listener)?
    .run();
    Ok(server)
}

/// Builds the operator API on an already bound listener: the console's pages and the operations
/// API's JSON routes ([`oncepay_ops::operators::api`]), which share one state and one origin.
pub fn operator_api(listener: TcpListener, state: OperatorsState, workers: usize) -> std::io::Result<Server> {
    let state = web::Data::new(state);
    let server = HttpServer::new(move || {
        // The console first: on a path both serve, it answers a browser and the API everyone else.
        App::new().app_data(state.clone()).configure(oncepay_console::configure).configure(api::configure)
    })
    .workers(workers)
    .disable_signals()
    .shutdown_timeout(SHUTDOWN_GRACE.as_secs())
    .listen(listener)?
    .run();
    Ok(server)
}

/// Any other path: a problem+json 404. (Any other method on the webhook path is a 405, from
/// [`webhooks::configure`].)
async fn not_found() -> HttpResponse {
    Problem::new(ProblemType::NotFound, "there is nothing here").to_response()
}
