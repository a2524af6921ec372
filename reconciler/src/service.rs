//! `serve`: the reconciler as a service. Wires the settings into the HTTP servers (webhooks and
//! operations endpoints; the operators' API when it has a port) and the background loops (the
//! pollers of payments and of refunds, sweeper, reaper, nightly and queued reconciliation, backlog
//! gauges), and runs them until the shutdown token fires.
//!
//! It does not migrate the schema (`oncepay-reconciler migrate` does, once per deploy); `/readyz`
//! says whether the schema is current.

use std::net::TcpListener;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use oncepay_http::ops_http::{self, OpsState};
use oncepay_provider::ConfiguredProvider;
use oncepay_service::runner::{self, Pass};
use oncepay_store::db;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backlog::Sampler;
use crate::poller::{Poller, PollerConfig};
use crate::reaper::{Reaper, ReaperConfig};
use crate::recon::{QueuedRuns, Reconciliation};
use crate::refunds::poller::RefundPoller;
use crate::settings::Settings;
use crate::sweeper::{Sweeper, SweeperConfig};
use crate::webhooks::WebhookState;
use oncepay_ops::operators::{self, api::OperatorsState};

/// Runs the service until `shutdown` is cancelled, then stops the server gracefully (in-flight
/// deliveries finish) and waits for every loop to finish its current pass.
pub async fn serve(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<()> {
    let metrics = oncepay_service::metrics::install();
    crate::metrics::describe();
    let options = db::connect_options(&settings.database, "oncepay-reconciler").context("database.url is invalid")?;
    let pool = db::pool(&settings.database, options);
    let provider = ConfiguredProvider::new(&settings.provider).context("cannot build the provider client")?;
    let key_window = settings.key_window();

    let secrets = settings.webhooks.serving_secrets(settings.provider.kind)?;
    let webhook = WebhookState {
        pool: pool.clone(),
        secrets: secrets.simulator,
        stripe_secrets: secrets.stripe,
        tolerance_secs: settings.webhooks.tolerance_secs,
        max_body_bytes: settings.webhooks.max_body_bytes,
    };
    let ops = OpsState { pool: pool.clone(), metrics };
    let host = settings.http.host.as_str();
    let listener = TcpListener::bind((host, settings.http.port))
        .with_context(|| format!("cannot listen on {host}:{}", settings.http.port))?;
    let address = listener.local_addr().context("cannot read the bound address")?;
    let workers = std::thread::available_parallelism().map_or(1, NonZeroUsize::get).min(4);
    let apart = ops_http::serve_apart(host, settings.http.ops_port, || ops.clone())?;
    if let Some(apart) = &apart {
        tracing::info!(http.address = %apart.address, "reconciler operations endpoints listening");
    }
    let public_ops = apart.is_none().then_some(ops);
    let server = crate::http::server(listener, webhook, public_ops, workers).context("cannot start the HTTP server")?;
    let server_handle = server.handle();
    let operations = match settings.operators.port {
        Some(port) => {
            let listener = TcpListener::bind((host, port))
                .with_context(|| format!("cannot listen for the operations API on {host}:{port}"))?;
            let address = listener.local_addr().context("cannot read the bound address")?;
            let state = OperatorsState {
                pool: pool.clone(),
                provider: settings.provider.clone(),
                resend_horizon: key_window.resend_horizon(),
                proposal_ttl: Duration::from_secs(settings.operators.proposal_ttl_secs),
                token_ttl: settings.operators.token_ttl(),
                max_token_ttl: settings.operators.max_token_ttl(),
                retries_need_approval: settings.operators.retries_need_approval,
                sessions: settings.operators.session_policy(),
                hashing: operators::passwords::Hashing::new(settings.operators.max_concurrent_password_hashes),
                enrollment_ttl: settings.operators.enrollment_ttl(),
                fresh_sign_in: Duration::from_secs(settings.operators.fresh_sign_in_secs),
                oidc: match &settings.operators.oidc {
                    Some(oidc) => Some(Arc::new(
                        operators::oidc::Oidc::new(oidc.clone()).context("cannot build the OpenID client")?,
                    )),
                    None => None,
                },
            };
            let bulk_retrier = operators::api::BulkRetrier::new(state.clone());
            let server = crate::http::operator_api(listener, state, workers.min(2))
                .context("cannot start the operations API")?;
            tracing::info!(http.address = %address, "operations API listening");
            Some((server, bulk_retrier))
        }
        None => None,
    };
    let (operations, bulk_retrier) = operations.unzip();
    let operations_handle = operations.as_ref().map(actix_web::dev::Server::handle);
    let operations_running = operations.map(tokio::spawn);
    let ops_handle = apart.as_ref().map(|apart| apart.server.handle());
    let ops_running = apart.map(|apart| tokio::spawn(apart.server));
    tracing::info!(http.address = %address, "reconciler listening");

    let p = &settings.poller;
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
    // Unknown refunds are looked up by a loop of their own, with the same limits: a backlog of one
    // kind never holds the other back.
    let refund_poller = RefundPoller::new(pool.clone(), provider.clone(), poller_config.clone());
    let poller = Poller::new(pool.clone(), provider.clone(), poller_config);
    let sweeper = Sweeper::new(
        pool.clone(),
        SweeperConfig {
            interval: Duration::from_millis(settings.sweeper.interval_ms),
            batch_size: settings.sweeper.batch_size,
            key_window,
        },
    );
    let reaper = Reaper::new(
        pool.clone(),
        ReaperConfig {
            interval: Duration::from_millis(settings.reaper.interval_ms),
            batch_size: settings.reaper.batch_size,
            webhook_retention: Duration::from_secs(settings.reaper.webhook_retention_secs),
        },
    );
    let recon = Arc::new(Reconciliation::new(pool.clone(), provider, settings.recon_config()));
    let backlog = Sampler::new(pool.clone(), Duration::from_millis(settings.backlog.interval_ms));

    let mut loops: JoinSet<anyhow::Result<()>> = JoinSet::new();
    spawn(&mut loops, poller, &shutdown);
    spawn(&mut loops, refund_poller, &shutdown);
    spawn(&mut loops, sweeper, &shutdown);
    spawn(&mut loops, reaper, &shutdown);
    spawn(&mut loops, backlog, &shutdown);
    spawn(&mut loops, QueuedRuns(Arc::clone(&recon)), &shutdown);
    if let Some(bulk_retrier) = bulk_retrier {
        spawn(&mut loops, bulk_retrier, &shutdown);
    }
    let token = shutdown.clone();
    loops.spawn(async move {
        let scheduled = recon.run(token.clone()).await;
        if scheduled.is_err() {
            // Without it the service is not doing its job: stop everything and exit non-zero.
            token.cancel();
        }
        scheduled.context("the nightly reconciliation cannot run")
    });
    let stopper = shutdown.clone();
    loops.spawn(async move {
        stopper.cancelled().await;
        server_handle.stop(true).await;
        if let Some(operations) = operations_handle {
            operations.stop(true).await;
        }
        Ok(())
    });

    let mut ended = server.await.context("the HTTP server failed");
    // The server may also end on its own (an I/O failure): take the loops down with it.
    shutdown.cancel();
    while let Some(joined) = loops.join_next().await {
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
    if let Some(running) = operations_running {
        let stopped = running
            .await
            .context("the operations API panicked")
            .and_then(|served| served.context("the operations API failed"));
        if let (Err(error), true) = (stopped, ended.is_ok()) {
            ended = Err(error);
        }
    }
    // The probes keep responding until the public server and the loops have stopped.
    if let (Some(ops_handle), Some(ops_running)) = (ops_handle, ops_running) {
        ops_handle.stop(true).await;
        let stopped = ops_running
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

/// Runs a background loop in `loops` until `shutdown`.
fn spawn<P: Pass + Send + 'static>(loops: &mut JoinSet<anyhow::Result<()>>, pass: P, shutdown: &CancellationToken) {
    let shutdown = shutdown.clone();
    loops.spawn(async move {
        runner::run(&pass, crate::metrics::LOOP_ERRORS, shutdown).await;
        Ok(())
    });
}
