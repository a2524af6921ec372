//! The system under test, as real processes: a throwaway PostgreSQL (a Citus cluster when
//! `TEST_DATABASE=citus`, see `oncepay_devkit::server`), a payment provider
//! (the simulator, or localstripe in Stripe's place), and any number of `api`, `worker` and
//! `reconciler` processes, each on its own port (and each reconciler on a second one, for its
//! operations API).
//!
//! A restarted process keeps its port, so clients' URLs stay valid. Nothing here moves a payment or
//! touches a table other than through the real binaries, and nothing here decides a fault: that is
//! the harness's job. Dropping a [`System`] kills every process and deletes the database server.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use oncepay_devkit::pg::Durability;
use oncepay_devkit::ports;
use oncepay_devkit::process::{Child, Spec, setting_variable};
use oncepay_devkit::server::{self, Server};
use oncepay_devkit::workspace;
use oncepay_simulator::client::SimulatorClient;
use oncepay_webhook_signature::WebhookSecret;
use serde::Deserialize;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::broker::Broker;
use crate::localstripe::{self, Localstripe};
use crate::operations::OperatorClient;

/// The simulator's credential, as every binary's default configuration has it.
pub const SIMULATOR_API_KEY: &str = "sk_test_oncepay_simulator";

/// How long a process may take to be ready (`/readyz`) after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a process may take to exit after SIGTERM before it counts as hung.
const TERMINATE_GRACE: Duration = Duration::from_secs(20);

/// Where the binaries to run are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `oncepay-api`.
    pub api: PathBuf,
    /// `oncepay-worker` (the harness uses one built with fail points).
    pub worker: PathBuf,
    /// `oncepay-reconciler`, the service and the operator CLI.
    pub reconciler: PathBuf,
    /// `oncepay-simulator`.
    pub simulator: PathBuf,
}

impl Binaries {
    /// The workspace's binaries, built beside the running executable (`cargo build --workspace
    /// --bins`, which the test command runs first).
    pub fn built() -> anyhow::Result<Self> {
        Ok(Self {
            api: workspace::binary("oncepay-api")?,
            worker: workspace::binary("oncepay-worker")?,
            reconciler: workspace::binary("oncepay-reconciler")?,
            simulator: workspace::binary("oncepay-simulator")?,
        })
    }
}

/// The kinds of oncepay process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// `oncepay-api`.
    Api,
    /// `oncepay-worker`.
    Worker,
    /// `oncepay-reconciler serve`.
    Reconciler,
}

impl Role {
    /// `api`, `worker`, `reconciler`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Worker => "worker",
            Self::Reconciler => "reconciler",
        }
    }

    /// The database role the process connects as (migration 0380).
    pub const fn database_role(self) -> &'static str {
        match self {
            Self::Api => "oncepay_api",
            Self::Worker => "oncepay_worker",
            Self::Reconciler => "oncepay_reconciler",
        }
    }
}

/// How many processes of each kind.
#[derive(Debug, Clone, Copy)]
pub struct Topology {
    /// api processes.
    pub apis: usize,
    /// worker processes.
    pub workers: usize,
    /// reconciler processes (the first receives the webhooks).
    pub reconcilers: usize,
}

/// The timing every process runs with: short enough that a crash, a lost lease or an uncertain
/// response settles within seconds, and consistent across processes (the key window especially).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The worker's and reconciler's provider request timeout.
    pub provider_request_timeout_ms: u64,
    /// How long the simulator remembers a key, and how long oncepay believes it does.
    pub key_window_secs: u64,
    /// oncepay stops resending this long before the key window closes.
    pub key_window_margin_secs: u64,
    /// The worker's lease.
    pub lease_secs: u64,
    /// Polling fallbacks and loop intervals of the worker and the reconciler.
    pub loop_interval_ms: u64,
    /// Inconclusive lookups before the poller dead-letters an `unknown` payment.
    pub poller_max_attempts: u32,
    /// The simulator's hang, for the hang-after-charging fault: longer than the request timeout.
    pub hang_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            provider_request_timeout_ms: 1_500,
            key_window_secs: 20,
            key_window_margin_secs: 5,
            lease_secs: 4,
            loop_interval_ms: 200,
            poller_max_attempts: 12,
            hang_ms: 2_500,
        }
    }
}

/// The payment provider the processes charge through.
#[derive(Debug, Clone)]
pub enum Provider {
    /// oncepay's simulator, seeded: faults on demand, and its ground truth.
    Simulator {
        /// The simulator's seed.
        seed: u64,
    },
    /// localstripe, run by this Python, with every process configured for Stripe.
    Localstripe {
        /// A Python that has localstripe installed ([`Localstripe::python`]).
        python: PathBuf,
    },
}

