//! `cargo xtask up`: oncepay running locally, the way its users run it, with nothing pre-started.
//!
//! Brings up PostgreSQL, a RabbitMQ node, the payment provider (the simulator, or localstripe behind
//! oncepay's Stripe adapter), `api`, `worker` and `reconciler` as separate processes with
//! `[name]`-prefixed logs, and creates a demo tenant with a broker user of its own. Ctrl-C stops every process and removes the throwaway cluster. Secrets
//! shared between processes are random per run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use oncepay_devkit::localstripe;
use oncepay_devkit::pg::Durability;
use oncepay_devkit::process::{Child, Spec, setting_variable};
use oncepay_devkit::rabbitmq::{self, Node};
use oncepay_devkit::server::{self, Server};
use tokio::process::Command;

use crate::secrets;

/// The fixed local ports, as in `docker-compose.yml`.
const API_PORT: u16 = 8080;
const WORKER_PORT: u16 = 8081;
const RECONCILER_PORT: u16 = 8082;
/// The reconciler's operations API.
const OPERATIONS_PORT: u16 = 8083;
const SIMULATOR_PORT: u16 = 8090;
/// localstripe's own default port.
const LOCALSTRIPE_PORT: u16 = 8420;

/// Which payment provider the workers charge through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Provider {
    /// The provider simulator.
    Simulator,
    /// localstripe, through oncepay's Stripe adapter.
    Localstripe,
}

impl Provider {
    /// The provider's name in the logs and the banner, and its fixed port.
    const fn process(self) -> (&'static str, u16) {
        match self {
            Self::Simulator => ("simulator", SIMULATOR_PORT),
            Self::Localstripe => ("localstripe", LOCALSTRIPE_PORT),
        }
    }
}

/// What `up` needs to know.
pub struct Options {
    /// Build and run optimised binaries.
    pub release: bool,
    /// The demo tenant's name.
    pub tenant: String,
    /// On a throwaway Citus cluster (a coordinator and two worker nodes) instead of one PostgreSQL.
    pub citus: bool,
    /// The payment provider.
    pub provider: Provider,
}

/// What is running, so that an interruption at any moment stops exactly that.
#[derive(Default)]
struct Running {
    server: Option<Server>,
    node: Option<Node>,
    children: Vec<Child>,
}

impl Running {
    /// Stops the processes (SIGTERM, then SIGKILL after a grace period), entry point first so no
    /// new work arrives and the simulator last so in-flight calls finish; the cluster goes when
    /// `self` is dropped.
    async fn stop(&mut self) {
        for child in self.children.iter_mut().rev() {
            if let Err(error) = child.terminate(Duration::from_secs(35)).await {
                eprintln!("up: {error:#}");
            }
        }
    }
}

pub async fn up(root: &Path, options: &Options) -> anyhow::Result<ExitCode> {
    // Ctrl-C is handled from the first moment: whatever has started by then is stopped cleanly.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut running = Running::default();
    // Starting and supervising are one future, so the signal branches stay armed throughout: a
    // branch's handler runs after `select!` has stopped polling the others.
    let run = async {
        start(root, options, &mut running).await?;
        supervise(&mut running.children).await
    };
    let outcome = tokio::select! {
        outcome = run => outcome,
        _ = tokio::signal::ctrl_c() => Ok(ExitCode::SUCCESS),
        _ = terminate.recv() => Ok(ExitCode::SUCCESS),
    };
    eprintln!("up: stopping");
    running.stop().await;
    outcome
}

