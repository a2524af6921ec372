//! `cargo xtask compose-check`: brings up the real `docker-compose.yml` and pays through it.
//!
//! The file is run as users run it; the check sets only what the file leaves to the environment:
//! random secrets, free ports on 127.0.0.1, and the image name. It cleans up on failure and on
//! Ctrl-C too, and only ever touches the compose project, images and engine it made
//! ([`crate::containers`]).

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use oncepay_devkit::ports;
use serde_json::Value;
use tokio::process::Command;

use crate::containers::{self, Engine};
use crate::secrets;

/// The binaries the image carries (the client too: users run it from the image's shell).
const PACKAGES: [(&str, &str); 5] = [
    ("oncepay-api", "oncepay-api"),
    ("oncepay-worker", "oncepay-worker"),
    ("oncepay-reconciler", "oncepay-reconciler"),
    ("oncepay-simulator", "oncepay-simulator"),
    ("oncepay-client", "oncepay"),
];

/// The services that run once and exit 0 before the others start.
const ONE_SHOTS: [&str; 2] = ["migrate", "db-roles"];
/// How many workers the scaled stack runs.
const WORKERS: usize = 3;
/// Payments in the batch during which the workers restart, half before and half during.
const BATCH: usize = 24;
/// Payments published to RabbitMQ, one of them twice.
const PUBLISHED: usize = 3;
/// The tenant's broker user, a producer made with `rabbitmqctl` as docs/broker.md says.
const PRODUCER: &str = "compose-check-orders";
/// How long `oncepay publish` waits for the api's reply once RabbitMQ confirmed a message.
const REPLY_WITHIN_SECS: &str = "30";
/// How long the whole stack may take to become healthy, and a payment to become final.
const HEALTHY_WITHIN: Duration = Duration::from_secs(180);
const FINAL_WITHIN_SECS: &str = "120";
/// How long taking the stack down may take (each container gets at most 40 s to stop).
const DOWN_WITHIN: Duration = Duration::from_secs(120);
/// How long a command in the reconciler's container that reaches PostgreSQL may take before the
/// check looks at how the container reaches it (making the first operator takes 1 to 4 s).
const SLOW_COMMAND: Duration = Duration::from_secs(6);

/// Builds the binaries, runs the check on a container engine and cleans up. CI runs it after the
/// tests.
pub async fn compose_check(root: &Path) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let mut build = vec!["build", "--bins", "--locked"];
    for (package, _) in PACKAGES {
        build.extend(["--package", package]);
    }
    if !crate::cargo(&build, &[("SQLX_OFFLINE", "true")]).await? {
        bail!("building the binaries failed");
    }
    let bin = crate::target_dir(root).join("debug");

    let run_id = secrets::hex_token(4);
    let engine = Engine::start(&run_id).await?;
    let stack = Stack::new(&engine, root, &bin, &run_id)?;
    let outcome = tokio::select! {
        outcome = check(&stack, root, &bin) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    if outcome.is_err() {
        // What each container was doing, then take down whatever the failed check left up.
        stack.show_state().await;
        stack.down().await;
    }
    stack.remove_images().await;
    engine.stop().await;
    outcome?;
    eprintln!("compose-check: passed in {} s", started.elapsed().as_secs());
    Ok(ExitCode::SUCCESS)
}

/// One compose project of this run: its name, its environment, and the images made for it.
struct Stack<'a> {
    engine: &'a Engine,
    root: &'a Path,
    client: PathBuf,
    project: String,
    image: String,
    api_port: u16,
    simulator_port: u16,
    rabbitmq_port: u16,
    env: Vec<(&'static str, String)>,
}

