//! The reconciler as a service ([`Application`]): the settings wired into its HTTP servers (the
//! public one for webhooks, the probes on a port of their own when `http.ops_port` is set, and the
//! operator API when `operators.port` is) and its background loops (the pollers of payments and of
//! refunds, sweeper, reaper, nightly and queued reconciliation, backlog gauges, bulk retries).
//!
//! [`Application::build`] binds every listener and reports its port, so tests run the real
//! application on port 0; [`Application::run_until_stopped`] owns the order things stop in. It
//! does not migrate the schema (`oncepay-reconciler migrate` does, once per deploy); `/readyz`
//! says whether the schema is current.

use std::net::TcpListener;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Server;
use anyhow::Context;
use oncepay_http::probes::{self, ProbeState};
use oncepay_ops::operators::api::{BulkRetrier, OperatorsState};
use oncepay_ops::operators::oidc::Oidc;
use oncepay_ops::operators::passwords::Hashing;
use oncepay_provider::ConfiguredProvider;
use oncepay_service::runner::{self, Pass};
use oncepay_store::db;
use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backlog::Sampler;
use crate::poller::{PaymentPoller, PollerConfig, RefundPoller};
use crate::reaper::{Reaper, ReaperConfig};
use crate::recon::{QueuedRuns, Reconciliation};
use crate::settings::Settings;
use crate::sweeper::{Sweeper, SweeperConfig};
use crate::webhooks::WebhookState;

/// The reconciler, its listeners bound and its loops built, not yet running.
pub struct Application {
    port: u16,
    server: Server,
    /// The probes' own port and server, when `http.ops_port` is set.
    probes: Option<(u16, Server)>,
    /// The operator API's port and server, when `operators.port` is set.
    operator_api: Option<(u16, Server)>,
    loops: Loops,
    pool: PgPool,
}

/// The background loops, built from the settings.
struct Loops {
    poller: PaymentPoller<ConfiguredProvider>,
    refund_poller: RefundPoller<ConfiguredProvider>,
    sweeper: Sweeper,
    reaper: Reaper,
    backlog: Sampler,
    recon: Arc<Reconciliation<ConfiguredProvider>>,
    /// Only where there is an operator API to confirm bulk retries in.
    bulk_retrier: Option<BulkRetrier>,
}

impl Application {
    /// Builds the reconciler from its settings: connects lazily to `database.url`, binds the public
    /// listener on `http.port` and, when set, the probes' on `http.ops_port` and the operator API's
    /// on `operators.port` (0 picks a free port each).
    pub fn build(settings: Settings) -> anyhow::Result<Self> {
        let metrics = oncepay_service::metrics::install();
        crate::metrics::describe();
        let options =
            db::connect_options(&settings.database, "oncepay-reconciler").context("database.url is invalid")?;
        let pool = db::pool(&settings.database, options);
        let provider = ConfiguredProvider::new(&settings.provider).context("cannot build the provider client")?;
        let workers = std::thread::available_parallelism().map_or(1, NonZeroUsize::get).min(4);
        let host = settings.http.host.as_str();

        let secrets = settings.webhooks.serving_secrets(settings.provider.kind)?;
        let webhook = WebhookState {
            pool: pool.clone(),
            secrets: secrets.simulator,
            stripe_secrets: secrets.stripe,
            tolerance_secs: settings.webhooks.tolerance_secs,
            max_body_bytes: settings.webhooks.max_body_bytes,
        };
        let ops = ProbeState { pool: pool.clone(), metrics };
        let listener = TcpListener::bind((host, settings.http.port))
            .with_context(|| format!("cannot listen on {host}:{}", settings.http.port))?;
        let port = listener.local_addr().context("cannot read the bound address")?.port();
        let apart = probes::serve_apart(host, settings.http.ops_port, || ops.clone())?;
        let public_ops = apart.is_none().then_some(ops);
        let server =
            crate::http::server(listener, webhook, public_ops, workers).context("cannot start the HTTP server")?;
        tracing::info!(http.port = port, "reconciler listening");
        let probes = apart.map(|apart| {
            tracing::info!(http.address = %apart.address, "reconciler operations endpoints listening");
            (apart.address.port(), apart.server)
        });

        let (operator_api, bulk_retrier) = match settings.operators.port {
            Some(port) => {
                let listener = TcpListener::bind((host, port))
                    .with_context(|| format!("cannot listen for the operator API on {host}:{port}"))?;
                let address = listener.local_addr().context("cannot read the bound address")?;
                let state = operators_state(&settings, pool.clone())?;
                let bulk_retrier = BulkRetrier::new(state.clone());
                let server = crate::http::operator_api(listener, state, workers.min(2))
                    .context("cannot start the operator API")?;
                tracing::info!(http.address = %address, "operator API listening");
                (Some((address.port(), server)), Some(bulk_retrier))
            }
            None => (None, None),
        };

        let loops = Loops::build(&settings, &pool, provider, bulk_retrier);
        Ok(Self { port, server, probes, operator_api, loops, pool })
    }

