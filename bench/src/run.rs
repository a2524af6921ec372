//! A whole run, in order, on one throwaway PostgreSQL or on a throwaway Citus cluster (a
//! coordinator and two worker nodes on this machine), durable either way (`fsync` and
//! `synchronous_commit` on, as in issue #8's reference figures): the setup, then every [`Phase`]
//! asked for, each raw baseline next to the service measurement compared with it. Raw baselines and
//! services alike connect to the coordinator, and PostgreSQL's CPU time is that of every node.
//!
//! The run stops at the first failure: a figure measured after something went wrong is not one to
//! keep.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use oncepay_devkit::pg::Durability;
use oncepay_devkit::process::setting_variable;
use oncepay_devkit::rabbitmq::Node;
use oncepay_devkit::server::{self, Server};
use oncepay_domain::api_key;
use oncepay_store::broker_users;
use oncepay_store::merchant_endpoints::{self, EndpointChange, NewEndpoint};
use oncepay_webhook_signature::WebhookSecret;
use secrecy::ExposeSecret;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection as _, PgPool};
use tokio::time::Instant;

use crate::broker::{self, Batches, Consuming, Producer, Queues};
use crate::closed_loop::Window;
use crate::console::{self, Probes, Read};
use crate::cpu::{ClientSource, CpuSampler, CpuUsage, Role};
use crate::dataset::{self, ReplaySet, Tenant};
use crate::loadgen::Workload;
use crate::machine::Machine;
use crate::measure::{self, Start, Target, Timing};
use crate::raw::{self, Baseline};
use crate::receiver::Receiver;
use crate::report::{Comparison, FORMAT_VERSION, Kind, Measure, Report, Row};
use crate::services::{Launcher, Service};
use crate::webhooks::{self, Load as WebhookLoad};

/// How long and how big.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// A smoke run: short windows, small backlogs.
    Quick,
    /// The figures to keep.
    Standard,
    /// Standard plus the 10-million-key history comparison and the console with a million payments.
    Full,
}

impl Profile {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Quick => "quick",
            Self::Standard => "standard",
            Self::Full => "full",
        }
    }

    fn timing(self) -> Timing {
        match self {
            Self::Quick => Timing { warmup: Duration::from_secs(1), window: Duration::from_secs(3) },
            Self::Standard | Self::Full => Timing { warmup: Duration::from_secs(3), window: Duration::from_secs(10) },
        }
    }

    /// Pending payments queued before each drain measurement: more than a drain takes in a warm-up
    /// and a window (a drain that empties nine tenths of it ends its window early).
    fn backlog(self) -> u64 {
        match self {
            Self::Quick => 20_000,
            Self::Standard | Self::Full => 100_000,
        }
    }

    /// Messages of each broker measurement: a warm-up batch, then the measured one, long enough
    /// that its first and last moments weigh little in its rate.
    fn broker_batches(self) -> Batches {
        match self {
            Self::Quick => Batches { warmup: 1_000, measured: 10_000 },
            Self::Standard | Self::Full => Batches { warmup: 5_000, measured: 50_000 },
        }
    }

    /// The histories the console's reads are compared over: payments in each database, and the
    /// report's name for it. The are a hundredfold apart; so are the smoke run's.
    fn console_histories(self) -> [(u64, &'static str); 2] {
        match self {
            Self::Quick => [(1_000, "1k payments"), (100_000, "100k payments")],
            Self::Standard | Self::Full => [(10_000, "10k payments"), (1_000_000, "1M payments")],
        }
    }
}

/// Which parts of a run to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Phase {
    /// Accepts with fresh keys, raw and service, at 1 and 8 connections, then at 32 and 64.
    Accept,
    /// Replays of stored keys, raw and service, at 1 and 8 connections.
    Replay,
    /// Two api processes.
    Scale,
    /// The worker's claim+finish raw, and 1 and 2 workers draining a backlog.
    Drain,
    /// Accepts while workers drain.
    Mixed,
    /// 10 thousand versus 10 million stored keys.
    History,
    /// Accepts by a real tenant with and without a flood of unknown API keys.
    Flood,
    /// The reconciler's webhook endpoint: genuine deliveries and forged ones with many signatures.
    Webhook,
    /// Refunds of succeeded payments, raw and service, at 1 and 8 connections.
    Refund,
    /// The operator console's reads with 10 thousand and with 1 million payments.
    Console,
    /// Payments from RabbitMQ, against the node's own ceiling and the same api's HTTP accepts from
    /// 64 clients.
    Broker,
    /// Accepts from 64 clients while a worker drains and delivers events to an endpoint in this
    /// process, against the same with no endpoint.
    Events,
}

/// What the run was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long and how big.
    pub profile: Profile,
    /// The phases to run (all when empty; `history`, `console`, `broker` and `events` only with the
    /// full profile or when named).
    pub phases: Vec<Phase>,
    /// A note kept in the report.
    pub label: Option<String>,
    /// Extra environment for every api process.
    pub api_env: Vec<(String, String)>,
    /// Extra environment for every worker process.
    pub worker_env: Vec<(String, String)>,
    /// Where the processes' logs go.
    pub log_dir: PathBuf,
    /// The command line, for the report.
    pub command: Vec<String>,
    /// The commit, if known.
    pub git_commit: Option<String>,
    /// How long the events phase's provider takes over each payment.
    pub events_provider_ms: u64,
    /// What was done about other work on the machine (the run's scheduling priority).
    pub priority: String,
}

impl Options {
    fn runs(&self, phase: Phase) -> bool {
        if self.phases.is_empty() {
            !matches!(phase, Phase::History | Phase::Console | Phase::Broker | Phase::Events)
                || self.profile == Profile::Full
        } else {
            self.phases.contains(&phase)
        }
    }
}

/// Requests per statement of the grouped accept baselines, run at 8 connections: the most the api's
/// groups hold at 8 connections (one request per connection), and its default largest group. The
/// first is also run at 1 connection.
const ACCEPT_GROUPS: [u32; 2] = [8, 64];

/// Connections of the accepts beyond the standard 1 and 8, where more requests wait for each write.
const MANY_CONNECTIONS: [u32; 2] = [32, 64];

/// Stored keys (settled payments) the replays pick from in the main database.
const STORED_KEYS: u64 = 10_000;

/// Connections of the events phase's accepts, as issue 49 asks.
const EVENTS_CONNECTIONS: u32 = 64;