/// Builds oncepay, starts the database, the provider and the three processes in that order (each
/// into `running` as it starts), makes the operators and the demo tenant, and prints the banner.
async fn start(root: &Path, options: &Options, running: &mut Running) -> anyhow::Result<()> {
    ensure_ports_free(options.provider)?;
    let bin = build(root, options.release).await?;
    let python = match options.provider {
        Provider::Localstripe => Some(
            crate::localstripe::install(root, &crate::target_dir(root)).await.context("cannot install localstripe")?,
        ),
        Provider::Simulator => None,
    };
    let database_url = database(options.citus, &mut running.server).await?;
    let broker = broker(&options.tenant, &mut running.node).await?;
    let reconciler = bin.join("oncepay-reconciler");
    run_ok(&reconciler, &["migrate"], &database_url).await.context("migrating the database failed")?;
    let admin_login = admin_login(&reconciler, &database_url).await?;

    let processes = Processes {
        bin: &bin,
        log_dir: root.join(".oncepay").join("logs"),
        server: running.server.as_ref(),
        database_url: &database_url,
        provider: options.provider,
        provider_key: format!("sk_test_{}", secrets::hex_token(16)),
        webhook_secret: secrets::webhook_secret(),
        amqp_url: &broker.url,
        events_amqp_url: &broker.events_url,
    };
    let children = &mut running.children;
    match &python {
        Some(python) => processes.start_localstripe(root, python, children).await?,
        None => processes.start_simulator(children).await?,
    }
    let specs =
        [(processes.reconciler(), RECONCILER_PORT), (processes.worker(), WORKER_PORT), (processes.api(), API_PORT)];
    for (spec, port) in specs {
        let child = Child::spawn(spec).await?;
        let child = children.push_mut(child);
        child.wait_until_ready(&format!("http://127.0.0.1:{port}/readyz"), Duration::from_secs(60)).await?;
    }

    let approver_login = approver_login(&reconciler, &admin_login).await?;
    let api_key = demo_key(&reconciler, &admin_login.token, &approver_login.token, &options.tenant).await?;
    if let Some(producer) = &broker.producer {
        demo_broker_user(&reconciler, &admin_login.token, &approver_login.token, &options.tenant, &producer.user)
            .await?;
    }
    print_banner(&bin, &api_key, &admin_login, &approver_login, &processes.log_dir, options.provider);
    print_publishing(&bin, &broker, &options.tenant);
    Ok(())
}

/// The RabbitMQ node the api takes payments from, and a producer of the demo tenant's on it.
struct Broker {
    /// The api's URL: a user tagged `impersonator`.
    url: String,
    /// The workers' URL, for endpoints that are exchanges: on a node of `up`'s own, a user that may
    /// only declare and write `merchant.…` exchanges (docs/events.md); else the api's.
    events_url: String,
    /// The demo tenant's broker user, on a node of `up`'s own.
    producer: Option<Producer>,
}

/// A broker user and its URL.
struct Producer {
    user: String,
    url: String,
}

/// `AMQP_URL` when set (its user must be an impersonator; the tenant's producers are then the
/// node's owner's to make), else a throwaway node of its own, with a producer for `tenant`.
async fn broker(tenant: &str, node: &mut Option<Node>) -> anyhow::Result<Broker> {
    if let Ok(url) = std::env::var("AMQP_URL") {
        eprintln!("up: using AMQP_URL");
        return Ok(Broker { events_url: url.clone(), url, producer: None });
    }
    crate::packages::ensure(&["rabbitmq-server"], &[rabbitmq::DEBIAN_SERVER], "for the broker intake").await?;
    let started = node.insert(Node::start().await.context("cannot start a throwaway RabbitMQ node")?);
    eprintln!("up: started a throwaway RabbitMQ node on port {} (deleted on exit)", started.port());
    let user = format!("{tenant}-orders");
    let password = secrets::hex_token(16);
    started.add_user(&user, &password).await?;
    let producer = Producer { url: started.url_as(&user, &password), user };
    let events_password = secrets::hex_token(16);
    started.ctl(&["add_user", EVENTS_BROKER_USER, &events_password]).await?;
    started.ctl(&["set_permissions", "-p", "/", EVENTS_BROKER_USER, r"^merchant\.", r"^merchant\.", "^$"]).await?;
    let events_url = started.url_as(EVENTS_BROKER_USER, &events_password);
    Ok(Broker { url: started.url(), events_url, producer: Some(producer) })
}

/// The workers' broker user on a node of `up`'s own.
const EVENTS_BROKER_USER: &str = "oncepay-worker";

/// Fails, naming the port, if any of the fixed local ports is taken.
fn ensure_ports_free(provider: Provider) -> anyhow::Result<()> {
    for (name, port) in [
        ("api", API_PORT),
        ("worker", WORKER_PORT),
        ("reconciler", RECONCILER_PORT),
        ("operations API", OPERATIONS_PORT),
        provider.process(),
    ] {
        std::net::TcpListener::bind(("127.0.0.1", port))
            .with_context(|| format!("port {port} (for the {name}) is in use; stop whatever holds it"))?;
    }
    Ok(())
}