    /// The public port (webhooks, and the probes unless they have a port of their own).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The probes' own port, when `http.ops_port` is set.
    pub fn probe_port(&self) -> Option<u16> {
        self.probes.as_ref().map(|(port, _)| *port)
    }

    /// The operator API's port, when `operators.port` is set.
    pub fn operator_port(&self) -> Option<u16> {
        self.operator_api.as_ref().map(|(port, _)| *port)
    }

    /// Serves and runs every loop until `shutdown` is cancelled (or the public server fails, or the
    /// nightly schedule cannot run), then stops in order: the public server and the operator API
    /// finish their requests, every loop finishes its pass, the probes answer until then, and the
    /// pool closes last.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self { server, probes, operator_api, loops, pool, .. } = self;
        let (probes_handle, probes_running) = probes.map(|(_, server)| (server.handle(), tokio::spawn(server))).unzip();
        let (operator_handle, operator_running) =
            operator_api.map(|(_, server)| (server.handle(), tokio::spawn(server))).unzip();
        let mut running = loops.spawn(&shutdown);
        let server_handle = server.handle();
        let stopper = shutdown.clone();
        running.spawn(async move {
            stopper.cancelled().await;
            server_handle.stop(true).await;
            if let Some(operator) = operator_handle {
                operator.stop(true).await;
            }
            Ok(())
        });

        let mut ended = server.await.context("the HTTP server failed");
        // The server may also end on its own (an I/O failure): take the loops down with it.
        shutdown.cancel();
        while let Some(joined) = running.join_next().await {
            let failed = match joined {
                Ok(result) => result.err(),
                Err(panic) => Some(anyhow::anyhow!("a background loop panicked: {panic}")),
            };
            if let Some(error) = failed {
                tracing::error!(error = format!("{error:#}"), "the reconciler is stopping on an error");
                if ended.is_ok() {
                    ended = Err(error);
                }
            }
        }
        if let Some(running) = operator_running {
            let stopped = running
                .await
                .context("the operator API panicked")
                .and_then(|served| served.context("the operator API failed"));
            if let (Err(error), true) = (stopped, ended.is_ok()) {
                ended = Err(error);
            }
        }
        // The probes keep responding until the public server and the loops have stopped.
        if let (Some(probes_handle), Some(probes_running)) = (probes_handle, probes_running) {
            probes_handle.stop(true).await;
            let stopped = probes_running
                .await
                .context("the operations server panicked")
                .and_then(|served| served.context("the operations server failed"));
            if let (Err(error), true) = (stopped, ended.is_ok()) {
                ended = Err(error);
            }
        }
        pool.close().await;
        tracing::info!("reconciler stopped");
        ended
    }
}