impl<'a> Stack<'a> {
    fn new(engine: &'a Engine, root: &'a Path, bin: &Path, run_id: &str) -> anyhow::Result<Self> {
        let [api_port, reconciler_port, operations_port, simulator_port, rabbitmq_port] =
            [ports::reserve()?, ports::reserve()?, ports::reserve()?, ports::reserve()?, ports::reserve()?];
        let image = format!("oncepay-compose-check:{run_id}");
        let env = vec![
            ("WEBHOOK_SECRET", secrets::webhook_secret()),
            ("PROVIDER_API_KEY", format!("sk_test_{}", secrets::hex_token(16))),
            ("POSTGRES_PASSWORD", secrets::hex_token(16)),
            ("API_DB_PASSWORD", secrets::hex_token(16)),
            ("WORKER_DB_PASSWORD", secrets::hex_token(16)),
            ("RECONCILER_DB_PASSWORD", secrets::hex_token(16)),
            ("API_BROKER_PASSWORD", secrets::hex_token(16)),
            ("PUBLISH_ADDRESS", "127.0.0.1".to_owned()),
            ("API_PORT", api_port.to_string()),
            ("RECONCILER_PORT", reconciler_port.to_string()),
            ("OPERATIONS_PORT", operations_port.to_string()),
            ("SIMULATOR_PORT", simulator_port.to_string()),
            ("RABBITMQ_PORT", rabbitmq_port.to_string()),
            ("APP_IMAGE", image.clone()),
        ];
        Ok(Stack {
            engine,
            root,
            client: bin.join("oncepay"),
            project: format!("oncepay-check-{run_id}"),
            image,
            api_port,
            simulator_port,
            rabbitmq_port,
            env,
        })
    }

    /// How the reconciler's container reaches PostgreSQL now: its resolver's configuration, and
    /// curl's time to look the name up and to connect (an empty reply is PostgreSQL refusing HTTP,
    /// so connected); and whether the container network's name server (aardvark-dns, a process of
    /// this host) is running. Tells a name lookup that hangs from a connection that does, when a
    /// command in the container could not reach the database. `when` says when it was looked at.
    async fn reaching_postgres(&self, when: &str) -> String {
        let probe = "cat /etc/resolv.conf; curl -sS -m 10 -o /dev/null \
                     -w 'lookup %{time_namelookup} s, connected %{time_connect} s\\n' http://postgres:5432/";
        let inside = match self.compose(&["exec", "-T", "reconciler", "sh", "-c", probe]).output().await {
            Ok(out) => format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
            Err(error) => format!("cannot look into the reconciler's container: {error}"),
        };
        let name_servers = match Command::new("pgrep").args(["-a", "aardvark-dns"]).output().await {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
            Ok(_) => "no aardvark-dns process\n".to_owned(),
            Err(error) => format!("cannot list processes: {error}\n"),
        };
        format!("the reconciler's container, {when}:\n{inside}on this host: {name_servers}")
    }

    /// Waits for `output`, a command that reaches PostgreSQL from the reconciler's container; if it
    /// takes longer than [`SLOW_COMMAND`], looks at how the container reaches PostgreSQL meanwhile
    /// ([`Self::reaching_postgres`]), so that a failure shows the network as it was during the
    /// wait, not only after it.
    async fn output_watched(
        &self,
        output: impl Future<Output = std::io::Result<std::process::Output>>,
    ) -> (std::io::Result<std::process::Output>, Option<String>) {
        tokio::pin!(output);
        tokio::select! {
            done = &mut output => return (done, None),
            () = tokio::time::sleep(SLOW_COMMAND) => {}
        }
        let (done, during) = tokio::join!(output, self.reaching_postgres("during the wait"));
        (done, Some(during))
    }

    /// `compose` on the repository's own `docker-compose.yml`, as this run's project.
    fn compose(&self, args: &[&str]) -> Command {
        let mut command = self.engine.compose();
        command
            .arg("--project-name")
            .arg(&self.project)
            .arg("--file")
            .arg(self.root.join("docker-compose.yml"))
            .arg("--project-directory")
            .arg(self.root)
            .args(args)
            .envs(self.env.iter().map(|(key, value)| (*key, value.as_str())))
            .kill_on_drop(true);
        command
    }

