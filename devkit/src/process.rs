//! Supervised child processes: the real oncepay binaries, started by the run command, the
//! cross-process tests and the harness.
//!
//! Each child's stdout and stderr are copied line by line to a log file and, optionally, to the
//! console with a `[name]` prefix. Children are killed when dropped, so a failing test leaves
//! nothing behind.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::wait::wait_until;

/// How to start a child.
#[derive(Debug, Clone)]
pub struct Spec {
    /// A short name for logs, e.g. `api-1`.
    pub name: String,
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Where the log file goes (`<dir>/<name>.log`).
    pub log_dir: PathBuf,
    /// Also print each line to stdout, prefixed with `[name]`.
    pub echo: bool,
}

/// Set `TEST_LOG` (to anything) to see every child's output as it runs, e.g.
/// `TEST_LOG=1 cargo xtask test -- --no-capture <test>`; the log files are kept either way.
fn echo_by_default() -> bool {
    std::env::var_os("TEST_LOG").is_some()
}

impl Spec {
    /// A spec with no arguments or environment that logs to `log_dir`, echoing to the console if
    /// `TEST_LOG` is set.
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>, log_dir: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            log_dir: log_dir.into(),
            echo: echo_by_default(),
        }
    }

    /// Adds an argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets one of an oncepay process's settings, named as in its configuration file
    /// (`"provider.base_url"`, `"poller.backoff.base_ms"`). This is the one place outside the
    /// processes' own configuration that spells the variable carrying it,
    /// `ONCEPAY_<SECTION>__<KEY>` (`ONCEPAY_PROVIDER__BASE_URL`).
    pub fn setting(self, key: &str, value: impl Into<String>) -> Self {
        self.env(setting_variable(key), value)
    }

    /// Sets a list setting (`"webhooks.secrets"`), as the JSON array the processes read from the
    /// environment.
    pub fn setting_list(self, key: &str, values: &[&str]) -> Self {
        let list = serde_json::to_string(values).unwrap_or_else(|_| unreachable!("strings are always JSON"));
        self.setting(key, list)
    }

    /// The port its HTTP server listens on (`http.port`).
    pub fn port(self, port: u16) -> Self {
        self.setting("http.port", port.to_string())
    }

    /// Echoes the child's output to the console.
    pub fn echo(mut self, echo: bool) -> Self {
        self.echo = echo;
        self
    }
}

/// The environment variable that carries the setting `key` of an oncepay process: `ONCEPAY_`, then
/// the key's sections upper-cased and joined by `__`.
pub fn setting_variable(key: &str) -> String {
    format!("ONCEPAY_{}", key.to_uppercase().replace('.', "__"))
}

/// A running child.
pub struct Child {
    spec: Spec,
    child: tokio::process::Child,
    log_path: PathBuf,
    /// The tasks copying its stdout and stderr into the log; they end when the process exits.
    copiers: Vec<tokio::task::JoinHandle<()>>,
}

impl Child {
    /// Starts a child.
    pub async fn spawn(spec: Spec) -> anyhow::Result<Self> {
        tokio::fs::create_dir_all(&spec.log_dir).await.context("cannot create the log directory")?;
        let log_path = spec.log_dir.join(format!("{}.log", spec.name));
        let log = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .await
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let mut child = Command::new(&spec.program)
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", spec.program.display()))?;
        let log = std::sync::Arc::new(tokio::sync::Mutex::new(log));
        let mut copiers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            copiers.push(tokio::spawn(copy_lines(stdout, log.clone(), spec.echo.then(|| spec.name.clone()))));
        }
        if let Some(stderr) = child.stderr.take() {
            copiers.push(tokio::spawn(copy_lines(stderr, log, spec.echo.then(|| spec.name.clone()))));
        }
        Ok(Self { spec, child, log_path, copiers })
    }

    /// The name it was started with.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The spec it was started with, to start it again.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    fn pid(&self) -> anyhow::Result<Pid> {
        let id = self.child.id().context("the process has already exited")?;
        Ok(Pid::from_raw(i32::try_from(id)?))
    }

    fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        kill(self.pid()?, signal).with_context(|| format!("cannot send {signal} to {}", self.spec.name))
    }

    /// SIGKILL, and wait for it to be gone.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await.with_context(|| format!("cannot kill {}", self.spec.name))
    }

    /// SIGTERM; SIGKILL if it has not exited within `grace`. Returns how it exited.
    pub async fn terminate(&mut self, grace: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        self.signal(Signal::SIGTERM)?;
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                self.kill().await?;
                bail!("{} did not exit within {grace:?} of SIGTERM and was killed", self.spec.name)
            }
        }
    }

    /// SIGSTOP: the process freezes, mid-whatever, holding its connections and leases.
    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// SIGCONT.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal(Signal::SIGCONT)
    }

    /// Whether it has exited, and how.
    pub fn try_status(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits up to `timeout` for the process to exit by itself; then everything it printed is in its
    /// log. Returns how it exited.
    pub async fn exited(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .with_context(|| format!("{} was still running after {timeout:?}", self.spec.name))??;
        // The pipes close with the process (unless something it started holds them: then give up).
        for copier in self.copiers.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), copier).await;
        }
        Ok(status)
    }

    /// Waits until `GET url` responds 200, failing early if the process exits.
    pub async fn wait_until_ready(&mut self, url: &str, timeout: Duration) -> anyhow::Result<()> {
        // reqwest is built without a bundled crypto provider; ring is the workspace's choice.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let what = format!("{} to be ready at {url} (see {})", self.spec.name, self.log_path.display());
        let ready = wait_until(&what, timeout, || {
            let exited = self.child.try_wait();
            let client = &client;
            async move {
                match exited {
                    Err(error) => Some(Err(error.into())),
                    Ok(Some(status)) => Some(Err(anyhow::anyhow!("exited with {status} before it was ready"))),
                    Ok(None) => match client.get(url).send().await {
                        Ok(response) if response.status().is_success() => Some(Ok(())),
                        _ => None,
                    },
                }
            }
        })
        .await?;
        if let Err(error) = ready {
            let _ = self.exited(Duration::ZERO).await;
            // The log's directory may be gone by the time anyone reads the error: quote its start,
            // where a failed start says why (a backtrace follows).
            let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
            let start: Vec<&str> = log.lines().take(6).collect();
            bail!("{} {error}; the start of {}:\n{}", self.spec.name, self.log_path.display(), start.join("\n"));
        }
        Ok(())
    }

    /// The log so far.
    pub async fn log(&self) -> anyhow::Result<String> {
        Ok(tokio::fs::read_to_string(&self.log_path).await?)
    }
}

async fn copy_lines(
    stream: impl AsyncRead + Unpin,
    log: std::sync::Arc<tokio::sync::Mutex<tokio::fs::File>>,
    echo_prefix: Option<String>,
) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(prefix) = &echo_prefix {
            let mut stdout = tokio::io::stdout();
            let _ = stdout.write_all(format!("[{prefix}] {line}\n").as_bytes()).await;
        }
        let mut file = log.lock().await;
        let _ = file.write_all(line.as_bytes()).await;
        let _ = file.write_all(b"\n").await;
    }
}
