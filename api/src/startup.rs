//! Building and running the api: the database connections, the long polls' listener, the routes,
//! the HTTP server and the broker's consumer, and stopping them in order.
//!
//! Each HTTP worker has connections of its own; everything without I/O (the auth cache, the replay
//! cache, the rate limits, the long-poll waiters, the wake-up requests) is shared by the process.
//! The api never runs migrations.

use std::net::TcpListener;
use std::num::NonZeroUsize;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{Server, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::{App, HttpResponse, HttpServer, middleware, web};
use anyhow::Context;
use oncepay_http::probes::{self, ProbeState};
use oncepay_service::metrics::{self as shared_metrics, PrometheusHandle};
use oncepay_store::connections::Connections;
use oncepay_store::notify::{Notifier, OUTBOX_CHANNEL, Wakeups};
use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::accept_groups::AcceptGroups;
use crate::auth::Authenticator;
use crate::broker::rabbitmq::Consumer;
use crate::errors::{self, RetryAfter};
use crate::provider_intake::ProviderIntake;
use crate::rate_limit::RateLimits;
use crate::replay_cache::ReplayCache;
use crate::rereads::{Rereader, Rereads};
use crate::settings::{EventsSettings, IntakeSettings, LongPollSettings, Settings};
use crate::state::AppState;
use crate::watch::{Listener, Watch};
use crate::{
    create_payment, create_refund, get_payment, get_refund, list_refunds, openapi, request_span, webhook_endpoints,
};

/// The name every connection carries (`pg_stat_activity.application_name`).
pub const APPLICATION_NAME: &str = "oncepay-api";

/// A built, bound, not yet running api.
pub struct Application {
    port: u16,
    server: Server,
    /// The operations endpoints' own port and server, when `http.ops_port` is set.
    ops_port: Option<u16>,
    ops_server: Option<Server>,
    background: Background,
    /// The broker's consumer, when `broker.url` is set.
    consumer: Option<Consumer>,
    draining: CancellationToken,
}

impl Application {
    /// Builds the api from its settings, connecting to `database.url`.
    pub fn build(settings: Settings) -> anyhow::Result<Self> {
        let options = PgConnectOptions::from_str(settings.database.url.expose_secret())
            .context("database.url is not a valid PostgreSQL URL")?;
        Self::build_with(settings, options)
    }

    /// Builds the api on the database `options` name (e.g. a `#[sqlx::test]` database), ignoring
    /// `database.url`, and adds the api's own connection settings ([`OwnConnection::new`]).
    ///
    /// Binds the port here (0 picks a free one, which tests use). Connects lazily, so the process
    /// starts and serves `/healthz` while PostgreSQL is down, and `/readyz` responds 503 until
    /// PostgreSQL is back.
    pub fn build_with(settings: Settings, options: PgConnectOptions) -> anyhow::Result<Self> {
        // First: a metric handle taken before the recorder is installed records nothing.
        let metrics = shared_metrics::install();
        let own = OwnConnection::new(options, &settings);
        // The long polls' re-reads: one connection, so a burst of wake-ups queues instead of taking
        // the requests' connections.
        let rereader_pool = own.pool("rereads");
        let (rereads, rereader) = Rereads::new(rereader_pool.clone(), settings.long_poll.max_waiting);
        let shared = Shared::new(&settings, rereads, metrics.clone())?;
        let background = Background::new(&own, &shared, rereader, rereader_pool);
        let draining = shared.draining.clone();
        // The consumer takes as many connections as one HTTP worker.
        let consumer = settings.broker.url.is_some().then(|| {
            let connections = worker_connections(&settings);
            Consumer::new(settings.broker.clone(), shared.state(&own, connections))
        });

        let http = &settings.http;
        let tcp = TcpListener::bind((http.listen.host.as_str(), http.listen.port))
            .with_context(|| format!("cannot listen on {}:{}", http.listen.host, http.listen.port))?;
        let port = tcp.local_addr().context("the listening socket has no address")?.port();
        let apart = probes::serve_apart(&http.listen.host, http.listen.ops_port, || ProbeState {
            pool: own.pool("ops"),
            metrics,
        })?;
        let with_ops = apart.is_none();
        let server = serve(shared, own, tcp, &settings, with_ops)?;

        Ok(Self {
            port,
            server,
            ops_port: apart.as_ref().map(|apart| apart.address.port()),
            ops_server: apart.map(|apart| apart.server),
            background,
            consumer,
            draining,
        })
    }

    /// The port the api listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the operations endpoints, when they have one of their own.
    pub fn ops_port(&self) -> Option<u16> {
        self.ops_port
    }

    /// Serves until `shutdown` is cancelled (or the server fails), then stops gracefully: releases
    /// long polls at once, lets in-flight requests finish within `http.shutdown_grace_secs`, stops
    /// the background tasks and closes their pools.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self { server, ops_server, background, consumer, draining, .. } = self;
        let ops_handle = ops_server.as_ref().map(Server::handle);
        let ops_serving = ops_server.map(tokio::spawn);
        let mut background = background.spawn(&draining);
        // The consumer stops taking messages when the api begins to stop, and finishes those it holds.
        let consuming = consumer
            .map(|consumer| consumer.start(draining.clone()))
            .transpose()
            .context("cannot start the broker's consumer")?;
        let handle = server.handle();
        let stopper = tokio::spawn({
            let draining = draining.clone();
            async move {
                shutdown.cancelled().await;
                tracing::info!("shutting down: releasing long polls and finishing in-flight requests");
                draining.cancel();
                handle.stop(true).await;
            }
        });

        // The workers' pools close with their workers.
        let served = server.await;
        draining.cancel();
        stopper.abort();
        if let Some(consuming) = consuming
            && !matches!(tokio::task::spawn_blocking(move || consuming.join()).await, Ok(Ok(())))
        {
            tracing::error!("the broker's consumer failed");
        }
        background.join().await;
        // The operations server keeps serving probes until the public server has stopped.
        if let (Some(ops_handle), Some(ops_serving)) = (ops_handle, ops_serving) {
            ops_handle.stop(true).await;
            match ops_serving.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::error!(error = %error, "the operations server failed"),
                Err(error) => tracing::error!(error = %error, "the operations server task failed"),
            }
        }
        background.close().await;
        served.context("the HTTP server failed")
    }
}