/// The provider as it runs.
enum RunningProvider {
    Simulator { child: Child, url: String, client: SimulatorClient },
    Localstripe(Localstripe),
}

/// Which processes an entry of [`SystemConfig::env`] goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processes {
    /// Every process, the simulator too.
    All,
    /// The simulator.
    Simulator,
    /// Every process of one kind.
    Only(Role),
}

impl Processes {
    fn include(self, role: Option<Role>) -> bool {
        match self {
            Self::All => true,
            Self::Simulator => role.is_none(),
            Self::Only(only) => role == Some(only),
        }
    }
}

/// What to start.
#[derive(Debug, Clone)]
pub struct SystemConfig {
    /// The binaries.
    pub binaries: Binaries,
    /// How many of each process.
    pub topology: Topology,
    /// Tenant names (at least one).
    pub tenants: Vec<String>,
    /// Durable if the run crashes PostgreSQL.
    pub durability: Durability,
    /// Timeouts, leases, windows.
    pub timing: Timing,
    /// The payment provider.
    pub provider: Provider,
    /// Where logs go; a fresh temporary directory if none.
    pub log_dir: Option<PathBuf>,
    /// Environment a test adds for some processes, set after the system's own so that a variable of
    /// the same name replaces the system's value: what the test needs differently (a log format, an
    /// exporter, faults), with settings named by
    /// [`setting_variable`](oncepay_devkit::process::setting_variable).
    pub env: Vec<(Processes, String, String)>,
    /// Start a RabbitMQ node of the system's own, which every api consumes payments from, with a
    /// producer user for each tenant ([`Tenant::producer_url`]).
    pub broker: bool,
}

/// A tenant, with the API key `tenants create` printed for it.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    /// Its id.
    pub tenant_id: Uuid,
    /// Its bearer token.
    pub api_key: String,
    /// With a broker: the URL of its producer user, mapped to it as operators map one.
    pub producer_url: Option<String>,
}

/// The first operator, an admin, bootstrapped when the system starts.
const ADMIN: &str = "oncepay-tests";

/// What `oncepay-reconciler operators bootstrap --json` prints, of what the harness reads.
#[derive(Deserialize)]
struct IssuedToken {
    token: String,
    password: String,
}

/// The operator, an approver with a token of its own, who approves the test's tenants.
const TENANT_APPROVER: &str = "oncepay-tests-tenants";

/// What `oncepay-reconciler tenants create --json` prints, of what the harness reads.
#[derive(Deserialize)]
struct Proposed {
    proposal: ProposalRef,
}

#[derive(Deserialize)]
struct ProposalRef {
    proposal_id: Uuid,
}

/// What `oncepay-reconciler keys collect --json` prints.
#[derive(Deserialize)]
struct IssuedKey {
    tenant: IssuedTenant,
    api_key: String,
}

#[derive(Deserialize)]
struct IssuedTenant {
    tenant_id: Uuid,
    name: String,
}

/// One oncepay process slot: its spec, ports, and the running child if any.
struct Slot {
    role: Role,
    spec: Spec,
    port: u16,
    /// A reconciler's operations API (`operators.port`); `None` for the other kinds.
    operations_port: Option<u16>,
    child: Option<Child>,
    paused: bool,
    /// The extra environment it was last started with (e.g. `FAILPOINTS`).
    extra_env: Vec<(String, String)>,
}

impl Slot {
    fn ready_url(&self) -> String {
        format!("http://127.0.0.1:{}/readyz", self.port)
    }
}

/// Where the logs are, and whether to keep them: every process logs to its own file in one
/// directory, kept when a caller asks (a failed run) and deleted otherwise.
enum Logs {
    Temporary(tempfile::TempDir),
    Kept(PathBuf),
}

impl Logs {
    fn path(&self) -> &Path {
        match self {
            Self::Temporary(dir) => dir.path(),
            Self::Kept(path) => path,
        }
    }
}

/// A process that exited although nobody stopped it.
#[derive(Debug, Clone)]
pub struct Exited {
    /// Its kind.
    pub role: Role,
    /// Its index among its kind.
    pub index: usize,
    /// How it exited.
    pub status: ExitStatus,
}