/// Whether the tenant's endpoint is enabled in each of the events phase's windows, in order: each
/// round disabled, enabled, enabled, disabled, so that a drift over a round weighs on both settings
/// alike. Two rounds: windows without an endpoint varied by 30 % within one round (BENCHMARKS.md).
const EVENTS_ROUND: [bool; 4] = [false, true, true, false];

/// Rounds of [`EVENTS_ROUND`] the events phase measures.
const EVENTS_ROUNDS: usize = 2;

/// The least accepts with an endpoint may be of accepts without, as issue 49 asks.
const EVENTS_TARGET: f64 = 0.9;

/// Deliveries the events phase's worker may have in flight to one endpoint: its default
/// `events.max_in_flight`.
const EVENTS_PER_ENDPOINT: &str = "64";

/// The histories compared for growth: stored keys in each database.
const HISTORIES: [(u64, &str); 2] = [(10_000, "10k keys"), (10_000_000, "10M keys")];

/// How many distinct stored keys replays pick from, in every database: all of a short history, the
/// same number spread over a long one, so that only the history differs between the two.
const REPLAYED_KEYS: u64 = 10_000;

/// Connections of the refunds, raw and through the api.
const REFUND_CONNECTIONS: [u32; 2] = [1, 8];

/// Payments refunded before the run, in the main database when refunds are measured.
const REFUNDED_PAYMENTS: u64 = 10_000;

/// Succeeded payments each refund window picks from, at random: few enough that the warm-up writes
/// every page they are on, many enough that two refunds in flight are rarely of one payment.
const REFUNDABLE_PER_WINDOW: u64 = 1_000;

/// The api setting, by name, for a process that reads every replay from the database.
const NO_REPLAY_CACHE: (&str, &str) = ("intake.replay_cache_bytes", "0");

/// The broker user the broker phase publishes as, mapped to a tenant of its own.
const BROKER_PRODUCER: &str = "bench-orders";

/// The most a console read may cost with the long history, as a multiple of its median latency
/// with the short one.
const CONSOLE_GROWTH: f64 = 1.5;

/// A database of the run, with its tenant.
struct Database {
    name: String,
    url: String,
    pool: PgPool,
    tenant: Tenant,
    /// The keys replays pick from.
    replays: ReplaySet,
    variables: Vec<(String, String)>,
    label: String,
}

impl Database {
    /// Creates, migrates and fills a database with `stored_keys` settled payments.
    async fn create(server: &Server, name: &str, label: &str, stored_keys: u64) -> anyhow::Result<Self> {
        server.create_database(name).await?;
        let url = server.url(name);
        let pool = PgPoolOptions::new().max_connections(4).connect(&url).await?;
        oncepay_store::db::migrate(&pool).await.context("migrating")?;
        let mut conn = pool.acquire().await?;
        let tenant = Tenant::create(&mut conn, "bench").await?;
        let started = Instant::now();
        dataset::load_settled(&mut conn, tenant.id, 0, stored_keys, name).await?;
        dataset::settle_database(&mut conn).await?;
        eprintln!("bench: {name}: {stored_keys} settled payments loaded in {:.0?}", started.elapsed());
        let replays = ReplaySet::spread(REPLAYED_KEYS, stored_keys);
        let variables = raw::variables(&tenant, replays)?;
        drop(conn);
        Ok(Self { name: name.to_owned(), url, pool, tenant, replays, variables, label: label.to_owned() })
    }

    fn target<'a>(&'a self, server: &Server, postmasters: &'a [i32]) -> Target<'a> {
        Target {
            pool: &self.pool,
            port: server.front().port(),
            database: &self.name,
            dataset: &self.label,
            postmasters,
        }
    }

    /// Drops whatever is queued: the payments accepted by earlier phases stay `pending` forever
    /// (benchmark data), and the next phase starts from a queue of known size.
    async fn clear_outbox(&self) -> anyhow::Result<()> {
        let mut conn = self.pool.acquire().await?;
        sqlx::raw_sql("TRUNCATE outbox").execute(&mut *conn).await?;
        Ok(())
    }

    /// Drops the deliveries the window before left pending, so that the next window delivers none
    /// of them, and vacuums what the windows before wrote, so that none of it (dead rows, stale
    /// statistics, an autovacuum due) falls into the next window. The events and the deliveries
    /// made stay, as a deployment keeps them: emptied, they had each window's fresh worker plan its
    /// statements over them for tables with no rows (BENCHMARKS.md, "Plans made on an empty
    /// outbox"). Not the emptied outbox: in the one run that vacuumed it too, before migration 0540,
    /// the windows after a vacuum of the empty outbox finished a fifth as many payments as the
    /// others.
    async fn tidy_between_windows(&self) -> anyhow::Result<()> {
        let mut conn = self.pool.acquire().await?;
        sqlx::raw_sql("DELETE FROM merchant_deliveries WHERE state = 'pending'").execute(&mut *conn).await?;
        sqlx::raw_sql(
            "VACUUM (ANALYZE) payments, payment_events, idempotency_keys, merchant_events, merchant_deliveries,
                              merchant_delivery_attempts",
        )
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Tops the outbox up to `backlog` pending payments.
    async fn ensure_backlog(&self, backlog: u64, salt: &str) -> anyhow::Result<()> {
        let mut conn = self.pool.acquire().await?;
        let depth = dataset::outbox_depth(&mut conn).await?;
        if depth < backlog {
            let started = Instant::now();
            dataset::load_backlog(&mut conn, self.tenant.id, backlog - depth, salt).await?;
            sqlx::raw_sql("VACUUM (ANALYZE) outbox, payments").execute(&mut *conn).await?;
            eprintln!("bench: queued {} pending payments in {:.0?}", backlog - depth, started.elapsed());
        }
        Ok(())
    }
}

/// Everything a run holds while it runs.
struct Bench<'a> {
    options: &'a Options,
    timing: Timing,
    server: Server,
    /// The postmaster of every node.
    postmasters: Vec<i32>,
    pgbench: PathBuf,
    launcher: Launcher,
    rows: Vec<Row>,
}

