//! The real binaries, started for a phase and stopped after it: the api (one or more processes),
//! the provider simulator, workers and a reconciler; and the reconciler's one-off commands.
//!
//! Each is a child process (`oncepay_devkit::process`) built in the same profile as this benchmark,
//! configured only through the environment as an operator would, logging to the run's log
//! directory, and up once its `/readyz` responds 200. Every setting keeps its documented default
//! unless the run was given overrides; only the api's rate limit is raised (`RATE_LIMIT`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use oncepay_devkit::ports;
use oncepay_devkit::process::{Child, Spec};
use oncepay_devkit::workspace;

/// How long a process may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a process may take to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(60);

/// The simulator's only accepted credential, given to the workers too.
const SIMULATOR_API_KEY: &str = "sk_bench_simulator";

/// The benchmark's requests per second per tenant: far above anything this machine can serve, so
/// the api never responds 429 to the benchmark. The limiter still runs on every request.
const RATE_LIMIT: &str = "10000000";

/// Where the binaries are and how to start them.
pub struct Launcher {
    api: PathBuf,
    worker: PathBuf,
    simulator: PathBuf,
    reconciler: PathBuf,
    log_dir: PathBuf,
    api_env: Vec<(String, String)>,
    worker_env: Vec<(String, String)>,
}

/// A started binary.
pub struct Service {
    child: Child,
    /// The port it serves on (the ops port, for a worker).
    pub port: u16,
}

impl Service {
    /// `127.0.0.1:port`.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `http://127.0.0.1:port`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.address())
    }

    /// SIGTERM, and waits for a clean exit.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let status = self.child.terminate(STOP_GRACE).await?;
        anyhow::ensure!(
            status.success(),
            "{} exited with {status}; see {}",
            self.child.name(),
            self.child.log_path().display()
        );
        Ok(())
    }
}

impl Launcher {
    /// Finds the binaries next to this one; logs go to `log_dir`.
    pub fn new(
        log_dir: &Path,
        api_env: Vec<(String, String)>,
        worker_env: Vec<(String, String)>,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            api: workspace::binary("oncepay-api")?,
            worker: workspace::binary("oncepay-worker")?,
            simulator: workspace::binary("oncepay-simulator")?,
            reconciler: workspace::binary("oncepay-reconciler")?,
            log_dir: log_dir.to_path_buf(),
            api_env,
            worker_env,
        })
    }

    /// Starts an api process named `name` on `database_url`, with `extra` settings by name (after
    /// the run's own overrides, so a phase can set its pool size).
    pub async fn api(&self, name: &str, database_url: &str, extra: &[(&str, String)]) -> anyhow::Result<Service> {
        let port = ports::reserve()?;
        let mut spec = Spec::new(name, &self.api, &self.log_dir)
            .env("DATABASE_URL", database_url)
            .port(port)
            .setting("intake.default_rate_limit_per_second", RATE_LIMIT)
            .setting("intake.default_rate_limit_burst", RATE_LIMIT);
        for (key, value) in &self.api_env {
            spec = spec.env(key, value);
        }
        for (key, value) in extra {
            spec = spec.setting(key, value.as_str());
        }
        start(spec, port).await
    }

    /// Starts a provider simulator named `name` with no faults, taking `latency_ms` over each
    /// request as a provider's processing time.
    pub async fn simulator(&self, name: &str, latency_ms: u64) -> anyhow::Result<Service> {
        let port = ports::reserve()?;
        let spec = Spec::new(name, &self.simulator, &self.log_dir)
            .port(port)
            .setting("simulator.api_key", SIMULATOR_API_KEY)
            .setting("faults.latency_ms", latency_ms.to_string());
        start(spec, port).await
    }

    /// Starts a reconciler named `name` on `database_url` that accepts webhooks signed with
    /// `webhook_secret`, and serves its operations API and console on `operations_port` if given;
    /// its poller looks up nothing (no payment here is `unknown`).
    pub async fn reconciler(
        &self,
        name: &str,
        database_url: &str,
        webhook_secret: &str,
        operations_port: Option<u16>,
    ) -> anyhow::Result<Service> {
        let port = ports::reserve()?;
        let mut spec = Spec::new(name, &self.reconciler, &self.log_dir)
            .arg("serve")
            .env("DATABASE_URL", database_url)
            .port(port)
            .setting_list("webhooks.secrets", &[webhook_secret]);
        if let Some(operations_port) = operations_port {
            spec = spec.setting("operators.port", operations_port.to_string());
        }
        start(spec, port).await
    }

    /// Runs one command of `oncepay-reconciler` on `database_url` (`migrate`, `operators bootstrap
    /// NAME --json` ...), as an operator would, and returns what it printed.
    pub async fn reconciler_command(&self, database_url: &str, args: &[&str]) -> anyhow::Result<String> {
        let output = tokio::process::Command::new(&self.reconciler)
            .args(args)
            .env("DATABASE_URL", database_url)
            .output()
            .await
            .with_context(|| format!("cannot run {}", self.reconciler.display()))?;
        anyhow::ensure!(
            output.status.success(),
            "oncepay-reconciler {} exited with {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(String::from_utf8(output.stdout)?)
    }

    /// Starts worker `n` on `database_url`, sending to `provider`, with `extra` settings by name
    /// (before the run's own overrides, so a run can change what a phase sets).
    pub async fn worker(
        &self,
        n: usize,
        database_url: &str,
        provider: &Service,
        extra: &[(&str, String)],
    ) -> anyhow::Result<Service> {
        let port = ports::reserve()?;
        let mut spec = Spec::new(format!("worker-{n}"), &self.worker, &self.log_dir)
            .env("DATABASE_URL", database_url)
            .port(port)
            .setting("provider.base_url", provider.base_url())
            .setting("provider.api_key", SIMULATOR_API_KEY)
            .setting("worker.id", format!("bench-worker-{n}"));
        for (key, value) in extra {
            spec = spec.setting(key, value.as_str());
        }
        for (key, value) in &self.worker_env {
            spec = spec.env(key, value);
        }
        start(spec, port).await
    }
}

async fn start(spec: Spec, port: u16) -> anyhow::Result<Service> {
    let name = spec.name.clone();
    let mut child = Child::spawn(spec).await.with_context(|| format!("starting {name}"))?;
    child
        .wait_until_ready(&format!("http://127.0.0.1:{port}/readyz"), READY_TIMEOUT)
        .await
        .with_context(|| format!("{name} did not become ready"))?;
    Ok(Service { child, port })
}