/// The running system.
pub struct System {
    // Declared first so the processes are killed before the cluster goes away.
    slots: BTreeMap<(Role, usize), Slot>,
    broker: Option<Broker>,
    provider: RunningProvider,
    server: Server,
    /// As the superuser that owns the tables: for migrating and for the tests' own checks.
    database_url: String,
    pool: PgPool,
    tenants: Vec<Tenant>,
    logs: Logs,
    database_up: bool,
    /// Citus worker nodes crashed and not started again.
    nodes_down: BTreeSet<usize>,
    reconciler: PathBuf,
    /// The token of the first operator, the admin `oncepay-tests`.
    admin_token: String,
    /// A second operator, who approves the tenants the admin proposes.
    tenant_approver: Option<OperatorClient>,
    /// Its local password, made by the bootstrap.
    admin_password: String,
    /// What the provider signs its webhooks with.
    webhook_secret: String,
    /// Under Citus, the two-phase commits that setting up made (creating the database, distributing
    /// the tables, creating the tenants); `None` on one PostgreSQL.
    two_phase_at_start: Option<i64>,
}

impl System {
    /// Starts everything and waits until every process is ready, the way operators would: a fresh
    /// cluster, `oncepay-reconciler migrate`, `oncepay-reconciler operators bootstrap oncepay-tests`,
    /// the simulator with the first reconciler's webhook URL, every process, then a second operator
    /// (an approver who enrolls and makes its own token), and for every tenant `oncepay-reconciler
    /// tenants create <name> --json` as that admin, its approval by the second operator, and `keys
    /// collect` as the admin, through the operations API.
    pub async fn start(config: SystemConfig) -> anyhow::Result<Self> {
        ensure!(!config.tenants.is_empty(), "at least one tenant");
        ensure!(config.topology.apis >= 1 && config.topology.workers >= 1 && config.topology.reconcilers >= 1);
        oncepay_service::tls::install_provider();
        let logs = match &config.log_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
                Logs::Kept(dir.clone())
            }
            None => Logs::Temporary(tempfile::Builder::new().prefix("oncepay-system-").tempdir()?),
        };
        let server =
            Server::start(server::Kind::from_env(), config.durability).await.context("cannot start PostgreSQL")?;
        server.keep_two_phase_records().await?;
        server.create_database("oncepay").await?;
        let database_url = server.url("oncepay");
        let binaries = &config.binaries;
        let broker = if config.broker { Some(Broker::start().await?) } else { None };

        run_cli(&binaries.reconciler, &database_url, &[], &["migrate"]).await.context("migrate")?;
        let reconciler_url = server.url_as(Role::Reconciler.database_role(), "oncepay");
        let bootstrapped =
            run_cli(&binaries.reconciler, &reconciler_url, &[], &["operators", "bootstrap", ADMIN, "--json"])
                .await
                .context("operators bootstrap")?;
        let admin: IssuedToken = serde_json::from_str(&bootstrapped).context("reading `operators bootstrap --json`")?;

        let timing = config.timing;
        let mut slots = BTreeMap::new();
        for (role, count) in [
            (Role::Reconciler, config.topology.reconcilers),
            (Role::Api, config.topology.apis),
            (Role::Worker, config.topology.workers),
        ] {
            for index in 0..count {
                let port = ports::reserve()?;
                let url = server.url_as(role.database_role(), "oncepay");
                let mut spec = process_spec(role, index, port, binaries, &url, &timing, logs.path());
                let operations_port = (role == Role::Reconciler).then(ports::reserve).transpose()?;
                if let Some(operations_port) = operations_port {
                    spec = spec.setting("operators.port", operations_port.to_string());
                }
                if let (Role::Api, Some(broker)) = (role, &broker) {
                    for (key, value) in broker.api_settings() {
                        spec = spec.setting(key, value);
                    }
                }
                slots.insert(
                    (role, index),
                    Slot { role, spec, port, operations_port, child: None, paused: false, extra_env: Vec::new() },
                );
            }
        }
        let reconciler_port = slots.get(&(Role::Reconciler, 0)).map(|slot| slot.port).context("no reconciler")?;
        let (provider, webhook_secret) = start_provider(&config, reconciler_port, &mut slots, logs.path()).await?;
        for ((role, _), slot) in &mut slots {
            slot.spec.env.extend(extra_env(&config, Some(*role)));
        }

        let pool = PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&database_url)
            .await
            .context("cannot connect to the test database")?;
        let mut system = Self {
            slots,
            broker,
            provider,
            server,
            database_url,
            pool,
            tenants: Vec::new(),
            logs,
            database_up: true,
            nodes_down: BTreeSet::new(),
            reconciler: config.binaries.reconciler.clone(),
            admin_token: admin.token,
            tenant_approver: None,
            admin_password: admin.password,
            webhook_secret,
            two_phase_at_start: None,
        };
        let all: Vec<_> = system.slots.keys().copied().collect();
        for (role, index) in all {
            system.restart(role, index, &[]).await?;
        }
        let approver = OperatorClient::admin(&system)?
            .create_operator(TENANT_APPROVER, "approver", "approves the test's tenants")
            .await
            .context("cannot make the operator who approves the tenants")?;
        system.tenant_approver = Some(approver);
        for name in &config.tenants {
            let mut tenant = system.create_tenant(name, None).await?;
            if system.broker.is_some() {
                tenant.producer_url = Some(system.map_producer(name).await?);
            }
            system.tenants.push(tenant);
        }
        // Counted from here: a tenant and its key are rows of reference tables, which Citus writes on
        // every node with two-phase commit, as it should; they are setting up, not a hot path.
        system.two_phase_at_start = two_phase_commits(&system.pool, &system.server).await?;
        Ok(system)
    }

    /// Makes tenant `name` (limited to `rate_limit` requests a second, if given) with the operator
    /// CLI, as operators do: the admin proposes it, a second operator approves, and the admin collects
    /// its key.
    pub async fn create_tenant(&self, name: &str, rate_limit: Option<&str>) -> anyhow::Result<Tenant> {
        let mut create = vec!["tenants", "create", name, "--reason", "a tenant of the test", "--json"];
        if let Some(rate_limit) = rate_limit {
            create.extend(["--rate-limit", rate_limit]);
        }
        let out = self.operator(&create).await.with_context(|| format!("tenants create {name}"))?;
        let proposed: Proposed = serde_json::from_str(&out).context("reading `tenants create --json`")?;
        let proposal_id = proposed.proposal.proposal_id;
        let approver = self.tenant_approver.as_ref().context("no operator approves tenants yet")?;
        approver.approve(proposal_id, "a tenant of the test").await.with_context(|| format!("approving {name}"))?;
        let out = self
            .operator(&["keys", "collect", &proposal_id.to_string(), "--json"])
            .await
            .with_context(|| format!("keys collect for {name}"))?;
        let issued: IssuedKey = serde_json::from_str(&out).context("reading `keys collect --json`")?;
        Ok(Tenant {
            name: issued.tenant.name,
            tenant_id: issued.tenant.tenant_id,
            api_key: issued.api_key,
            producer_url: None,
        })
    }

    /// Adds a producer user for tenant `name` on the system's broker and maps it to the tenant, as
    /// operators do: the admin proposes, the second operator approves. The producer's URL.
    async fn map_producer(&self, name: &str) -> anyhow::Result<String> {
        let broker = self.broker.as_ref().context("the system has no broker")?;
        let (user, url) = broker.add_producer(name).await?;
        let add = ["broker-users", "add", name, &user, "--reason", "the test's producer", "--json"];
        let out = self.operator(&add).await.with_context(|| format!("broker-users add {name} {user}"))?;
        let proposed: Proposed = serde_json::from_str(&out).context("reading `broker-users add --json`")?;
        let approver = self.tenant_approver.as_ref().context("no second operator yet")?;
        approver
            .approve(proposed.proposal.proposal_id, "the test's producer")
            .await
            .with_context(|| format!("approving broker user {user}"))?;
        Ok(url)
    }

    /// The system's RabbitMQ node, if it has one.
    pub fn broker(&self) -> Option<&Broker> {
        self.broker.as_ref()
    }

    /// The system's RabbitMQ node, for a fault.
    pub fn broker_mut(&mut self) -> anyhow::Result<&mut Broker> {
        self.broker.as_mut().context("the system has no broker")
    }

    /// The token of the first operator, the admin `oncepay-tests`, for the operations API.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The first operator's local password, made by the bootstrap (with an OpenID provider
    /// configured, it signs in only as the break-glass account).
    pub fn admin_password(&self) -> &str {
        &self.admin_password
    }

    /// The first operator's name.
    pub const fn admin_name(&self) -> &'static str {
        ADMIN
    }

    /// What the provider signs its webhooks with (`whsec_` and base64), for a test that looks for it
    /// where it must never be.
    pub fn webhook_secret(&self) -> &str {
        &self.webhook_secret
    }

    /// The tenants, in the order they were named.
    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// The base URL of process `index` of `role` (its `/metrics`, `/readyz`, the api's routes).
    pub fn url(&self, role: Role, index: usize) -> anyhow::Result<String> {
        let slot = self.slots.get(&(role, index)).with_context(|| format!("no {} {index}", role.as_str()))?;
        Ok(format!("http://127.0.0.1:{}", slot.port))
    }

    /// The base URL of every api process, by index.
    pub fn api_urls(&self) -> Vec<String> {
        self.slots
            .values()
            .filter(|slot| slot.role == Role::Api)
            .map(|slot| format!("http://127.0.0.1:{}", slot.port))
            .collect()
    }

    /// The base URL of every reconciler's operations API, by index.
    pub fn operations_urls(&self) -> Vec<String> {
        self.slots
            .values()
            .filter_map(|slot| slot.operations_port)
            .map(|port| format!("http://127.0.0.1:{port}"))
            .collect()
    }

    /// How many processes of `role` there are.
    pub fn count(&self, role: Role) -> usize {
        self.slots.keys().filter(|(r, _)| *r == role).count()
    }

    /// The simulator's control client; an error when the system charges through localstripe.
    pub fn simulator(&self) -> anyhow::Result<&SimulatorClient> {
        match &self.provider {
            RunningProvider::Simulator { client, .. } => Ok(client),
            RunningProvider::Localstripe(_) => bail!("this system charges through localstripe, not the simulator"),
        }
    }

    /// The simulator's base URL; an error when the system charges through localstripe.
    pub fn simulator_url(&self) -> anyhow::Result<&str> {
        match &self.provider {
            RunningProvider::Simulator { url, .. } => Ok(url),
            RunningProvider::Localstripe(_) => bail!("this system charges through localstripe, not the simulator"),
        }
    }

    /// localstripe; an error when the system charges through the simulator.
    pub fn localstripe(&self) -> anyhow::Result<&Localstripe> {
        match &self.provider {
            RunningProvider::Localstripe(localstripe) => Ok(localstripe),
            RunningProvider::Simulator { .. } => bail!("this system charges through the simulator, not localstripe"),
        }
    }

    /// Runs an operator command (`oncepay-reconciler <args>`, as the admin `oncepay-tests`, through
    /// the first reconciler's operations API) and returns its output; a refused or failed command is
    /// an error with its message.
    pub async fn operator(&self, args: &[&str]) -> anyhow::Result<String> {
        let url = self.operations_urls().into_iter().next().context("no reconciler serves the operations API")?;
        let env = [("ONCEPAY_OPS_URL", url.as_str()), ("ONCEPAY_OPS_TOKEN", self.admin_token.as_str())];
        let url = self.server.url_as(Role::Reconciler.database_role(), "oncepay");
        run_cli(&self.reconciler, &url, &env, args).await
    }

    /// Under Citus, how many transactions committed with two-phase commit since the system started:
    /// each one spanned nodes, which no statement of oncepay's hot paths should make. `None` on one
    /// PostgreSQL, where there is no such thing.
    pub async fn two_phase_commits_since_start(&self) -> anyhow::Result<Option<i64>> {
        let now = two_phase_commits(&self.pool, &self.server).await?;
        Ok(now.zip(self.two_phase_at_start).map(|(now, start)| now - start))
    }

    /// A pool on oncepay's database, for the checker.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The database URL of the superuser that owns the tables (each process connects as its own
    /// role: [`Role::database_role`]).
    pub fn database_url(&self) -> &str {
        &self.database_url
    }

    /// The directory of every process's log (and PostgreSQL's, copied at [`System::keep_logs`]).
    pub fn log_dir(&self) -> &Path {
        self.logs.path()
    }

    /// Keeps the logs after the system is dropped (for a failed run), with PostgreSQL's server log
    /// copied beside them; returns where they are.
    pub fn keep_logs(&mut self) -> PathBuf {
        let _ = std::fs::copy(self.server.log_path(), self.logs.path().join("postgresql.log"));
        let logs = std::mem::replace(&mut self.logs, Logs::Kept(PathBuf::new()));
        let path = match logs {
            Logs::Temporary(dir) => dir.keep(),
            Logs::Kept(path) => path,
        };
        self.logs = Logs::Kept(path.clone());
        path
    }

    fn slot(&mut self, role: Role, index: usize) -> anyhow::Result<&mut Slot> {
        self.slots.get_mut(&(role, index)).with_context(|| format!("there is no {} {index}", role.as_str()))
    }

    /// Whether the process is running (started and not known to have exited).
    pub fn is_running(&mut self, role: Role, index: usize) -> bool {
        self.slot(role, index)
            .ok()
            .and_then(|slot| slot.child.as_mut())
            .is_some_and(|child| matches!(child.try_status(), Ok(None)))
    }

    /// Whether the process is paused.
    pub fn is_paused(&self, role: Role, index: usize) -> bool {
        self.slots.get(&(role, index)).is_some_and(|slot| slot.paused)
    }

    /// The extra environment the process was last started with.
    pub fn extra_env(&self, role: Role, index: usize) -> &[(String, String)] {
        self.slots.get(&(role, index)).map_or(&[], |slot| slot.extra_env.as_slice())
    }

    /// SIGKILL, and wait until it is gone. A paused process is killed too.
    pub async fn kill(&mut self, role: Role, index: usize) -> anyhow::Result<()> {
        let slot = self.slot(role, index)?;
        if let Some(mut child) = slot.child.take() {
            child.kill().await?;
        }
        slot.paused = false;
        Ok(())
    }

    /// Starts the process again on its port (killing it first if it runs), with `extra_env` on top
    /// of its configuration, and waits until it is ready. While PostgreSQL is down it cannot become
    /// ready, so this waits for the database to be back first.
    pub async fn restart(&mut self, role: Role, index: usize, extra_env: &[(String, String)]) -> anyhow::Result<()> {
        ensure!(self.database_up, "cannot start a process while PostgreSQL is down");
        self.kill(role, index).await?;
        let slot = self.slot(role, index)?;
        let mut spec = slot.spec.clone();
        spec.env.extend(extra_env.iter().cloned());
        slot.extra_env = extra_env.to_vec();
        let mut child = Child::spawn(spec).await?;
        child.wait_until_ready(&slot.ready_url(), READY_TIMEOUT).await?;
        slot.child = Some(child);
        Ok(())
    }

    /// SIGSTOP: frozen mid-whatever, holding its connections and leases.
    pub fn pause(&mut self, role: Role, index: usize) -> anyhow::Result<()> {
        let slot = self.slot(role, index)?;
        let child = slot.child.as_ref().context("the process is not running")?;
        child.pause()?;
        slot.paused = true;
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self, role: Role, index: usize) -> anyhow::Result<()> {
        let slot = self.slot(role, index)?;
        if slot.paused {
            if let Some(child) = &slot.child {
                child.resume()?;
            }
            slot.paused = false;
        }
        Ok(())
    }

    /// Processes that exited by themselves (a fail point, a crash) since they were started; each is
    /// reported once and then counts as not running.
    pub fn exited(&mut self) -> Vec<Exited> {
        let mut exited = Vec::new();
        for slot in self.slots.values_mut() {
            let status = slot.child.as_mut().and_then(|child| child.try_status().ok().flatten());
            if let Some(status) = status {
                slot.child = None;
                slot.paused = false;
                let (role, index) = (slot.role, index_of(&slot.spec.name));
                exited.push(Exited { role, index, status });
            }
        }
        exited
    }

    /// Crashes PostgreSQL: `pg_ctl stop -m immediate`.
    pub async fn crash_database(&mut self) -> anyhow::Result<()> {
        self.server.crash().await?;
        self.database_up = false;
        Ok(())
    }

    /// Starts PostgreSQL again; it recovers from its WAL.
    pub async fn resume_database(&mut self) -> anyhow::Result<()> {
        if !self.database_up {
            self.server.resume().await?;
            self.database_up = true;
        }
        Ok(())
    }

    /// Whether PostgreSQL is running.
    pub fn database_up(&self) -> bool {
        self.database_up
    }

    /// How many Citus worker nodes hold the data: none on one PostgreSQL.
    pub fn database_nodes(&self) -> usize {
        self.server.worker_nodes()
    }

    /// Under Citus, crashes worker node `index`: the payments of the tenants it holds wait.
    pub async fn crash_database_node(&mut self, index: usize) -> anyhow::Result<()> {
        self.server.crash_worker_node(index).await?;
        self.nodes_down.insert(index);
        Ok(())
    }

    /// Starts worker node `index` again; it recovers from its WAL.
    pub async fn resume_database_node(&mut self, index: usize) -> anyhow::Result<()> {
        if self.nodes_down.remove(&index) {
            self.server.resume_worker_node(index).await?;
        }
        Ok(())
    }

    /// Every process back: PostgreSQL and the broker up, paused ones resumed, dead ones started, and any started
    /// with extra environment (fail points) started again without it.
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        self.resume_database().await?;
        if let Some(broker) = self.broker.as_mut().filter(|broker| !broker.is_up()) {
            broker.start_again().await?;
        }
        for index in std::mem::take(&mut self.nodes_down) {
            self.server.resume_worker_node(index).await?;
        }
        let all: Vec<_> = self.slots.keys().copied().collect();
        for (role, index) in all {
            self.resume(role, index)?;
            let armed = !self.extra_env(role, index).is_empty();
            if armed || !self.is_running(role, index) {
                self.restart(role, index, &[]).await?;
            }
        }
        Ok(())
    }

    /// Stops every process with SIGTERM and returns those that did not exit 0 (or hung).
    pub async fn shutdown(&mut self) -> anyhow::Result<Vec<String>> {
        let mut unclean = Vec::new();
        for slot in self.slots.values_mut() {
            if let Some(mut child) = slot.child.take() {
                if slot.paused {
                    child.resume()?;
                }
                match child.terminate(TERMINATE_GRACE).await {
                    Ok(status) if status.success() => {}
                    Ok(status) => unclean.push(format!("{} exited with {status}", slot.spec.name)),
                    Err(error) => unclean.push(format!("{}: {error:#}", slot.spec.name)),
                }
            }
        }
        let (name, stopped) = match &mut self.provider {
            RunningProvider::Simulator { child, .. } => ("simulator", child.terminate(TERMINATE_GRACE).await),
            RunningProvider::Localstripe(localstripe) => ("localstripe", localstripe.terminate(TERMINATE_GRACE).await),
        };
        match stopped {
            Ok(status) if status.success() => {}
            Ok(status) => unclean.push(format!("{name} exited with {status}")),
            Err(error) => unclean.push(format!("{name}: {error:#}")),
        }
        Ok(unclean)
    }
}