/// Runs the benchmark. A run that fails after the setup still returns what it measured, with the
/// failure in [`Report::error`].
pub async fn run(options: &Options, kind: server::Kind) -> anyhow::Result<Report> {
    let started_at = time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339)?;
    let timing = options.profile.timing();
    std::fs::create_dir_all(&options.log_dir)?;
    let server = Server::start(kind, Durability::Durable).await.context("cannot start PostgreSQL")?;
    eprintln!("bench: {} on port {}, logs in {}", server.describe(), server.front().port(), options.log_dir.display());
    let main = Database::create(&server, "oncepay", "main", STORED_KEYS).await?;
    let machine = Machine::describe(&mut *main.pool.acquire().await?).await?;
    let postmasters = postmasters(&server).await?;
    let mut bench = Bench {
        options,
        timing,
        server,
        postmasters,
        pgbench: crate::pgbench::locate().await,
        launcher: Launcher::new(&options.log_dir, options.api_env.clone(), options.worker_env.clone())?,
        rows: Vec::new(),
    };

    let result = bench.phases(&main).await;
    let report = Report {
        format_version: FORMAT_VERSION,
        started_at,
        profile: options.profile.name().into(),
        label: options.label.clone(),
        server: bench.server.describe(),
        command: options.command.clone(),
        git_commit: options.git_commit.clone(),
        priority: options.priority.clone(),
        warmup_seconds: timing.warmup.as_secs_f64(),
        window_seconds: timing.window.as_secs_f64(),
        api_env: options.api_env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        worker_env: options.worker_env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        machine,
        error: result.err().map(|error| format!("{error:#}")),
        targets: if kind == server::Kind::Single { crate::targets::check(&bench.rows) } else { Vec::new() },
        rows: bench.rows,
        against_single: Vec::new(),
    };
    main.pool.close().await;
    Ok(report)
}