/// Builds the binaries; returns the folder that holds them.
async fn build(root: &Path, release: bool) -> anyhow::Result<PathBuf> {
    let profile = if release { "release" } else { "debug" };
    // The same selection as `cargo xtask test` builds: cargo unifies features over the packages it
    // builds, so any other selection would compile the dependencies a second time.
    let mut build = vec!["build", "--workspace", "--bins", "--locked"];
    if release {
        build.push("--release");
    }
    if !crate::cargo(&build, &[("SQLX_OFFLINE", "true")]).await? {
        bail!("building oncepay failed");
    }
    Ok(crate::target_dir(root).join(profile))
}

/// The database's URL: `DATABASE_URL` if given (and no Citus asked for), else that of a throwaway
/// server, started into `server`.
async fn database(citus: bool, server: &mut Option<Server>) -> anyhow::Result<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !citus => Ok(url),
        _ => {
            let kind = if citus { server::Kind::Citus } else { server::Kind::Single };
            let server =
                server.insert(Server::start(kind, Durability::Durable).await.context("cannot start PostgreSQL")?);
            server.create_database("oncepay").await?;
            let what = if citus { "Citus coordinator (and two worker nodes)" } else { "PostgreSQL" };
            eprintln!("up: started a throwaway {what} on port {} (deleted on exit)", server.front().port());
            Ok(server.url("oncepay"))
        }
    }
}

/// `spec` allowing merchants' endpoints on this machine (`http://127.0.0.1:…`), as a local run needs
/// and production must not (docs/events.md, "Where an endpoint may point").
fn local_endpoints(spec: Spec) -> Spec {
    spec.setting("events.allow_http", "true").setting("events.allow_private_addresses", "true")
}

/// How `up` sets up each process: what they share (the database, the provider, the logs) and what
/// each one alone is given. Each process gets only its own settings.
struct Processes<'a> {
    bin: &'a Path,
    log_dir: PathBuf,
    /// The throwaway server, if `up` started one.
    server: Option<&'a Server>,
    database_url: &'a str,
    provider: Provider,
    /// The key the simulator takes and the processes call it with.
    provider_key: String,
    /// The secret the provider signs its webhooks with.
    webhook_secret: String,
    /// The RabbitMQ node the api takes payments from.
    amqp_url: &'a str,
    /// The same node, as the workers' user.
    events_amqp_url: &'a str,
}