/// The HTTP server on `tcp`: `http.workers` workers (one per core for 0), each with an equal share
/// of `database.max_connections`, serving the operations endpoints too if `with_ops`.
fn serve(
    shared: Shared,
    own: OwnConnection,
    tcp: TcpListener,
    settings: &Settings,
    with_ops: bool,
) -> anyhow::Result<Server> {
    let http = &settings.http;
    let max_connections = worker_connections(settings);
    Ok(HttpServer::new(move || shared.worker_app(&own, max_connections, with_ops))
        .workers(workers(settings))
        .listen(tcp)
        .context("cannot serve on the bound socket")?
        .disable_signals()
        .shutdown_timeout(http.shutdown_grace_secs)
        .run())
}

/// `http.workers`, one per core for 0.
fn workers(settings: &Settings) -> usize {
    match settings.http.workers {
        0 => std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
        workers => workers,
    }
}

/// Each HTTP worker's equal share of `database.max_connections`, rounded up.
fn worker_connections(settings: &Settings) -> u32 {
    settings.database.max_connections.div_ceil(u32::try_from(workers(settings)).unwrap_or(u32::MAX))
}

/// The tasks that run beside the HTTP workers, on the caller's runtime, each on a one-connection
/// pool of its own so it never takes one of the requests' connections: the long polls' listener
/// and re-reader, and the outbox notifier.
struct Background {
    listener: Listener,
    listener_pool: PgPool,
    rereader: Rereader,
    rereader_pool: PgPool,
    waker: Notifier,
    waker_pool: PgPool,
}

/// [`Background`]'s tasks, running, and their pools.
struct Running {
    listening: JoinHandle<()>,
    rereading: JoinHandle<()>,
    waking: JoinHandle<()>,
    pools: [PgPool; 3],
}

impl Background {
    /// The listener that wakes `shared`'s long polls, the notifier of its wake-up requests, and
    /// `rereader` on `rereader_pool`.
    fn new(own: &OwnConnection, shared: &Shared, rereader: Rereader, rereader_pool: PgPool) -> Self {
        let listener_pool = own.pool_with("listener", PgPoolOptions::new().idle_timeout(None).max_lifetime(None));
        // The outbox notifier's: one coalesced `NOTIFY` for many accepts. No ping before each
        // notification: it would double the round trips of a hint that a failed statement only
        // delays (the connection is then replaced).
        let waker_pool = own.pool_with("waker", PgPoolOptions::new().test_before_acquire(false));
        Self {
            listener: Listener::new(listener_pool.clone(), Arc::clone(&shared.watch)),
            listener_pool,
            rereader,
            rereader_pool,
            waker: Notifier::new(waker_pool.clone(), OUTBOX_CHANNEL, shared.wake.clone()),
            waker_pool,
        }
    }

    /// Starts the tasks; each stops when `draining` is cancelled.
    fn spawn(self, draining: &CancellationToken) -> Running {
        Running {
            listening: tokio::spawn(self.listener.run(draining.clone())),
            rereading: tokio::spawn(self.rereader.run(draining.clone())),
            waking: tokio::spawn(self.waker.run(draining.clone())),
            pools: [self.listener_pool, self.rereader_pool, self.waker_pool],
        }
    }
}