impl Bench<'_> {
    async fn phases(&mut self, main: &Database) -> anyhow::Result<()> {
        let simulator = self.launcher.simulator("simulator", 0).await?;
        let needs_api = [Phase::Accept, Phase::Replay, Phase::Mixed, Phase::Flood, Phase::Refund, Phase::Events]
            .iter()
            .any(|p| self.options.runs(*p));
        let api = if needs_api { Some(self.launcher.api("api", &main.url, &[]).await?) } else { None };
        let addresses: Vec<SocketAddr> = api.iter().map(Service::address).collect();
        let uncached = if self.options.runs(Phase::Replay) {
            Some(self.launcher.api("api-uncached", &main.url, &[(NO_REPLAY_CACHE.0, NO_REPLAY_CACHE.1.into())]).await?)
        } else {
            None
        };
        let uncached_addresses: Vec<SocketAddr> = uncached.iter().map(Service::address).collect();

        for connections in [1, 8] {
            if self.options.runs(Phase::Accept) {
                self.accepts(main, &addresses, connections).await?;
            }
            if self.options.runs(Phase::Replay) {
                self.replays(main, &addresses, &uncached_addresses, connections).await?;
            }
        }
        if self.options.runs(Phase::Accept) {
            for connections in MANY_CONNECTIONS {
                self.accepts_from_many(main, &addresses, connections).await?;
            }
        }
        if let Some(uncached) = uncached {
            uncached.stop().await?;
        }
        if self.options.runs(Phase::Scale) {
            self.scale(main).await?;
        }
        if self.options.runs(Phase::Drain) {
            self.drains(main, &simulator).await?;
        }
        if self.options.runs(Phase::Mixed) {
            self.mixed(main, &addresses, &simulator).await?;
        }
        if self.options.runs(Phase::Flood) {
            self.flood(main, &addresses).await?;
        }
        if self.options.runs(Phase::Webhook) {
            self.webhooks(main).await?;
        }
        if self.options.runs(Phase::Broker) {
            self.broker(main).await?;
        }
        if self.options.runs(Phase::Events) {
            self.events(main, &addresses).await?;
        }
        // The last phase on the main database: its payments, and its refunds left pending (no
        // worker sends them), are in no other phase's data.
        if self.options.runs(Phase::Refund) {
            self.refunds(main, &addresses).await?;
        }
        if let Some(api) = api {
            api.stop().await?;
        }
        if self.options.runs(Phase::History) {
            self.history().await?;
        }
        if self.options.runs(Phase::Console) {
            self.console().await?;
        }
        simulator.stop().await
    }

    fn target<'d>(&'d self, database: &'d Database) -> Target<'d> {
        database.target(&self.server, &self.postmasters)
    }

    async fn raw(&mut self, database: &Database, baseline: Baseline, clients: u32) -> anyhow::Result<usize> {
        self.raw_with(database, baseline, clients, &database.variables).await
    }

    /// [`Bench::raw`] with `variables` instead of the database's usual ones.
    async fn raw_with(
        &mut self,
        database: &Database,
        baseline: Baseline,
        clients: u32,
        variables: &[(String, String)],
    ) -> anyhow::Result<usize> {
        eprintln!("bench: raw {} ×{clients} [{}]", baseline.name(), database.label);
        let target = self.target(database);
        let row = measure::raw(&target, self.timing, &self.pgbench, baseline, clients, variables).await?;
        Ok(self.push(row))
    }

    /// Raw replays at 8 connections picking from `replays` instead of the database's usual keys;
    /// the row's dataset is `dataset`.
    async fn raw_replays(&mut self, database: &Database, replays: ReplaySet, dataset: &str) -> anyhow::Result<usize> {
        eprintln!("bench: raw {} ×8 [{dataset}]", Baseline::Replay.name());
        let variables = raw::variables(&database.tenant, replays)?;
        let target = Target { dataset, ..self.target(database) };
        let row = measure::raw(&target, self.timing, &self.pgbench, Baseline::Replay, 8, &variables).await?;
        Ok(self.push(row))
    }

    fn push(&mut self, row: Row) -> usize {
        eprintln!(
            "bench:   {:.0}/s{}",
            row.rate,
            row.latency.map_or(String::new(), |l| format!(", p50 {:.2} ms, p99 {:.2} ms", l.p50_ms, l.p99_ms))
        );
        self.rows.push(row);
        self.rows.len() - 1
    }

    /// Pushes a service row compared with the row at `baseline`.
    fn push_compared(&mut self, mut row: Row, baseline: usize, target: Option<f64>) {
        row.comparison = Some(Comparison::new(row.rate, &self.rows[baseline], target));
        self.push(row);
    }

    async fn service(
        &mut self,
        database: &Database,
        api: &[SocketAddr],
        workload: Workload,
        connections: u32,
    ) -> anyhow::Result<Row> {
        eprintln!("bench: service {} ×{connections}, {} api [{}]", workload.name(), api.len(), database.label);
        let target = self.target(database);
        measure::service(&target, self.timing, api, &database.tenant.token, workload, connections as usize).await
    }

    /// Accepts against the raw statements: issue 20's target is twice the rate of one payment per
    /// transaction (`accept_sql`); issue 8's ratio to three plain inserts and the ratios to the grouped
    /// statement are in the row's extras.
    async fn accepts(&mut self, main: &Database, api: &[SocketAddr], connections: u32) -> anyhow::Result<()> {
        let three_inserts = self.raw(main, Baseline::ThreeInserts, connections).await?;
        let one_per_transaction = self.raw(main, Baseline::Accept, connections).await?;
        self.raw(main, Baseline::AcceptWithNotify, connections).await?;
        let mut grouped = Vec::new();
        if connections == 1 {
            // One group of 8 with nothing else running: its latency is the least time the requests of
            // 8 clients can take when all are written together.
            self.raw(main, Baseline::AcceptGroup(ACCEPT_GROUPS[0]), connections).await?;
        }
        if connections == 8 {
            for size in ACCEPT_GROUPS {
                grouped.push(self.raw(main, Baseline::AcceptGroup(size), connections).await?);
            }
        }
        let mut row = self.service(main, api, Workload::Accept, connections).await?;
        for baseline in std::iter::once(three_inserts).chain(grouped) {
            let baseline = &self.rows[baseline];
            let ratio = Comparison::new(row.rate, baseline, None).ratio;
            row.extra.insert(format!("ratio to {}", baseline.setup), ratio);
        }
        self.push_compared(row, one_per_transaction, (connections == 8).then_some(2.0));
        Ok(())
    }

    /// Accepts from more connections than the api has to its database, where more requests wait for
    /// each write: against one payment per transaction from as many pgbench connections.
    async fn accepts_from_many(&mut self, main: &Database, api: &[SocketAddr], connections: u32) -> anyhow::Result<()> {
        let one_per_transaction = self.raw(main, Baseline::Accept, connections).await?;
        let row = self.service(main, api, Workload::Accept, connections).await?;
        self.push_compared(row, one_per_transaction, None);
        Ok(())
    }

    /// Replays through the api as configured (final responses remembered after their first
    /// replay), and through an api that reads every replay from the database, against the raw read.
    async fn replays(
        &mut self,
        main: &Database,
        api: &[SocketAddr],
        uncached: &[SocketAddr],
        connections: u32,
    ) -> anyhow::Result<()> {
        let select = self.raw(main, Baseline::Replay, connections).await?;
        let workload = Workload::Replay(main.replays);
        let row = self.service(main, api, workload, connections).await?;
        self.push_compared(row, select, (connections == 8).then_some(0.5));
        let mut row = self.service(main, uncached, workload, connections).await?;
        row.setup.push_str(", no replay cache");
        self.push_compared(row, select, None);
        Ok(())
    }

    /// Refunds of succeeded payments through the api against the refund intake's statements from
    /// as many pgbench connections as HTTP connections (the api's pool holds 8). Each refunds one
    /// minor unit of a payment picked at random from [`REFUNDABLE_PER_WINDOW`], with a fresh key,
    /// beside [`REFUNDED_PAYMENTS`] refunded before the run, so that no window starts on empty
    /// refund tables.
    ///
    /// What a refund costs PostgreSQL depends on its payment's page: the first write of a page
    /// after a checkpoint logs the whole page, and a row on a full page moves, with new index
    /// entries. So each window has payments of its own, untouched since they were loaded, and few
    /// enough that its warm-up writes all their pages: the raw and the api windows measure the same
    /// steady state, whatever their rates.
    async fn refunds(&mut self, main: &Database, api: &[SocketAddr]) -> anyhow::Result<()> {
        let windows = 2 * REFUND_CONNECTIONS.len() as u64;
        let mut conn = main.pool.acquire().await?;
        let started = Instant::now();
        dataset::load_refunded(&mut conn, main.tenant.id, REFUNDED_PAYMENTS, "refunded").await?;
        let refundable = dataset::load_refundable(&mut conn, main.tenant.id, REFUNDABLE_PER_WINDOW * windows).await?;
        // Statistics, hint bits and a checkpoint: the first window does not pay for the load.
        dataset::settle_database(&mut conn).await?;
        drop(conn);
        eprintln!(
            "bench: {REFUNDED_PAYMENTS} refunded and {} refundable payments loaded in {:.0?}",
            refundable.count,
            started.elapsed()
        );
        for (n, connections) in (0..).zip(REFUND_CONNECTIONS) {
            let (raw_part, api_part) = (refundable.part(2 * n, windows), refundable.part(2 * n + 1, windows));
            let variables = [main.variables.clone(), raw::refund_variables(raw_part)?].concat();
            let baseline = self.raw_with(main, Baseline::Refund, connections, &variables).await?;
            let row = self.service(main, api, Workload::Refund(api_part), connections).await?;
            self.push_compared(row, baseline, None);
        }
        Ok(())
    }

    /// A real tenant's accepts at 4 connections, then the same while 16 more connections send
    /// made-up API keys: the tenant's rate and p99 against its own without the flood.
    async fn flood(&mut self, main: &Database, api: &[SocketAddr]) -> anyhow::Result<()> {
        let quiet = self.service(main, api, Workload::Accept, 4).await?;
        let quiet = self.push(quiet);
        eprintln!("bench: service accept ×4 during a flood of unknown API keys ×16 [{}]", main.label);
        let unknown = api_key::generate(main.tenant.id).token.expose_secret().to_owned();
        let target = self.target(main);
        let row = measure::service_under_flood(&target, self.timing, api, &main.tenant.token, &unknown, 4, 16).await?;
        self.push_compared(row, quiet, None);
        Ok(())
    }

    /// The reconciler's webhook endpoint: genuine deliveries, then forged ones with hundreds of
    /// signatures and a large body (against the genuine rate), then `/healthz` alone and while
    /// forged deliveries arrive (against its quiet rate).
    async fn webhooks(&mut self, main: &Database) -> anyhow::Result<()> {
        oncepay_service::tls::install_provider();
        let secret_text = WebhookSecret::generate();
        let secret = WebhookSecret::parse(&secret_text)?;
        let reconciler = self.launcher.reconciler("reconciler", &main.url, &secret_text, None).await?;
        let base = reconciler.base_url();
        let forged =
            format!("{} signatures, {} KiB body", webhooks::FORGED_SIGNATURES, webhooks::FORGED_BODY_BYTES / 1024);

        eprintln!("bench: webhooks genuine ×4");
        let genuine = self.webhook_window(&base, &secret, WebhookLoad::Genuine, 4, None).await?;
        let genuine = self.push(reconciler_row("webhook genuine", "signed, 1 reconciler", "main", 4, 200, genuine));
        eprintln!("bench: webhooks forged ×4 ({forged})");
        let window = self.webhook_window(&base, &secret, WebhookLoad::Forged, 4, None).await?;
        self.push_compared(reconciler_row("webhook forged", &forged, "main", 4, 401, window), genuine, None);

        eprintln!("bench: healthz ×1, quiet");
        let quiet = self.webhook_window(&base, &secret, WebhookLoad::Health, 1, None).await?;
        let quiet = self.push(reconciler_row("reconciler healthz", "quiet", "main", 1, 200, quiet));
        eprintln!("bench: healthz ×1 while forged webhooks ×4 arrive");
        let window = self.webhook_window(&base, &secret, WebhookLoad::Health, 1, Some(4)).await?;
        let setup = format!("during forged webhooks ×4 ({forged})");
        self.push_compared(reconciler_row("reconciler healthz", &setup, "main", 1, 200, window), quiet, None);
        reconciler.stop().await
    }

    /// One window of `load` at `connections`, with `forged` more connections of forged deliveries
    /// alongside, and the CPU it cost.
    async fn webhook_window(
        &self,
        base: &str,
        secret: &WebhookSecret,
        load: WebhookLoad,
        connections: usize,
        forged: Option<usize>,
    ) -> anyhow::Result<(Window, CpuUsage)> {
        let timing = self.timing;
        let background = async {
            match forged {
                Some(connections) => {
                    webhooks::closed_loop(base, secret, WebhookLoad::Forged, connections, timing).await.map(drop)
                }
                None => Ok(()),
            }
        };
        self.reconciler_window(webhooks::closed_loop(base, secret, load, connections, timing), background).await
    }

    /// One window of `load`, requests to a reconciler, with `background` load alongside, and the CPU
    /// it cost.
    async fn reconciler_window(
        &self,
        load: impl Future<Output = anyhow::Result<Window>>,
        background: impl Future<Output = anyhow::Result<()>>,
    ) -> anyhow::Result<(Window, CpuUsage)> {
        let timing = self.timing;
        let sampler = CpuSampler::new(&self.postmasters, ClientSource::Process);
        let cpu = async {
            tokio::time::sleep(timing.warmup).await;
            let from = sampler.sample();
            tokio::time::sleep(timing.window).await;
            sampler.sample().since(&from)
        };
        let (window, cpu, background) = tokio::join!(load, cpu, background);
        background?;
        Ok((window?, cpu))
    }

    /// Payments from RabbitMQ (issue 48), on a throwaway node: the node's own ceiling, then an api
    /// consuming its queue, then the same api's HTTP accepts from 64 clients. The producer publishes
    /// as a broker user of its own, mapped to a tenant of its own, whose payments are only the
    /// messages'. The ceiling's consumer has the api's prefetch.
    async fn broker(&mut self, main: &Database) -> anyhow::Result<()> {
        let node = Node::start().await.context("cannot start a RabbitMQ node")?;
        let password = uuid::Uuid::new_v4().simple().to_string();
        node.add_user(BROKER_PRODUCER, &password).await?;
        let mut conn = main.pool.acquire().await?;
        let tenant = Tenant::create(&mut conn, "bench-broker").await?;
        broker_users::map(&mut conn, BROKER_PRODUCER, tenant.id).await?;
        drop(conn);
        let prefetch = self.broker_prefetch()?;
        let queues = Queues::new();
        let api = self.launcher.api("api-broker", &main.url, &queues.api_settings(&node.url(), prefetch)).await?;
        let admin = lapin::Connection::connect(&node.url(), lapin::ConnectionProperties::default()).await?;
        broker::wait_for_queue(&admin, &queues.queue).await?;
        let producer = Producer::connect(&node.url_as(BROKER_PRODUCER, &password), BROKER_PRODUCER).await?;
        let batches = self.options.profile.broker_batches();
        let target = self.target(main);

        eprintln!("bench: RabbitMQ alone, {} messages, prefetch {prefetch}", batches.measured);
        let row = broker::ceiling(&target, &producer, &admin, prefetch, batches).await?;
        let ceiling = self.push(row);
        eprintln!("bench: payments from RabbitMQ, {} messages, prefetch {prefetch}", batches.measured);
        let target = self.target(main);
        let consuming = Consuming { api: api.address(), queues: &queues, prefetch, tenant: tenant.id };
        let row = broker::intake(&target, &producer, &admin, &consuming, batches).await?;
        self.push_compared(row, ceiling, Some(0.5));
        let from_broker = self.rows.len() - 1;
        let mut http = self.service(main, &[api.address()], Workload::Accept, 64).await?;
        http.setup = broker::HTTP_SETUP.into();
        let http = self.push(http);
        let ratio = Comparison::new(self.rows[from_broker].rate, &self.rows[http], None).ratio;
        let label = format!("ratio to {}", self.rows[http].label());
        self.rows[from_broker].extra.insert(label, ratio);

        drop(producer);
        let _ = admin.close(200, "the broker phase is over".into()).await;
        // The api first: without its node it would try to connect again until stopped.
        api.stop().await?;
        drop(node);
        Ok(())
    }

    /// The api's prefetch in the broker phase, which the ceiling's consumer shares: the run's
    /// override (`--api-env ONCEPAY_BROKER__PREFETCH=...`) if it has one, else the api's default.
    fn broker_prefetch(&self) -> anyhow::Result<u16> {
        let variable = setting_variable("broker.prefetch");
        match self.options.api_env.iter().find(|(key, _)| *key == variable) {
            Some((_, value)) => value.parse().with_context(|| format!("{variable}={value} is not a prefetch")),
            None => Ok(broker::DEFAULT_PREFETCH),
        }
    }

    /// Events to merchants (issue 49): accepts from [`EVENTS_CONNECTIONS`] clients while one worker
    /// drains, with the tenant's one endpoint (a [`Receiver`] in this process) disabled, then
    /// enabled, then enabled, then disabled again, so that each setting has an early and a late
    /// window, [`EVENTS_ROUNDS`] times. Each enabled window is compared with the disabled one next
    /// to it. Every window starts from an empty outbox, no events, a vacuum and a checkpoint, with a
    /// fresh worker, which finishes what it holds before the next.
    ///
    /// The worker sends to a simulator of its own that takes [`Options::events_provider_ms`] over
    /// each payment, as a real provider does. Then the worker's `max_in_flight`, not the CPU it wins
    /// from the clients, sets how many payments it finishes, and each setting's windows settle as
    /// many: what an endpoint adds is its deliveries alone.
    async fn events(&mut self, main: &Database, api: &[SocketAddr]) -> anyhow::Result<()> {
        let provider_ms = self.options.events_provider_ms;
        let simulator = self.launcher.simulator("simulator-events", provider_ms).await?;
        let receiver = Receiver::start()?;
        let url = receiver.url();
        let secret = WebhookSecret::generate();
        let new = NewEndpoint { url: &url, description: "bench receiver", event_types: &[], secret: &secret };
        let endpoint = merchant_endpoints::create(&mut *main.pool.acquire().await?, main.tenant.id, &new).await?;
        let events = EventsSetup { simulator: &simulator, receiver: &receiver, endpoint: endpoint.endpoint_id };
        // In every run so far, clients accepted 15 to 60 % more in the first window than in any
        // later one, with or without the endpoint: the tables it writes to had not grown yet.
        eprintln!("bench: a window to warm up the tables, not measured");
        self.events_window(main, api, &events, true).await?;
        let mut windows = Vec::new();
        for subscribed in EVENTS_ROUND.repeat(EVENTS_ROUNDS) {
            let row = self.events_window(main, api, &events, subscribed).await?;
            windows.push(self.push(row));
        }
        // Each subscribed window against the unsubscribed one next to it: in each round the first
        // pair, then the last.
        let pairs = windows.chunks(EVENTS_ROUND.len()).flat_map(|round| [(round[1], round[0]), (round[2], round[3])]);
        for (subscribed, unsubscribed) in pairs {
            let rate = self.rows[subscribed].rate;
            self.rows[subscribed].comparison =
                Some(Comparison::new(rate, &self.rows[unsubscribed], Some(EVENTS_TARGET)));
        }
        eprintln!("bench: the receiver took {} requests in all", receiver.received());
        simulator.stop().await
    }

    /// One window of the events phase: accepts while a fresh worker drains, with the endpoint
    /// enabled if `subscribed`, from an empty outbox and no delivery pending, after a checkpoint.
    async fn events_window(
        &mut self,
        main: &Database,
        api: &[SocketAddr],
        events: &EventsSetup<'_>,
        subscribed: bool,
    ) -> anyhow::Result<Row> {
        let change = EndpointChange { enabled: Some(subscribed), ..EndpointChange::default() };
        merchant_endpoints::update(&mut *main.pool.acquire().await?, main.tenant.id, events.endpoint, &change).await?;
        main.clear_outbox().await?;
        main.tidy_between_windows().await?;
        self.target(main).checkpoint().await?;
        let worker = self.launcher.worker(0, &main.url, events.simulator, &events_settings()).await?;
        let endpoints = if subscribed { "1 endpoint" } else { "no endpoint" };
        eprintln!("bench: service accept ×{EVENTS_CONNECTIONS} while 1 worker drains, {endpoints}");
        let target = self.target(main);
        let token = &main.tenant.token;
        let connections = EVENTS_CONNECTIONS as usize;
        let (mut row, wall) =
            measure::service_in_window(&target, self.timing, api, token, Workload::Accept, connections).await?;
        let mut conn = main.pool.acquire().await?;
        let finished = dataset::finished_between(&mut conn, wall).await?;
        let pending = dataset::pending_deliveries(&mut conn).await?;
        drop(conn);
        worker.stop().await?;
        let provider_ms = self.options.events_provider_ms;
        row.setup = format!("1 api + 1 worker, provider {provider_ms} ms, {endpoints}");
        row.extra.insert("finished_per_s".into(), finished as f64 / row.seconds);
        if subscribed {
            let delivered = events.receiver.received_between(wall.0.into(), wall.1.into());
            row.extra.insert("deliveries_per_s".into(), delivered as f64 / row.seconds);
            row.extra.insert("pending_deliveries_at_end".into(), pending as f64);
        }
        Ok(row)
    }

    /// Two api processes, each with half of the 8 connections' pool.
    async fn scale(&mut self, main: &Database) -> anyhow::Result<()> {
        let pool = [("database.max_connections", "4".to_owned())];
        let first = self.launcher.api("api-a", &main.url, &pool).await?;
        let second = self.launcher.api("api-b", &main.url, &pool).await?;
        let api = [first.address(), second.address()];
        let baseline = self.raw(main, Baseline::ThreeInserts, 8).await?;
        let row = self.service(main, &api, Workload::Accept, 8).await?;
        self.push_compared(row, baseline, None);
        let baseline = self.raw(main, Baseline::Replay, 8).await?;
        let row = self.service(main, &api, Workload::Replay(main.replays), 8).await?;
        self.push_compared(row, baseline, None);
        first.stop().await?;
        second.stop().await
    }

    async fn drains(&mut self, main: &Database, simulator: &Service) -> anyhow::Result<()> {
        let backlog = self.options.profile.backlog();
        main.clear_outbox().await?;
        let mut claim_finish = None;
        for clients in [1, 8] {
            main.ensure_backlog(backlog, &format!("raw-{clients}")).await?;
            claim_finish = Some(self.raw(main, Baseline::ClaimFinish, clients).await?);
            // pgbench stops between transactions, but a client cut short mid-script would leave its row
            // leased forever (no sweeper runs here) and the outbox never empty.
            let mut conn = main.pool.acquire().await?;
            sqlx::query!("DELETE FROM outbox WHERE locked_by = 'bench-raw'").execute(&mut *conn).await?;
        }
        for workers in [1, 2] {
            main.ensure_backlog(backlog, &format!("drain-{workers}")).await?;
            self.target(main).checkpoint().await?;
            eprintln!("bench: service drain, {workers} worker(s)");
            let started = Instant::now();
            let mut running = Vec::new();
            for n in 0..workers {
                running.push(self.launcher.worker(n, &main.url, simulator, &[]).await?);
            }
            let row = measure::drain(&self.target(main), self.timing, workers, started).await?;
            for worker in running {
                worker.stop().await?;
            }
            match claim_finish {
                Some(baseline) => self.push_compared(row, baseline, None),
                None => {
                    self.push(row);
                }
            }
        }
        Ok(())
    }

    /// Accepts at 8 connections while 1, then 2 workers drain: first from a backlog (do the workers
    /// drain faster than the api accepts?), then from an empty outbox (does it stay empty, and how
    /// long does a payment wait?).
    async fn mixed(&mut self, main: &Database, api: &[SocketAddr], simulator: &Service) -> anyhow::Result<()> {
        let backlog = self.options.profile.backlog();
        for workers in [1, 2] {
            for start in [Start::Backlog, Start::Empty] {
                main.clear_outbox().await?;
                if start == Start::Backlog {
                    main.ensure_backlog(backlog, &format!("mixed-{workers}")).await?;
                }
                let mut running = Vec::new();
                for n in 0..workers {
                    running.push(self.launcher.worker(n, &main.url, simulator, &[]).await?);
                }
                eprintln!("bench: service accept ×8 while {workers} worker(s) drain, {start:?}");
                let target = self.target(main);
                let mut row =
                    measure::accept_while_draining(&target, self.timing, api, &main.tenant.token, 8, workers, start)
                        .await?;
                let accept_rate = row.extra.get("accept_rate").copied().unwrap_or(0.0);
                row.comparison = Some(Comparison {
                    baseline: "accepts in the same window".into(),
                    baseline_rate: accept_rate,
                    of: Measure::Rate,
                    ratio: if accept_rate > 0.0 { row.rate / accept_rate } else { 0.0 },
                    // From empty, keeping up shows as 1.0 and no more: the target is the backlog's.
                    target: (start == Start::Backlog).then_some(1.0),
                });
                self.push(row);
                for worker in running {
                    worker.stop().await?;
                }
            }
        }
        Ok(())
    }

    /// Accepts and replays with 10 thousand and with 10 million stored keys, each database with
    /// its own api processes. Replays pick from the same number of keys in both ([`REPLAYED_KEYS`],
    /// spread over the whole history), through an api that remembers final responses and one that
    /// reads every replay from the database; the long history is also replayed over all its keys.
    async fn history(&mut self) -> anyhow::Result<()> {
        // The short history's rows; the long history's are compared with them.
        let mut short: Option<HistoryRows> = None;
        for (stored_keys, label) in HISTORIES {
            let name = format!("history_{stored_keys}");
            let database = Database::create(&self.server, &name, label, stored_keys).await?;
            let api = self.launcher.api(&format!("api-{name}"), &database.url, &[]).await?;
            let no_cache = [(NO_REPLAY_CACHE.0, NO_REPLAY_CACHE.1.to_owned())];
            let uncached = self.launcher.api(&format!("api-{name}-uncached"), &database.url, &no_cache).await?;
            let apis = HistoryApis { cached: [api.address()], uncached: [uncached.address()] };
            let run = self.measure_history(&database, &apis).await?;
            match &short {
                None => short = Some(self.push_history(run)),
                Some(short) => {
                    self.push_history_against(run, short);
                    self.replay_every_key(&database, &apis, stored_keys, label).await?;
                }
            }
            api.stop().await?;
            uncached.stop().await?;
            database.pool.close().await;
            self.server.front().psql("postgres", &format!("DROP DATABASE {name}")).await?;
        }
        Ok(())
    }

    /// Raw and service accepts and replays over one history. The raw rows are pushed as measured.
    async fn measure_history(&mut self, database: &Database, apis: &HistoryApis) -> anyhow::Result<HistoryRun> {
        let replays = Workload::Replay(database.replays);
        let raw_accept = self.raw(database, Baseline::Accept, 8).await?;
        let accept = self.service(database, &apis.cached, Workload::Accept, 8).await?;
        let raw_replay = self.raw(database, Baseline::Replay, 8).await?;
        let replay = self.service(database, &apis.cached, replays, 8).await?;
        let mut uncached = self.service(database, &apis.uncached, replays, 8).await?;
        uncached.setup.push_str(", no replay cache");
        Ok(HistoryRun { raw_accept, accept, raw_replay, replay, uncached })
    }

    /// Pushes the short history's rows as they are.
    fn push_history(&mut self, run: HistoryRun) -> HistoryRows {
        HistoryRows {
            raw_accept: run.raw_accept,
            accept: self.push(run.accept),
            raw_replay: run.raw_replay,
            replay: self.push(run.replay),
            uncached: self.push(run.uncached),
        }
    }

    /// Pushes the long history's rows, each against the same measurement over the short history:
    /// cost must not grow with history.
    fn push_history_against(&mut self, run: HistoryRun, short: &HistoryRows) {
        for (row, short_row) in [(run.raw_accept, short.raw_accept), (run.raw_replay, short.raw_replay)] {
            self.rows[row].comparison = Some(Comparison::new(self.rows[row].rate, &self.rows[short_row], None));
        }
        self.push_compared(run.accept, short.accept, Some(0.9));
        self.push_compared(run.replay, short.replay, Some(0.9));
        self.push_compared(run.uncached, short.uncached, Some(0.9));
    }

    /// Every one of a history's keys, each replayed about once: a different workload (most reads miss
    /// every cache), shown against its own raw read.
    async fn replay_every_key(
        &mut self,
        database: &Database,
        apis: &HistoryApis,
        stored_keys: u64,
        label: &str,
    ) -> anyhow::Result<()> {
        let every_key = format!("{label}, every key replayed");
        let all = ReplaySet::all(stored_keys);
        let raw_all = self.raw_replays(database, all, &every_key).await?;
        for (api, note) in [(&apis.cached, ""), (&apis.uncached, ", no replay cache")] {
            let mut row = self.service(database, api, Workload::Replay(all), 8).await?;
            row.dataset.clone_from(&every_key);
            row.setup.push_str(note);
            self.push_compared(row, raw_all, None);
        }
        Ok(())
    }

    /// The operator console's reads with a short and with a long history of payments, each in a
    /// database of its own, migrated and served by its own reconciler as an operator would run it,
    /// read with an admin's token. Each read is measured over the short history and at once over the
    /// long one, so that both windows see the same machine, and compared by median latency: with the
    /// long history it may cost at most [`CONSOLE_GROWTH`] times as much.
    async fn console(&mut self) -> anyhow::Result<()> {
        oncepay_service::tls::install_provider();
        let mut histories = Vec::new();
        for (payments, label) in self.options.profile.console_histories() {
            histories.push(self.console_history(payments, label).await?);
        }
        for read in Read::ALL {
            let mut short = None;
            for history in &histories {
                dataset::checkpoint(&mut *history.pool.acquire().await?).await?;
                eprintln!("bench: {read} ×1 [{}]", history.label);
                let load = console::closed_loop(&history.probes, read, self.timing);
                let window = self.reconciler_window(load, async { Ok(()) }).await?;
                let row = reconciler_row(read.name(), read.setup(), history.label, 1, read.expected(), window);
                match short {
                    None => short = Some(self.push(row)),
                    Some(baseline) => self.push_grown(row, baseline),
                }
            }
        }
        for history in histories {
            history.reconciler.stop().await?;
            history.pool.close().await;
            self.server.front().psql("postgres", &format!("DROP DATABASE {}", history.database)).await?;
        }
        Ok(())
    }

    /// A database of `payments` for the console, migrated and loaded, its reconciler serving the
    /// console, and the console's requests found there.
    async fn console_history(&self, payments: u64, label: &'static str) -> anyhow::Result<ConsoleHistory> {
        let database = format!("console_{payments}");
        self.server.create_database(&database).await?;
        let url = self.server.url(&database);
        self.launcher.reconciler_command(&url, &["migrate"]).await?;
        let pool = PgPoolOptions::new().max_connections(2).connect(&url).await?;
        let started = Instant::now();
        let mut conn = pool.acquire().await?;
        console::load(&mut conn, payments).await?;
        dataset::settle_database(&mut conn).await?;
        drop(conn);
        eprintln!("bench: {database}: {payments} payments loaded in {:.0?}", started.elapsed());
        let printed = self.launcher.reconciler_command(&url, &["operators", "bootstrap", "bench", "--json"]).await?;
        let token = console::bootstrapped_token(&printed)?;
        let operations = oncepay_devkit::ports::reserve()?;
        let secret = WebhookSecret::generate();
        let name = format!("reconciler-{database}");
        let reconciler = self.launcher.reconciler(&name, &url, &secret, Some(operations)).await?;
        let probes = Probes::find(&format!("http://127.0.0.1:{operations}"), &token, payments).await?;
        Ok(ConsoleHistory { database, label, pool, reconciler, probes })
    }

    /// Pushes a row measured over the long history against the same over the short one: its median
    /// latency may grow by [`CONSOLE_GROWTH`] at most; the p95's and the CPU's growth are extras.
    fn push_grown(&mut self, mut row: Row, short: usize) {
        let baseline = &self.rows[short];
        let grown = |long: Option<f64>, short: Option<f64>| match (long, short) {
            (Some(long), Some(short)) if short > 0.0 => Some(long / short),
            _ => None,
        };
        let p95 = grown(row.latency.map(|l| l.p95_ms), baseline.latency.map(|l| l.p95_ms));
        let cpu = grown(row.cpu_seconds_per_op, baseline.cpu_seconds_per_op);
        row.extra.extend(p95.map(|ratio| ("p95 ratio".to_owned(), ratio)));
        row.extra.extend(cpu.map(|ratio| ("CPU-s/op ratio".to_owned(), ratio)));
        row.comparison = Some(Comparison::of_median_latency(&row, baseline, Some(CONSOLE_GROWTH)));
        self.push(row);
    }
}