impl Processes<'_> {
    /// The spec of the process `name` runs as, with what every process gets.
    fn spec(&self, name: &str, program: impl Into<PathBuf>) -> Spec {
        Spec::new(name, program, &self.log_dir).setting("telemetry.log_format", "text").echo(true)
    }

    /// `spec` with its database. On a throwaway server each process signs in as its own `role`
    /// (docs/operating.md, "Database roles"); on a given one, as the URL's user, since only the
    /// server's owner knows how the roles sign in there.
    fn with_database(&self, spec: Spec, role: &str) -> Spec {
        let url = match self.server {
            Some(server) => server.url_as(role, "oncepay"),
            None => self.database_url.to_owned(),
        };
        spec.env("DATABASE_URL", url)
    }

    /// `spec` with its database and the provider it calls.
    fn with_provider(&self, spec: Spec, role: &str) -> Spec {
        let spec = self.with_database(spec, role);
        match self.provider {
            Provider::Simulator => spec
                .setting("provider.base_url", format!("http://127.0.0.1:{SIMULATOR_PORT}"))
                .setting("provider.api_key", &self.provider_key),
            Provider::Localstripe => through_stripe(spec),
        }
    }

    fn reconciler(&self) -> Spec {
        let spec = self.spec("reconciler", self.bin.join("oncepay-reconciler"));
        let spec = self
            .with_provider(spec, "oncepay_reconciler")
            .port(RECONCILER_PORT)
            .setting("operators.port", OPERATIONS_PORT.to_string());
        match self.provider {
            Provider::Simulator => spec.setting_list("webhooks.secrets", &[&self.webhook_secret]),
            Provider::Localstripe => spec.setting_list("webhooks.stripe_secrets", &[&self.webhook_secret]),
        }
    }

    fn worker(&self) -> Spec {
        let spec = self.spec("worker", self.bin.join("oncepay-worker"));
        // Endpoints that are exchanges are published to the same node (docs/events.md).
        let spec = spec.setting("events.broker_url", self.events_amqp_url);
        local_endpoints(self.with_provider(spec, "oncepay_worker").port(WORKER_PORT))
    }

    fn api(&self) -> Spec {
        let spec = self.with_database(self.spec("api", self.bin.join("oncepay-api")), "oncepay_api").port(API_PORT);
        let spec = local_endpoints(spec.setting("broker.url", self.amqp_url).setting("events.allow_exchanges", "true"));
        match self.provider {
            Provider::Simulator => spec,
            // Intake refuses what Stripe could never charge.
            Provider::Localstripe => spec.setting("provider.kind", "stripe").setting("provider.stripe.mode", "direct"),
        }
    }

    /// Starts localstripe with `python`, into `children`, and has it send its webhooks to the
    /// reconciler.
    async fn start_localstripe(&self, root: &Path, python: &Path, children: &mut Vec<Child>) -> anyhow::Result<()> {
        let script = root.join("tests").join("localstripe").join("serve.py");
        let child = localstripe::start(python, &script, LOCALSTRIPE_PORT, self.spec("localstripe", python)).await?;
        children.push(child);
        let to = format!("http://127.0.0.1:{RECONCILER_PORT}/webhooks/stripe");
        localstripe::send_webhooks_to(LOCALSTRIPE_PORT, &to, &self.webhook_secret).await
    }

    /// Starts the simulator, into `children`, and waits until it is ready.
    async fn start_simulator(&self, children: &mut Vec<Child>) -> anyhow::Result<()> {
        let spec = self
            .spec("simulator", self.bin.join("oncepay-simulator"))
            .port(SIMULATOR_PORT)
            .setting("simulator.api_key", &self.provider_key)
            .setting("simulator.webhook_url", format!("http://127.0.0.1:{RECONCILER_PORT}/webhooks/provider"))
            .setting("simulator.webhook_secret", &self.webhook_secret);
        let child = children.push_mut(Child::spawn(spec).await?);
        child.wait_until_ready(&format!("http://127.0.0.1:{SIMULATOR_PORT}/readyz"), Duration::from_secs(60)).await
    }
}

/// `spec` charging through localstripe. localstripe has no Stripe Connect (it ignores
/// `Stripe-Account`, its events name no account): every tenant's payments are charged in the key's
/// account, with Stripe's test card unless a payment names its own.
fn through_stripe(spec: Spec) -> Spec {
    spec.setting("provider.kind", "stripe")
        .setting("provider.stripe.mode", "direct")
        .setting("provider.stripe.base_url", localstripe::url(LOCALSTRIPE_PORT))
        .setting("provider.stripe.secret_key", localstripe::SECRET_KEY)
        .setting("provider.stripe.api_version", localstripe::API_VERSION)
        .setting("provider.stripe.default_payment_method", "pm_card_visa")
}

/// Waits until a process dies on its own (the caller handles Ctrl-C and SIGTERM).
async fn supervise(children: &mut [Child]) -> anyhow::Result<ExitCode> {
    let mut every = tokio::time::interval(Duration::from_millis(500));
    loop {
        every.tick().await;
        for child in children.iter_mut() {
            if let Some(status) = child.try_status()? {
                eprintln!("up: {} exited with {status}; see {}", child.name(), child.log_path().display());
                return Ok(ExitCode::FAILURE);
            }
        }
    }
}

