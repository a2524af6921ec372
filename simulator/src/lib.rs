//! A payment provider simulator with fault injection: the ground truth for tests.
//!
//! It speaks the provider protocol (`oncepay_provider::wire`), keeps a [`ledger`] of every charge
//! and refund it made, remembers [`idempotency`] keys for a configurable window, sends signed
//! Standard Webhooks events ([`webhooks`]), and injects every fault of the contract on demand
//! ([`faults`], drawn from the one seeded random source, [`dice`]). [`Simulator::start`] runs it in-process
//! (tests, on port 0); the `oncepay-simulator` binary runs it as a process. Tests drive it through
//! `/_sim` ([`control`], [`client`]).

pub mod client;
pub mod clock;
pub mod config;
pub mod control;
pub mod dice;
pub mod faults;
pub mod idempotency;
pub mod ledger;
pub mod provider;
pub mod routes;
pub mod server;
pub mod webhooks;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rand::Rng;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use crate::config::{Settings, parse_webhook_url};
use crate::dice::Dice;
use crate::faults::SharedFaults;
use crate::provider::Provider;
use crate::routes::App;
use crate::webhooks::{DeliveryPolicy, Destination};

/// A running simulator. Dropping it shuts it down (without waiting).
pub struct Simulator {
    addr: SocketAddr,
    seed: u64,
    shutdown: CancellationToken,
    _stop_on_drop: DropGuard,
    running: JoinHandle<()>,
}

impl Simulator {
    /// Binds `settings.http`, starts serving and delivering webhooks, and runs until `shutdown` is
    /// cancelled (or [`Simulator::stop`]).
    pub async fn start(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<Self> {
        let settings = settings.validate()?;
        let sim = settings.simulator;
        let seed = sim.seed.unwrap_or_else(|| rand::rng().random());
        let dice = Dice::seeded(seed);
        let faults = SharedFaults::new(settings.faults);
        let webhook_url = sim.webhook_url.as_deref().map(parse_webhook_url).transpose().map_err(anyhow::Error::msg)?;
        let destination = Destination::new(webhook_url);
        let policy = DeliveryPolicy {
            secret: sim.webhook_secret,
            max_attempts: sim.webhook_max_attempts,
            timeout: Duration::from_millis(sim.webhook_timeout_ms),
            backoff: sim.webhook_backoff,
        };
        let (notifier, dispatcher) = webhooks::channel(destination.clone(), faults.clone(), dice.clone(), policy)
            .context("cannot build the webhook client")?;
        let provider =
            Provider::new(Duration::from_secs(sim.key_window_secs), faults.clone(), dice, notifier, shutdown.clone());
        let app = Arc::new(App {
            provider: Arc::new(provider),
            faults,
            destination,
            api_key: sim.api_key,
            metrics: oncepay_service::metrics::install(),
            work: TaskTracker::new(),
            shutdown: shutdown.clone(),
        });

        let listener = TcpListener::bind((settings.http.host.as_str(), settings.http.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", settings.http.host, settings.http.port))?;
        let addr = listener.local_addr().context("the listener has no address")?;
        let grace = Duration::from_millis(sim.shutdown_grace_ms);
        let running = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                tokio::join!(server::serve(listener, app, grace), dispatcher.run(shutdown));
            }
        });
        tracing::info!(http.addr = %addr, simulator.seed = seed, "provider simulator listening");
        Ok(Self { addr, seed, _stop_on_drop: shutdown.clone().drop_guard(), shutdown, running })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, the base URL of the protocol and of `/_sim`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The seed of this run's random source.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Waits until the simulator has shut down (its `shutdown` token was cancelled and it drained).
    pub async fn finished(self) -> anyhow::Result<()> {
        let Self { running, _stop_on_drop, .. } = self;
        let result = running.await.context("the simulator task failed");
        drop(_stop_on_drop);
        result
    }

    /// Shuts down and waits until it is done.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.finished().await
    }
}