/// One history the console is read over: its database, and the reconciler that serves its console.
struct ConsoleHistory {
    database: String,
    label: &'static str,
    pool: PgPool,
    reconciler: Service,
    probes: Probes,
}

/// The two api processes of one history: one that remembers final responses, one that does not.
struct HistoryApis {
    cached: [SocketAddr; 1],
    uncached: [SocketAddr; 1],
}

/// One history's measurements: the raw rows already pushed (their indices), the service rows not yet.
struct HistoryRun {
    raw_accept: usize,
    accept: Row,
    raw_replay: usize,
    replay: Row,
    uncached: Row,
}

/// The short history's rows, by index.
struct HistoryRows {
    raw_accept: usize,
    accept: usize,
    raw_replay: usize,
    replay: usize,
    uncached: usize,
}

/// The events phase's worker settings: deliveries to the receiver on 127.0.0.1 allowed, and as many
/// in flight to its one endpoint as in the whole worker (the default per endpoint would cap the
/// deliveries, not the worker). `--worker-env` overrides them.
fn events_settings() -> [(&'static str, String); 3] {
    [
        ("events.allow_http", "true".into()),
        ("events.allow_private_addresses", "true".into()),
        ("events.per_endpoint", EVENTS_PER_ENDPOINT.into()),
    ]
}

/// What every window of the events phase shares.
struct EventsSetup<'a> {
    /// The provider the phase's workers send to.
    simulator: &'a Service,
    /// The tenant's endpoint, in this process.
    receiver: &'a Receiver,
    /// The endpoint's id.
    endpoint: uuid::Uuid,
}