/// Prints where everything runs, the demo tenant's API key, the first admin's token, and
/// ready-to-paste commands to pay and to look at the dead letters.
fn print_banner(bin: &Path, api_key: &str, admin: &Login, approver: &Login, log_dir: &Path, provider: Provider) {
    let client = bin.join("oncepay");
    let (webhooks, provider_line, declined) = match provider {
        Provider::Simulator => (
            "/webhooks/provider",
            format!("simulator   http://127.0.0.1:{SIMULATOR_PORT}/_sim/charges"),
            "pm_card_chargeDeclined",
        ),
        Provider::Localstripe => (
            "/webhooks/stripe",
            format!(
                "localstripe http://127.0.0.1:{LOCALSTRIPE_PORT}/v1/payment_intents   (key {key}; a fake of \
                 Stripe's API, charged through oncepay's Stripe adapter in direct mode: it has no Connect)",
                key = localstripe::SECRET_KEY
            ),
            "pm_card_chargeCustomerFail",
        ),
    };
    let console = match (&admin.password, &approver.password) {
        (Some(password), Some(second)) => format!(
            "Operator console http://127.0.0.1:{OPERATIONS_PORT}/console/\n\
             \x20 sign in as admin with the password {password}   (shown once)\n\
             \x20 or as {APPROVER}, who approves what admin proposes, with the password {second}\n\n"
        ),
        _ => format!(
            "Operator console http://127.0.0.1:{OPERATIONS_PORT}/console/   (sign in with an operator's password)\n\n"
        ),
    };
    let operators = format!(
        "{console}\
         Operations API http://127.0.0.1:{OPERATIONS_PORT}; the operator `admin`'s token (shown once):\n\
         \x20 export ONCEPAY_OPS_URL=http://127.0.0.1:{OPERATIONS_PORT} ONCEPAY_OPS_TOKEN={token}\n\
         \x20 {reconciler} dead-letters list\n\
         \x20 (or curl -s $ONCEPAY_OPS_URL/v1/dead-letters -H \"Authorization: Bearer $ONCEPAY_OPS_TOKEN\")\n",
        token = admin.token,
        reconciler = bin.join("oncepay-reconciler").display(),
    );
    eprintln!(
        "\n\
         ================================================================================\n\
         oncepay is running\n\
         \x20 api         http://127.0.0.1:{API_PORT}   (OpenAPI: /openapi.json)\n\
         \x20 worker      http://127.0.0.1:{WORKER_PORT}/metrics\n\
         \x20 reconciler  http://127.0.0.1:{RECONCILER_PORT}/metrics   (webhooks: {webhooks})\n\
         \x20 {provider_line}\n\
         \x20 logs        {logs}\n\
         \n\
         Demo tenant API key (shown once):\n\
         \x20 {api_key}\n\
         \n\
         Pay with the client, in another terminal:\n\
         \x20 export ONCEPAY_URL=http://127.0.0.1:{API_PORT} ONCEPAY_API_KEY={api_key}\n\
         \x20 {client} pay --amount 1999 --currency EUR --customer customer-42\n\
         \x20 (--payment-method {declined} is declined)\n\
         \n\
         or with curl:\n\
         \x20 curl -si http://127.0.0.1:{API_PORT}/v1/payments -H \"Authorization: Bearer {api_key}\" \\\n\
         \x20      -H \"Idempotency-Key: $(cat /proc/sys/kernel/random/uuid)\" -H 'Content-Type: application/json' \\\n\
         \x20      -d '{{\"amount\":1999,\"currency\":\"EUR\",\"customer_id\":\"customer-42\"}}'\n\
         \n\
         {operators}\
         \n\
         Ctrl-C stops everything.\n\
         ================================================================================\n",
        logs = log_dir.display(),
        client = client.display(),
    );
}

/// How to publish a payment through RabbitMQ, after the banner.
fn print_publishing(bin: &Path, broker: &Broker, tenant: &str) {
    let client = bin.join("oncepay");
    match &broker.producer {
        Some(producer) => eprintln!(
            "Or publish it to RabbitMQ as {tenant}'s broker user {user}:\n\
             \x20 export ONCEPAY_AMQP_URL='{url}'\n\
             \x20 {client} publish --amount 1999 --currency EUR --customer customer-42\n",
            user = producer.user,
            url = producer.url,
            client = client.display(),
        ),
        None => eprintln!(
            "The api takes payments from AMQP_URL's queue too: map a broker user of yours to {tenant} \
             (oncepay-reconciler broker-users add), then {client} publish (docs/broker.md).\n",
            client = client.display(),
        ),
    }
}

