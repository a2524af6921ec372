//! Wiring the worker process together: the provider client, the pool, the drainer, the event
//! sender and the operations endpoints (`/healthz`, `/readyz`, `/metrics` on the `[http]` port), run
//! until shutdown. No logic of its own.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use oncepay_http::probes::{self, ProbeState};
use oncepay_provider::ConfiguredProvider;
use oncepay_store::connections::Connections;
use oncepay_store::db;
use tokio_util::sync::CancellationToken;

use crate::drainer::{Counts, Drainer};
use crate::events::EventSender;
use crate::events::exchange::Publisher;
use crate::events::http::Sender;
use crate::refunds::RefundSender;
use crate::settings::Settings;

/// The name the worker gives its database connections and its traces.
pub const SERVICE: &str = "oncepay-worker";

/// A worker, built and bound, not yet running.
pub struct App {
    listener: std::net::TcpListener,
    drainer: Drainer<ConfiguredProvider>,
    refunds: RefundSender<ConfiguredProvider>,
    events: EventSender,
    ops: ProbeState,
}

impl App {
    /// Builds everything from `settings` and binds the operations port, so a test can ask for port 0
    /// and read the real one. The pool connects lazily: the process starts, and serves `/healthz`,
    /// while PostgreSQL is down, and `/readyz` says so.
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        let metrics = oncepay_service::metrics::install();
        crate::metrics::describe();
        let options = db::connect_options(&settings.database, SERVICE).context("reading database.url")?;
        let pool = db::pool(&settings.database, options);
        let provider = ConfiguredProvider::new(&settings.provider).context("building the provider client")?;
        let refunds = RefundSender::new(pool.clone(), provider.clone(), settings.drainer_config());
        let timeout = Duration::from_millis(settings.events.timeout_ms);
        let sender =
            Sender::new(timeout, settings.events.policy()).context("building the client events are delivered with")?;
        let publisher = Publisher::new(settings.events.broker_url.clone(), timeout);
        let connections = Arc::new(Connections::like(&pool));
        let events = EventSender::new(connections, sender, publisher, settings.event_sender_config());
        let drainer = Drainer::handing_events_to(pool.clone(), provider, settings.drainer_config(), &events);
        let address = (settings.http.host.as_str(), settings.http.port);
        let listener = std::net::TcpListener::bind(address)
            .with_context(|| format!("binding the operations port {}:{}", address.0, address.1))?;
        Ok(Self { listener, drainer, refunds, events, ops: ProbeState { pool, metrics } })
    }

    /// The operations port actually bound.
    pub fn port(&self) -> anyhow::Result<u16> {
        Ok(self.listener.local_addr()?.port())
    }

    /// The drainer this process runs.
    pub fn drainer(&self) -> &Drainer<ConfiguredProvider> {
        &self.drainer
    }

    /// Serves the operations endpoints and drains the outbox and the refund outbox until `shutdown`;
    /// returns once the sends in flight are recorded (or the grace period is over).
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<Counts> {
        let server = probes::server(self.listener, self.ops.clone()).context("serving the operations endpoints")?;
        let server_handle = server.handle();
        let server = tokio::spawn(server);

        let refunds = self.refunds.clone();
        let refunds = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { refunds.run(shutdown).await }
        });
        let events = tokio::spawn(self.events.run(shutdown.clone()));
        let counts = self.drainer.run(shutdown).await;
        refunds.await.context("the refund sender panicked")?;
        events.await.context("the event sender panicked")?;

        server_handle.stop(true).await;
        server.await.context("the operations server panicked")?.context("the operations server failed")?;
        self.ops.pool.close().await;
        Ok(counts)
    }
}