/// The postmaster of each of `server`'s nodes, read from a backend's parent.
async fn postmasters(server: &Server) -> anyhow::Result<Vec<i32>> {
    let mut postmasters = Vec::new();
    for node in server.nodes() {
        let mut conn = sqlx::PgConnection::connect(&node.url("postgres")).await?;
        postmasters.push(dataset::postmaster_pid(&mut conn).await?);
    }
    Ok(postmasters)
}

/// A row of load on a reconciler: responses with the `expected` status are its operations, any
/// other is an error.
fn reconciler_row(
    name: &str,
    setup: &str,
    dataset: &str,
    connections: u32,
    expected: u16,
    (window, cpu): (Window, CpuUsage),
) -> Row {
    let ops = window.statuses.get(&expected).copied().unwrap_or(0);
    let seconds = cpu.wall_seconds.max(f64::EPSILON);
    Row {
        kind: Kind::Service,
        name: name.into(),
        concurrency: connections,
        setup: setup.into(),
        dataset: dataset.into(),
        ops,
        seconds,
        rate: ops as f64 / seconds,
        errors: window.responded() - ops,
        latency: window.latencies.summary(),
        cpu_seconds_per_op: Row::cost_per_op(&cpu, &[Role::Reconciler, Role::Postgres], ops),
        cpu,
        comparison: None,
        extra: window.statuses.iter().map(|(status, count)| (format!("status {status}"), *count as f64)).collect(),
    }
}