/// What the operator API's handlers share, from the settings: the one place it is built.
pub fn operators_state(settings: &Settings, pool: PgPool) -> anyhow::Result<OperatorsState> {
    let operators = &settings.operators;
    let oidc = match &operators.oidc {
        Some(oidc) => Some(Arc::new(Oidc::new(oidc.clone()).context("cannot build the OpenID client")?)),
        None => None,
    };
    Ok(OperatorsState {
        pool,
        provider: settings.provider.clone(),
        resend_horizon: settings.key_window().resend_horizon(),
        proposal_ttl: Duration::from_secs(operators.proposal_ttl_secs),
        token_ttl: operators.token_ttl(),
        max_token_ttl: operators.max_token_ttl(),
        retries_need_approval: operators.retries_need_approval,
        sessions: operators.session_policy(),
        hashing: Hashing::new(operators.max_concurrent_password_hashes),
        enrollment_ttl: operators.enrollment_ttl(),
        fresh_sign_in: Duration::from_secs(operators.fresh_sign_in_secs),
        oidc,
        recon_stale_after: Duration::from_secs(settings.recon.stale_after_secs),
    })
}

impl Loops {
    fn build(
        settings: &Settings,
        pool: &PgPool,
        provider: ConfiguredProvider,
        bulk_retrier: Option<BulkRetrier>,
    ) -> Self {
        let p = &settings.poller;
        let key_window = settings.key_window();
        let poller_config = PollerConfig {
            interval: p.interval(),
            batch_size: p.batch_size,
            concurrency: p.concurrency,
            lease: Duration::from_millis(p.lease_ms),
            backoff: p.backoff,
            max_attempts: p.max_attempts,
            max_age: Duration::from_secs(p.max_age_secs),
            key_window,
        };
        Self {
            // Unknown refunds are looked up by a loop of their own, with the same limits: a backlog
            // of one kind never holds the other back.
            refund_poller: RefundPoller::new(pool.clone(), provider.clone(), poller_config.clone()),
            poller: PaymentPoller::new(pool.clone(), provider.clone(), poller_config),
            sweeper: Sweeper::new(
                pool.clone(),
                SweeperConfig {
                    interval: Duration::from_millis(settings.sweeper.interval_ms),
                    batch_size: settings.sweeper.batch_size,
                    key_window,
                },
            ),
            reaper: Reaper::new(
                pool.clone(),
                ReaperConfig {
                    interval: Duration::from_millis(settings.reaper.interval_ms),
                    batch_size: settings.reaper.batch_size,
                    webhook_retention: Duration::from_secs(settings.reaper.webhook_retention_secs),
                    event_retention: Duration::from_secs(settings.reaper.event_retention_secs),
                },
            ),
            backlog: Sampler::new(pool.clone(), Duration::from_millis(settings.backlog.interval_ms)),
            recon: Arc::new(Reconciliation::new(pool.clone(), provider, settings.recon_config())),
            bulk_retrier,
        }
    }

    /// Starts every loop, each until `shutdown`.
    fn spawn(self, shutdown: &CancellationToken) -> JoinSet<anyhow::Result<()>> {
        let mut running = JoinSet::new();
        spawn(&mut running, self.poller, shutdown);
        spawn(&mut running, self.refund_poller, shutdown);
        spawn(&mut running, self.sweeper, shutdown);
        spawn(&mut running, self.reaper, shutdown);
        spawn(&mut running, self.backlog, shutdown);
        spawn(&mut running, QueuedRuns(Arc::clone(&self.recon)), shutdown);
        if let Some(bulk_retrier) = self.bulk_retrier {
            spawn(&mut running, bulk_retrier, shutdown);
        }
        let token = shutdown.clone();
        running.spawn(async move {
            let scheduled = self.recon.run(token.clone()).await;
            if scheduled.is_err() {
                // Without it the service is not doing its job: stop everything and exit non-zero.
                token.cancel();
            }
            scheduled.context("the nightly reconciliation cannot run")
        });
        running
    }
}

/// Runs a background loop in `running` until `shutdown`.
fn spawn<P: Pass + Send + 'static>(running: &mut JoinSet<anyhow::Result<()>>, pass: P, shutdown: &CancellationToken) {
    let shutdown = shutdown.clone();
    running.spawn(async move {
        runner::run(&pass, crate::metrics::LOOP_ERRORS, shutdown).await;
        Ok(())
    });
}