/// The entries of [`SystemConfig::env`] for a process of `role` (`None`: the simulator).
fn extra_env(config: &SystemConfig, role: Option<Role>) -> impl Iterator<Item = (String, String)> + '_ {
    config.env.iter().filter(move |(to, _, _)| to.include(role)).map(|(_, key, value)| (key.clone(), value.clone()))
}

/// Starts the provider, points every process at it, and sends its webhooks to the reconciler on
/// `reconciler_port`, signed with a secret of this system's own, which it returns.
async fn start_provider(
    config: &SystemConfig,
    reconciler_port: u16,
    slots: &mut BTreeMap<(Role, usize), Slot>,
    log_dir: &Path,
) -> anyhow::Result<(RunningProvider, String)> {
    let timing = &config.timing;
    let webhook_secret = WebhookSecret::generate();
    let secret = webhook_secret.clone();
    let reconciler = format!("http://127.0.0.1:{reconciler_port}");
    match &config.provider {
        Provider::Simulator { seed } => {
            let port = ports::reserve()?;
            let url = format!("http://127.0.0.1:{port}");
            for (&(role, _), slot) in slots.iter_mut() {
                slot.spec.env.extend([
                    (setting_variable("provider.base_url"), url.clone()),
                    (setting_variable("provider.api_key"), SIMULATOR_API_KEY.into()),
                    (setting_variable("provider.connect_timeout_ms"), "500".into()),
                    (setting_variable("provider.request_timeout_ms"), timing.provider_request_timeout_ms.to_string()),
                ]);
                if role == Role::Reconciler {
                    slot.spec = slot.spec.clone().setting_list("webhooks.secrets", &[&webhook_secret]);
                }
            }
            let spec = Spec::new("simulator", &config.binaries.simulator, log_dir)
                .port(port)
                .setting("telemetry.log_format", "text")
                .setting("simulator.seed", seed.to_string())
                .setting("simulator.key_window_secs", timing.key_window_secs.to_string())
                .setting("simulator.webhook_url", format!("{reconciler}/webhooks/provider"))
                .setting("simulator.webhook_secret", &webhook_secret)
                .setting("simulator.webhook_backoff.base_ms", "100")
                .setting("simulator.webhook_backoff.max_ms", "1000")
                .setting("simulator.webhook_timeout_ms", "2000")
                .setting("simulator.shutdown_grace_ms", "500")
                .setting("faults.hang_ms", timing.hang_ms.to_string());
            let spec = extra_env(config, None).fold(spec, |spec, (key, value)| spec.env(key, value));
            let mut child = Child::spawn(spec).await?;
            child.wait_until_ready(&format!("{url}/readyz"), READY_TIMEOUT).await?;
            Ok((RunningProvider::Simulator { child, client: SimulatorClient::new(&url), url }, secret))
        }
        Provider::Localstripe { python } => {
            let stripe = Localstripe::start(python, log_dir).await?;
            stripe.send_webhooks_to(&format!("{reconciler}/webhooks/stripe"), &webhook_secret).await?;
            for (&(role, _), slot) in slots.iter_mut() {
                slot.spec.env.extend([
                    (setting_variable("provider.kind"), "stripe".into()),
                    // localstripe has no Connect: it ignores `Stripe-Account`, and its events name no
                    // account.
                    (setting_variable("provider.stripe.mode"), "direct".into()),
                    (setting_variable("provider.stripe.base_url"), stripe.url().to_owned()),
                    (setting_variable("provider.stripe.secret_key"), localstripe::SECRET_KEY.into()),
                    (setting_variable("provider.stripe.api_version"), localstripe::API_VERSION.into()),
                    (setting_variable("provider.stripe.connect_timeout_ms"), "500".into()),
                    (
                        setting_variable("provider.stripe.request_timeout_ms"),
                        timing.provider_request_timeout_ms.to_string(),
                    ),
                    // One call's timeouts and a little more, below the poller's lease (twice the
                    // request timeout).
                    (
                        setting_variable("provider.stripe.lookup_deadline_ms"),
                        (timing.provider_request_timeout_ms + 1_000).to_string(),
                    ),
                ]);
                if role == Role::Reconciler {
                    slot.spec = slot.spec.clone().setting_list("webhooks.stripe_secrets", &[&webhook_secret]);
                }
            }
            Ok((RunningProvider::Localstripe(stripe), secret))
        }
    }
}