    /// Runs `oncepay-reconciler <args>` in the reconciler's container with the operations API's
    /// address, as the operator with `token` if one is given, writing `input` to what it asks; its
    /// standard output, read as JSON.
    async fn operator(&self, token: Option<&str>, args: &[&str], input: &str) -> anyhow::Result<Value> {
        use tokio::io::AsyncWriteExt as _;
        let url = "ONCEPAY_OPS_URL=http://localhost:8083".to_owned();
        let token = token.map(|token| format!("ONCEPAY_OPS_TOKEN={token}"));
        let mut exec = vec!["exec", "-T", "-e", url.as_str()];
        if let Some(token) = &token {
            exec.extend(["-e", token.as_str()]);
        }
        exec.extend(["reconciler", "oncepay-reconciler", "--json"]);
        exec.extend(args);
        let mut child = self
            .compose(&exec)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("cannot run the reconciler's CLI")?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(input.as_bytes()).await.context("cannot answer the reconciler's CLI")?;
        }
        let output = child.wait_with_output().await.context("cannot run the reconciler's CLI")?;
        ensure!(output.status.success(), "oncepay-reconciler {} failed: {}", args.join(" "), output.status);
        serde_json::from_slice(&output.stdout).context("the reconciler printed unreadable JSON")
    }

    async fn compose_ok(&self, args: &[&str], within: Duration) -> anyhow::Result<()> {
        let what = format!("compose {}", args.join(" "));
        tokio::time::timeout(within, containers::run(&mut self.compose(args), &what))
            .await
            .with_context(|| format!("{what} took more than {} s", within.as_secs()))?
    }

    /// Every container of the project, running or not, with its state. Asked of the engine, in one
    /// call each to list and inspect (compose itself would start once per question).
    async fn containers(&self) -> anyhow::Result<Vec<Container>> {
        let label = format!("label=com.docker.compose.project={}", self.project);
        let listed = self.engine.cli().args(["ps", "--all", "--quiet", "--filter", &label]).output().await?;
        let ids: Vec<String> = String::from_utf8_lossy(&listed.stdout).split_whitespace().map(str::to_owned).collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let inspected = self.engine.cli().arg("inspect").args(&ids).stderr(Stdio::null()).output().await?;
        let inspected: Vec<Value> =
            serde_json::from_slice(&inspected.stdout).context("the engine's inspect printed unreadable JSON")?;
        Ok(inspected
            .iter()
            .map(|container| Container {
                service: container["Config"]["Labels"]["com.docker.compose.service"].as_str().unwrap_or("").to_owned(),
                status: container["State"]["Status"].as_str().unwrap_or("").to_owned(),
                exit_code: container["State"]["ExitCode"].as_i64(),
                health: container["State"]["Health"]["Status"].as_str().map(str::to_owned),
            })
            .collect())
    }

    /// Waits until the one-shots ([`ONE_SHOTS`]) have exited 0 and every other service has its
    /// healthy containers: one each, and `workers` workers.
    async fn wait_until_healthy(&self, workers: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + HEALTHY_WITHIN;
        loop {
            let mut waiting = Vec::new();
            let all = self.containers().await?;
            let of = |service: &str| all.iter().filter(|c| c.service == service).collect::<Vec<_>>();
            for one_shot in ONE_SHOTS {
                let runs = of(one_shot);
                if let Some(failed) = runs.iter().find(|c| c.status == "exited" && c.exit_code != Some(0)) {
                    bail!("{one_shot} exited with {:?}", failed.exit_code);
                }
                if !runs.iter().any(|c| c.status == "exited" && c.exit_code == Some(0)) {
                    waiting.push(one_shot.to_owned());
                }
            }
            for (service, wanted) in
                [("postgres", 1), ("rabbitmq", 1), ("simulator", 1), ("api", 1), ("reconciler", 1), ("worker", workers)]
            {
                let containers = of(service);
                let healthy = containers.iter().filter(|c| c.health.as_deref() == Some("healthy")).count();
                if let Some(dead) = containers.iter().find(|c| c.status == "exited") {
                    bail!("a {service} container exited with {:?}", dead.exit_code);
                }
                if healthy != wanted || containers.len() != wanted {
                    waiting.push(format!("{service} ({healthy} of {wanted} healthy)"));
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("not healthy within {} s: {}", HEALTHY_WITHIN.as_secs(), waiting.join(", "));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Runs the client against the stack's api; its JSON output.
    async fn client(&self, api_key: &str, args: &[&str]) -> anyhow::Result<Value> {
        let url = format!("http://127.0.0.1:{}", self.api_port);
        self.run_client(args, &[("ONCEPAY_URL", &url), ("ONCEPAY_API_KEY", api_key)]).await
    }

    /// Runs the client with `env`; its JSON output.
    async fn run_client(&self, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Value> {
        let output = Command::new(&self.client)
            .arg("--json")
            .args(args)
            .envs(env.iter().copied())
            .output()
            .await
            .context("cannot run the client")?;
        ensure!(
            output.status.success(),
            "oncepay {} ended with {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        serde_json::from_slice(&output.stdout).context("the client printed unreadable JSON")
    }

    /// Pays `amount` cents; the payment's id. With `wait`, also checks that it succeeded.
    async fn pay(&self, api_key: &str, amount: i64, wait: bool) -> anyhow::Result<Paid> {
        let amount_arg = amount.to_string();
        let mut args = vec!["pay", "--amount", &amount_arg, "--currency", "EUR", "--customer", "cus_compose_check"];
        if wait {
            args.extend(["--wait", FINAL_WITHIN_SECS]);
        } else {
            args.push("--no-wait");
        }
        let paid = self.client(api_key, &args).await?;
        let id = paid["payment"]["id"].as_str().context("the client printed no payment id")?.to_owned();
        if wait {
            ensure!(paid["payment"]["status"] == "succeeded", "payment {id} ended {}", paid["payment"]["status"]);
        }
        Ok(Paid { id, amount })
    }

    /// Makes the broker user [`PRODUCER`] as an operator does, with `rabbitmqctl` in the rabbitmq
    /// container and the permissions docs/broker.md gives a producer; its AMQP URL on this host.
    async fn producer(&self) -> anyhow::Result<String> {
        let password = secrets::hex_token(16);
        let add = ["add_user", PRODUCER, password.as_str()];
        let permissions = ["set_permissions", "-p", "/", PRODUCER, r"^amq\.gen-.*", r"^amq\.default$", r"^amq\.gen-.*"];
        for args in [&add[..], &permissions[..]] {
            let mut exec = vec!["exec", "-T", "rabbitmq", "rabbitmqctl", "-q"];
            exec.extend(args);
            // Named by its command alone: the password is on its command line.
            let what = format!("rabbitmqctl {}", args[0]);
            let ran = tokio::time::timeout(Duration::from_secs(60), self.compose(&exec).stdout(Stdio::null()).status())
                .await
                .with_context(|| format!("{what} took more than 60 s"))?
                .with_context(|| format!("cannot run {what}"))?;
            ensure!(ran.success(), "{what} failed: {ran}");
        }
        Ok(format!("amqp://{PRODUCER}:{password}@127.0.0.1:{}/%2f", self.rabbitmq_port))
    }

    /// Publishes a payment of `amount` cents to RabbitMQ with `oncepay publish` as the broker user of
    /// `amqp_url`, under `key` if one is given, and waits for the api's reply: the payment, its key
    /// and whether the api replayed it.
    async fn publish(&self, amqp_url: &str, amount: i64, key: Option<&str>) -> anyhow::Result<Published> {
        let amount_arg = amount.to_string();
        let mut args = vec!["publish", "--amount", &amount_arg, "--currency", "EUR", "--customer", "cus_compose_check"];
        args.extend(["--wait", REPLY_WITHIN_SECS]);
        if let Some(key) = key {
            args.extend(["--key", key]);
        }
        let published = self.run_client(&args, &[("ONCEPAY_AMQP_URL", amqp_url)]).await?;
        let id = published["payment"]["id"].as_str().context("the client printed no payment id")?.to_owned();
        let key = published["idempotency_key"].as_str().context("the client printed no idempotency key")?.to_owned();
        let replayed = published["replayed"].as_bool().context("the client printed no replayed flag")?;
        Ok(Published { paid: Paid { id, amount }, key, replayed })
    }

    /// Follows a payment until it is final; checks that it succeeded.
    async fn settled(&self, api_key: &str, paid: &Paid) -> anyhow::Result<()> {
        let payment = self.client(api_key, &["status", &paid.id, "--wait", FINAL_WITHIN_SECS]).await?;
        ensure!(payment["status"] == "succeeded", "payment {} ended {}", paid.id, payment["status"]);
        Ok(())
    }

    /// Checks the simulator's record: exactly one succeeded charge of the right amount for each
    /// payment, and no other charge at all.
    async fn charged_once_each(&self, payments: &[Paid]) -> anyhow::Result<()> {
        let url = format!("http://127.0.0.1:{}/_sim/charges", self.simulator_port);
        let output = Command::new("curl").args(["-fsS", &url]).output().await.context("cannot run curl")?;
        ensure!(output.status.success(), "GET {url} failed: {}", String::from_utf8_lossy(&output.stderr));
        let truth: Value = serde_json::from_slice(&output.stdout).context("the simulator sent unreadable JSON")?;
        let charges = truth["charges"].as_array().context("the simulator sent no charges")?;
        for paid in payments {
            let theirs: Vec<&Value> =
                charges.iter().filter(|charge| charge["metadata"]["oncepay_payment_id"] == paid.id.as_str()).collect();
            ensure!(theirs.len() == 1, "payment {} has {} charges at the simulator, not 1", paid.id, theirs.len());
            ensure!(
                theirs[0]["status"] == "succeeded" && theirs[0]["amount"] == paid.amount,
                "payment {} of {} was charged as {}",
                paid.id,
                paid.amount,
                theirs[0]
            );
        }
        ensure!(
            charges.len() == payments.len(),
            "the simulator holds {} charges for {} payments",
            charges.len(),
            payments.len()
        );
        Ok(())
    }

    /// On failure: what each container was doing, and the end of its log.
    async fn show_state(&self) {
        let _ = self.compose(&["ps"]).status().await;
        let _ = self.compose(&["logs", "--no-color", "--tail", "40"]).status().await;
    }

    /// Takes the project down with its volumes.
    async fn down(&self) {
        if let Err(error) =
            self.compose_ok(&["down", "--volumes", "--remove-orphans", "--timeout", "10"], DOWN_WITHIN).await
        {
            eprintln!("compose-check: {error:#}");
        }
    }

    /// Removes the image made for the project.
    async fn remove_images(&self) {
        // Quietly: an image that was never made is nothing to remove.
        let _ = self
            .engine
            .cli()
            .args(["rmi", "--force", &self.image])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
    }
}

/// What the check needs to know of a container.
struct Container {
    service: String,
    status: String,
    exit_code: Option<i64>,
    health: Option<String>,
}

/// A payment the check made.
struct Paid {
    id: String,
    amount: i64,
}

/// A payment request the check published, as the api's reply describes it.
struct Published {
    paid: Paid,
    key: String,
    replayed: bool,
}

/// The image (the Dockerfile's runtime stage around the binaries built here); every service up and
/// healthy; the first operator made with the reconciler's CLI inside its container, a second one who
/// enrolls, and a tenant proposed by the first and approved by the second through the operations
/// API; a payment that succeeds with exactly one charge at the simulator; the same with three
/// workers; the workers restarted in the middle of a batch, every payment settling with one charge;
/// a broker user mapped to the tenant with four eyes, payments published to RabbitMQ as it (one of
/// them twice, the second time a replay), each settling with one charge; and everything down with
/// its volumes.
async fn check(stack: &Stack<'_>, root: &Path, bin: &Path) -> anyhow::Result<()> {
    let mut phase = Phase::start("images");
    if stack.engine.needs_stand_ins() {
        containers::make_stand_ins(stack.engine, root, &crate::target_dir(root).join("compose-check")).await?;
    }
    let binaries: Vec<PathBuf> = PACKAGES.iter().map(|(_, binary)| bin.join(binary)).collect();
    containers::build_runtime_image(stack.engine, root, &binaries, &stack.image).await?;

    phase.next("up");
    let _health_checks = HealthChecks(stack.engine.tick_health_checks(&stack.project));
    stack.compose_ok(&["up", "--detach", "--no-build"], HEALTHY_WITHIN).await?;
    stack.wait_until_healthy(1).await?;

    phase.next("first payment");
    let bootstrap =
        ["exec", "-T", "reconciler", "oncepay-reconciler", "operators", "bootstrap", "compose-check", "--json"];
    let (bootstrapped, during) = stack.output_watched(stack.compose(&bootstrap).output()).await;
    let bootstrapped = bootstrapped?;
    if !bootstrapped.status.success() {
        bail!(
            "making the first operator failed: {}: {}\n{}{}",
            bootstrapped.status,
            String::from_utf8_lossy(&bootstrapped.stderr).trim(),
            during.unwrap_or_default(),
            stack.reaching_postgres("afterwards").await
        );
    }
    let bootstrapped: Value =
        serde_json::from_slice(&bootstrapped.stdout).context("the reconciler printed unreadable JSON")?;
    let admin = bootstrapped["token"].as_str().context("the reconciler printed no token")?;
    let approver = approver(stack, admin).await?;
    let create = ["tenants", "create", "compose-check", "--reason", "compose-check"];
    let proposed = stack.operator(Some(admin), &create, "").await?;
    let proposal_id = proposed["proposal"]["proposal_id"].as_str().context("the reconciler printed no proposal")?;
    stack.operator(Some(&approver), &["proposals", "approve", proposal_id, "--reason", "compose-check"], "").await?;
    let created = stack.operator(Some(admin), &["keys", "collect", proposal_id], "").await?;
    let api_key = created["api_key"].as_str().context("the reconciler printed no api_key")?.to_owned();
    let mut payments = vec![stack.pay(&api_key, 1999, true).await?];
    stack.charged_once_each(&payments).await?;

    phase.next("three workers");
    let scale = format!("worker={WORKERS}");
    stack.compose_ok(&["up", "--detach", "--no-build", "--scale", &scale], HEALTHY_WITHIN).await?;
    stack.wait_until_healthy(WORKERS).await?;
    payments.push(stack.pay(&api_key, 2500, true).await?);
    stack.charged_once_each(&payments).await?;

    phase.next("workers restarted mid-batch");
    let mut batch = Vec::new();
    for i in 0..BATCH / 2 {
        batch.push(stack.pay(&api_key, 100 + i64::try_from(i)?, false).await?);
    }
    let mut restart = stack.compose(&["restart", "--timeout", "40", "worker"]);
    let restart = restart.status();
    let rest = async {
        let mut rest = Vec::new();
        for i in BATCH / 2..BATCH {
            rest.push(stack.pay(&api_key, 100 + i64::try_from(i)?, false).await?);
        }
        anyhow::Ok(rest)
    };
    let (restarted, rest) = tokio::join!(restart, rest);
    ensure!(restarted?.success(), "restarting the workers failed");
    batch.extend(rest?);
    stack.wait_until_healthy(WORKERS).await?;
    for paid in &batch {
        stack.settled(&api_key, paid).await?;
    }
    payments.extend(batch);
    stack.charged_once_each(&payments).await?;

    phase.next("payments from RabbitMQ");
    let amqp_url = stack.producer().await?;
    let add = ["broker-users", "add", "compose-check", PRODUCER, "--reason", "compose-check"];
    let proposed = stack.operator(Some(admin), &add, "").await?;
    let proposal_id = proposed["proposal"]["proposal_id"].as_str().context("the reconciler printed no proposal")?;
    stack.operator(Some(&approver), &["proposals", "approve", proposal_id, "--reason", "compose-check"], "").await?;
    let mut published = Vec::new();
    for i in 0..PUBLISHED {
        let message = stack.publish(&amqp_url, 300 + i64::try_from(i)?, None).await?;
        ensure!(!message.replayed, "the api replayed payment {} at its first message", message.paid.id);
        published.push(message);
    }
    // The first request again, with its key: a producer's re-publish, which must be the same payment.
    let first = &published[0];
    let again = stack.publish(&amqp_url, first.paid.amount, Some(&first.key)).await?;
    ensure!(
        again.replayed && again.paid.id == first.paid.id,
        "the request published again with key {} became payment {} (replayed: {}), not a replay of {}",
        first.key,
        again.paid.id,
        again.replayed,
        first.paid.id
    );
    for message in &published {
        stack.settled(&api_key, &message.paid).await?;
    }
    payments.extend(published.into_iter().map(|message| message.paid));
    stack.charged_once_each(&payments).await?;

    phase.next("down");
    stack.compose_ok(&["down", "--volumes", "--remove-orphans", "--timeout", "40"], DOWN_WITHIN).await?;
    phase.end();
    eprintln!("compose-check: {} payments, each charged once", payments.len());
    Ok(())
}

/// A second operator, an approver, as a person becomes one: the admin with `admin` creates them, they
/// set their own password with the enrollment code and sign in for a token of their own. Returns the
/// token.
async fn approver(stack: &Stack<'_>, admin: &str) -> anyhow::Result<String> {
    let create = ["operators", "create", "approver", "--role", "approver", "--reason", "compose-check"];
    let created = stack.operator(Some(admin), &create, "").await?;
    let code = created["enrollment"]["code"].as_str().context("the reconciler printed no enrollment code")?;
    let password = secrets::hex_token(16);
    stack.operator(None, &["operators", "enroll", "approver"], &format!("{code}\n{password}\n{password}\n")).await?;
    let signed_in = stack.operator(None, &["sign-in", "--name", "approver"], &format!("{password}\n")).await?;
    signed_in["token"].as_str().map(str::to_owned).context("the reconciler printed no token")
}

/// Stops the health check ticks when dropped, however the check ends.
struct HealthChecks(Option<tokio::task::JoinHandle<()>>);

impl Drop for HealthChecks {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// Says how long each phase of the check took.
struct Phase {
    name: &'static str,
    started: Instant,
}

impl Phase {
    fn start(name: &'static str) -> Self {
        eprintln!("compose-check: {name}");
        Phase { name, started: Instant::now() }
    }

    fn next(&mut self, name: &'static str) {
        self.end();
        *self = Phase::start(name);
    }

    fn end(&self) {
        eprintln!("compose-check: {} took {:.1} s", self.name, self.started.elapsed().as_secs_f64());
    }
}