/// The operations API's address and an operator's token, as the CLI takes them.
fn as_operator(token: &str) -> [(&'static str, String); 2] {
    [("ONCEPAY_OPS_URL", format!("http://127.0.0.1:{OPERATIONS_PORT}")), ("ONCEPAY_OPS_TOKEN", token.to_owned())]
}

/// Makes the demo tenant (or, if it exists, a new key for it) the way operators do: the admin with
/// `admin` proposes it, the approver with `approver` approves, and the admin collects the key. Returns
/// the API key.
async fn demo_key(reconciler: &Path, admin: &str, approver: &str, tenant: &str) -> anyhow::Result<String> {
    let reason = "the demo tenant of cargo xtask up";
    let proposed =
        match output(reconciler, &["tenants", "create", tenant, "--reason", reason, "--json"], &as_operator(admin))
            .await?
        {
            Some(json) => json,
            None => output(reconciler, &["keys", "issue", tenant, "--reason", reason, "--json"], &as_operator(admin))
                .await?
                .with_context(|| format!("cannot propose tenant {tenant} nor a key for it"))?,
        };
    let proposal_id = approve(reconciler, approver, &proposed, reason).await?;
    let issued = output(reconciler, &["keys", "collect", &proposal_id, "--json"], &as_operator(admin))
        .await?
        .with_context(|| format!("cannot collect the key of proposal {proposal_id}"))?;
    let value: serde_json::Value = serde_json::from_str(&issued).context("the reconciler printed unreadable JSON")?;
    value["api_key"].as_str().map(str::to_owned).context("the reconciler printed no api_key")
}

/// Has the approver with `approver` approve the proposal `proposed` (a command's JSON) describes;
/// returns its id.
async fn approve(reconciler: &Path, approver: &str, proposed: &str, reason: &str) -> anyhow::Result<String> {
    let proposed: serde_json::Value =
        serde_json::from_str(proposed).context("the reconciler printed unreadable JSON")?;
    let proposal_id = proposed["proposal"]["proposal_id"].as_str().context("the reconciler printed no proposal")?;
    output(reconciler, &["proposals", "approve", proposal_id, "--reason", reason], &as_operator(approver))
        .await?
        .with_context(|| format!("the approver could not approve proposal {proposal_id}"))?;
    Ok(proposal_id.to_owned())
}

/// Lets `user` publish the demo tenant's payments, the way operators do: the admin proposes, the
/// approver approves; unless it does already.
async fn demo_broker_user(
    reconciler: &Path,
    admin: &str,
    approver: &str,
    tenant: &str,
    user: &str,
) -> anyhow::Result<()> {
    // On a `DATABASE_URL` used before, the user may publish for the tenant already.
    let listed = output(reconciler, &["broker-users", "list", tenant, "--json"], &as_operator(admin)).await?;
    let mapped = listed
        .and_then(|json| serde_json::from_str::<serde_json::Value>(&json).ok())
        .is_some_and(|list| list["broker_users"].as_array().is_some_and(|users| users.iter().any(|u| u == user)));
    if mapped {
        return Ok(());
    }
    let reason = "the demo tenant's producer in cargo xtask up";
    let proposed =
        output(reconciler, &["broker-users", "add", tenant, user, "--reason", reason, "--json"], &as_operator(admin))
            .await?
            .with_context(|| format!("cannot propose broker user {user} for tenant {tenant}"))?;
    approve(reconciler, approver, &proposed, reason).await.map(drop)
}

/// The second operator, who approves what the admin proposes: made by the admin with `admin`, they
/// set their own password with the enrollment code and sign in for a token of their own, as a person
/// would at the CLI. A database that has operators already takes the token in
/// `ONCEPAY_OPS_APPROVER_TOKEN`, one of an approver's.
async fn approver_login(reconciler: &Path, admin: &Login) -> anyhow::Result<Login> {
    if admin.password.is_none() {
        let token = std::env::var("ONCEPAY_OPS_APPROVER_TOKEN").map_err(|_| {
            anyhow::anyhow!(
                "this database has operators already: set ONCEPAY_OPS_APPROVER_TOKEN to the token of an approver who \
                 is not the admin of ONCEPAY_OPS_TOKEN, or unset DATABASE_URL to run on a throwaway database"
            )
        })?;
        return Ok(Login { token, password: None });
    }
    let reason = "approves what the admin of cargo xtask up proposes";
    let create = ["operators", "create", APPROVER, "--role", "approver", "--reason", reason, "--json"];
    let created =
        output(reconciler, &create, &as_operator(&admin.token)).await?.context("cannot create the approver")?;
    let created: serde_json::Value =
        serde_json::from_str(&created).context("the reconciler printed unreadable JSON")?;
    let code = created["enrollment"]["code"].as_str().context("the reconciler printed no enrollment code")?;
    let password = secrets::hex_token(16);
    let url = [("ONCEPAY_OPS_URL", format!("http://127.0.0.1:{OPERATIONS_PORT}"))];
    let answers = format!("{code}\n{password}\n{password}\n");
    answered(reconciler, &["operators", "enroll", APPROVER], &url, &answers)
        .await?
        .context("the approver cannot enroll")?;
    let sign_in = ["sign-in", "--name", APPROVER, "--label", "cargo xtask up", "--json"];
    let issued =
        answered(reconciler, &sign_in, &url, &format!("{password}\n")).await?.context("the approver cannot sign in")?;
    let issued: serde_json::Value = serde_json::from_str(&issued).context("the reconciler printed unreadable JSON")?;
    let token = issued["token"].as_str().context("the reconciler printed no token")?.to_owned();
    Ok(Login { token, password: Some(password) })
}

/// The second operator `cargo xtask up` makes.
const APPROVER: &str = "approver";

/// The first operator's login: its token, and its password when it was made here.
struct Login {
    token: String,
    password: Option<String>,
}

/// Makes the first operator, `admin`, and returns its login. A database that has operators already
/// (a `DATABASE_URL` used before) takes the token in `ONCEPAY_OPS_TOKEN`, one of an admin's.
async fn admin_login(reconciler: &Path, database_url: &str) -> anyhow::Result<Login> {
    let database = [("DATABASE_URL", database_url.to_owned())];
    let bootstrapped = output(reconciler, &["operators", "bootstrap", "admin", "--json"], &database).await?;
    let Some(issued) = bootstrapped else {
        let token = std::env::var("ONCEPAY_OPS_TOKEN").map_err(|_| {
            anyhow::anyhow!(
                "this database has operators already: set ONCEPAY_OPS_TOKEN to an admin's token, or unset \
                 DATABASE_URL to run on a throwaway database"
            )
        })?;
        return Ok(Login { token, password: None });
    };
    let value: serde_json::Value = serde_json::from_str(&issued).context("the reconciler printed unreadable JSON")?;
    let field = |name: &str| {
        value[name].as_str().map(str::to_owned).with_context(|| format!("the reconciler printed no {name}"))
    };
    Ok(Login { token: field("token")?, password: Some(field("password")?) })
}

/// Runs a reconciler command with `env`; its stdout if it succeeded.
async fn output(program: &Path, args: &[&str], env: &[(&str, String)]) -> anyhow::Result<Option<String>> {
    answered(program, args, env, "").await
}

/// Runs a reconciler command with `env`, writing `input` to what it asks on its standard input; its
/// stdout if it succeeded.
async fn answered(
    program: &Path,
    args: &[&str],
    env: &[(&str, String)],
    input: &str,
) -> anyhow::Result<Option<String>> {
    use tokio::io::AsyncWriteExt as _;
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(key, value)| (*key, value.as_str())))
        .env(setting_variable("telemetry.log_format"), "text")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", program.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).await.context("cannot answer the reconciler's questions")?;
    }
    let output = child.wait_with_output().await.with_context(|| format!("cannot run {}", program.display()))?;
    Ok(output.status.success().then(|| String::from_utf8_lossy(&output.stdout).into_owned()))
}

async fn run_ok(program: &Path, args: &[&str], database_url: &str) -> anyhow::Result<()> {
    let status = Command::new(program)
        .args(args)
        .env("DATABASE_URL", database_url)
        .env(setting_variable("telemetry.log_format"), "text")
        .status()
        .await
        .with_context(|| format!("cannot run {}", program.display()))?;
    if !status.success() {
        bail!("{} {} failed", program.display(), args.join(" "));
    }
    Ok(())
}