impl Running {
    /// Waits for the tasks to stop, logging any that failed.
    async fn join(&mut self) {
        if let Err(error) = (&mut self.listening).await {
            tracing::error!(error = %error, "the long polls' listener task failed");
        }
        if let Err(error) = (&mut self.rereading).await {
            tracing::error!(error = %error, "the long polls' re-reader task failed");
        }
        if let Err(error) = (&mut self.waking).await {
            tracing::error!(error = %error, "the outbox notifier task failed");
        }
    }

    /// Closes the tasks' pools.
    async fn close(self) {
        for pool in self.pools {
            pool.close().await;
        }
    }
}

/// The rendered OpenAPI document.
struct OpenApiJson(String);

/// Lazily opened pools of one connection each, named `oncepay-api-<job>` in `pg_stat_activity`, for
/// the jobs that must never take the requests' connections.
#[derive(Clone)]
struct OwnConnection {
    options: PgConnectOptions,
    acquire_timeout: Duration,
}

impl OwnConnection {
    /// The database `options` name, with the api's own connection settings: the application name,
    /// `statement_timeout`, and the `lock_timeout` that bounds a wait for a concurrent writer of
    /// the same key.
    fn new(options: PgConnectOptions, settings: &Settings) -> Self {
        let options = options.application_name(APPLICATION_NAME).options([
            ("statement_timeout", format!("{}ms", settings.database.statement_timeout_ms)),
            ("lock_timeout", format!("{}ms", settings.intake.key_lock_wait_ms)),
        ]);
        Self { options, acquire_timeout: Duration::from_millis(settings.database.acquire_timeout_ms) }
    }

    fn pool(&self, job: &str) -> PgPool {
        self.pool_with(job, PgPoolOptions::new())
    }

    fn pool_with(&self, job: &str, pool: PgPoolOptions) -> PgPool {
        pool.max_connections(1)
            .acquire_timeout(self.acquire_timeout)
            .connect_lazy_with(self.options.clone().application_name(&format!("{APPLICATION_NAME}-{job}")))
    }
}

/// What the HTTP workers share: the parts of [`AppState`] owned by the process, and the app data.
#[derive(Clone)]
struct Shared {
    accepts: Arc<AcceptGroups>,
    auth: Arc<Authenticator>,
    limits: Arc<RateLimits>,
    watch: Arc<Watch>,
    rereads: Rereads,
    intake: IntakeSettings,
    long_poll: LongPollSettings,
    draining: CancellationToken,
    wake: Wakeups,
    replays: Arc<ReplayCache>,
    provider_intake: ProviderIntake,
    events: EventsSettings,
    metrics: PrometheusHandle,
    openapi: web::Data<OpenApiJson>,
    retry_after: web::Data<RetryAfter>,
}

impl Shared {
    /// What the HTTP workers share, from `settings`, with the long polls' `rereads` and the process's
    /// `metrics`.
    fn new(settings: &Settings, rereads: Rereads, metrics: PrometheusHandle) -> anyhow::Result<Self> {
        let (intake, long_poll) = (&settings.intake, &settings.long_poll);
        Ok(Self {
            accepts: Arc::new(AcceptGroups::new(intake.group_limits())),
            auth: Arc::new(Authenticator::new(&settings.auth)),
            limits: Arc::new(RateLimits::new(intake.default_rate_limit_per_second, intake.default_rate_limit_burst)),
            watch: Arc::new(Watch::new(long_poll.max_waiting, long_poll.max_waiting_per_tenant)),
            rereads,
            intake: intake.clone(),
            long_poll: long_poll.clone(),
            draining: CancellationToken::new(),
            wake: Wakeups::default(),
            replays: Arc::new(ReplayCache::new(intake.replay_cache_bytes)),
            provider_intake: ProviderIntake::new(&settings.provider)?,
            events: settings.events,
            metrics,
            openapi: web::Data::new(OpenApiJson(openapi::json().context("cannot render the OpenAPI document")?)),
            retry_after: web::Data::new(RetryAfter { secs: intake.retry_after_secs }),
        })
    }

    /// The state of one user of the intake (an HTTP worker, the broker's consumer), with
    /// `max_connections` of its own, opened on the runtime that first uses them.
    fn state(&self, own: &OwnConnection, max_connections: u32) -> AppState {
        AppState {
            connections: Arc::new(Connections::new(own.options.clone(), max_connections, own.acquire_timeout)),
            accepts: Arc::clone(&self.accepts),
            auth: Arc::clone(&self.auth),
            limits: Arc::clone(&self.limits),
            watch: Arc::clone(&self.watch),
            rereads: self.rereads.clone(),
            intake: self.intake.clone(),
            long_poll: self.long_poll.clone(),
            draining: self.draining.clone(),
            wake: self.wake.clone(),
            replays: Arc::clone(&self.replays),
            provider_intake: self.provider_intake,
            events: self.events,
        }
    }