/// The index in a process name such as `worker-2`.
fn index_of(name: &str) -> usize {
    name.rsplit('-').next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// How to start process `index` of `role` on `port`.
fn process_spec(
    role: Role,
    index: usize,
    port: u16,
    binaries: &Binaries,
    database_url: &str,
    timing: &Timing,
    log_dir: &Path,
) -> Spec {
    let name = format!("{}-{index}", role.as_str());
    let program = match role {
        Role::Api => &binaries.api,
        Role::Worker => &binaries.worker,
        Role::Reconciler => &binaries.reconciler,
    };
    let interval = timing.loop_interval_ms.to_string();
    let spec = Spec::new(&name, program, log_dir)
        .env("DATABASE_URL", database_url)
        .port(port)
        .setting("telemetry.log_format", "text")
        .setting("provider.key_window_secs", timing.key_window_secs.to_string())
        .setting("provider.key_window_margin_secs", timing.key_window_margin_secs.to_string());
    match role {
        Role::Api => spec.setting("http.workers", "2").setting("http.shutdown_grace_secs", "5"),
        Role::Worker => spec
            .setting("worker.id", &name)
            .setting("worker.lease_secs", timing.lease_secs.to_string())
            .setting("worker.poll_interval_ms", &interval)
            .setting("worker.backoff.base_ms", "100")
            .setting("worker.backoff.max_ms", "1000")
            .setting("worker.shutdown_grace_secs", "5"),
        Role::Reconciler => spec
            .arg("serve")
            .setting("poller.interval_ms", &interval)
            .setting("poller.lease_ms", (timing.provider_request_timeout_ms * 2).to_string())
            .setting("poller.backoff.base_ms", "200")
            .setting("poller.backoff.max_ms", "1000")
            .setting("poller.max_attempts", timing.poller_max_attempts.to_string())
            .setting("sweeper.interval_ms", &interval),
    }
}

/// Under Citus, the transactions the coordinator has committed with two-phase commit (it keeps their
/// records, [`Server::keep_two_phase_records`]).
async fn two_phase_commits(pool: &PgPool, server: &Server) -> anyhow::Result<Option<i64>> {
    if !matches!(server, Server::Citus(_)) {
        return Ok(None);
    }
    // Unchecked: pg_dist_transaction exists only on a Citus coordinator, not in the database the macros check against.
    let count = sqlx::query_scalar("SELECT count(*) FROM pg_dist_transaction")
        .fetch_one(pool)
        .await
        .context("cannot count two-phase commits")?;
    Ok(Some(count))
}

/// Runs an operator command of `oncepay-reconciler` on `database_url` and returns its stdout.
async fn run_cli(reconciler: &Path, database_url: &str, env: &[(&str, &str)], args: &[&str]) -> anyhow::Result<String> {
    let output = tokio::process::Command::new(reconciler)
        .args(args)
        .env("DATABASE_URL", database_url)
        .envs(env.iter().copied())
        .output()
        .await
        .with_context(|| format!("cannot run {}", reconciler.display()))?;
    if !output.status.success() {
        bail!(
            "oncepay-reconciler {} exited with {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