    /// One HTTP worker's app, with `max_connections` of its own for its requests, and the operations
    /// endpoints if `with_ops`.
    ///
    /// Runs on each worker's own runtime. A PostgreSQL connection belongs to the runtime that opened it
    /// (that runtime's reactor drives its socket), so each worker opens its own: a pool shared by the
    /// workers would hand one worker connections that die with another worker's runtime, as happens in
    /// every graceful stop.
    fn worker_app(
        &self,
        own: &OwnConnection,
        max_connections: u32,
        with_ops: bool,
    ) -> App<
        impl ServiceFactory<
            ServiceRequest,
            Config = (),
            Response = ServiceResponse<impl MessageBody + use<>>,
            Error = actix_web::Error,
            InitError = (),
        > + use<>,
    > {
        // Not a sqlx pool: sqlx pings a connection at every checkout and every return, a round trip
        // per request as costly as a replay's own query (see BENCHMARKS.md). A connection that died
        // is found by the request's query instead, which fails closed (503, retried by the client
        // with the same key), and is replaced.
        let state = self.state(own, max_connections);
        // `/readyz` only: one more connection per worker, opened when a probe needs it.
        let ops = ProbeState { pool: own.pool("ops"), metrics: self.metrics.clone() };
        App::new()
            .app_data(web::Data::new(state))
            .app_data(web::Data::new(ops))
            .app_data(self.openapi.clone())
            .app_data(self.retry_after.clone())
            .configure(|config| routes(config, with_ops))
            // Outermost last: the span sees the final, problem-shaped response.
            .wrap(middleware::from_fn(errors::problem_guard))
            .wrap(middleware::from_fn(request_span::trace_request))
    }
}

/// Every route, the operations endpoints only if `with_ops`; anything else is a 404 problem.
fn routes(config: &mut web::ServiceConfig, with_ops: bool) {
    config
        .service(
            web::resource("/v1/payments")
                .route(web::post().to(create_payment::create_payment))
                .default_service(errors::method_not_allowed("POST")),
        )
        .service(
            web::resource("/v1/payments/{id}")
                .route(web::get().to(get_payment::get_payment))
                .default_service(errors::method_not_allowed("GET")),
        )
        .service(
            web::resource("/v1/payments/{id}/refunds")
                .route(web::post().to(create_refund::create_refund))
                .route(web::get().to(list_refunds::list_refunds))
                .default_service(errors::method_not_allowed("GET, POST")),
        )
        .service(
            web::resource("/v1/refunds/{id}")
                .route(web::get().to(get_refund::get_refund))
                .default_service(errors::method_not_allowed("GET")),
        )
        .service(
            web::resource("/v1/webhook-endpoints")
                .route(web::post().to(webhook_endpoints::create_endpoint))
                .route(web::get().to(webhook_endpoints::list_endpoints))
                .default_service(errors::method_not_allowed("GET, POST")),
        )
        .service(
            web::resource("/v1/webhook-endpoints/{id}")
                .route(web::get().to(webhook_endpoints::get_endpoint))
                .route(web::patch().to(webhook_endpoints::update_endpoint))
                .route(web::delete().to(webhook_endpoints::delete_endpoint))
                .default_service(errors::method_not_allowed("DELETE, GET, PATCH")),
        )
        .service(
            web::resource("/v1/webhook-endpoints/{id}/rotate-secret")
                .route(web::post().to(webhook_endpoints::rotate_secret))
                .default_service(errors::method_not_allowed("POST")),
        )
        .service(
            web::resource("/v1/webhook-endpoints/{id}/test")
                .route(web::post().to(webhook_endpoints::replay::send_test))
                .default_service(errors::method_not_allowed("POST")),
        )
        .service(
            web::resource("/v1/webhook-endpoints/{id}/replay")
                .route(web::post().to(webhook_endpoints::replay::replay_failed))
                .default_service(errors::method_not_allowed("POST")),
        )
        .service(
            web::resource("/v1/events/{id}/replay")
                .route(web::post().to(webhook_endpoints::replay::replay_event))
                .default_service(errors::method_not_allowed("POST")),
        )
        .service(
            web::resource("/openapi.json")
                .route(web::get().to(openapi_json))
                .default_service(errors::method_not_allowed("GET")),
        )
        .default_service(web::to(errors::not_found));
    if with_ops {
        config
            .configure(probes::configure)
            // probes mounts each route behind a method guard: without this, another method there is a 404.
            .service(
                web::resource(["/healthz", "/readyz", "/metrics"]).default_service(errors::method_not_allowed("GET")),
            );
    }
}

async fn openapi_json(document: web::Data<OpenApiJson>) -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(document.0.clone())
}
