//! A real browser for the console's tests: chromedriver as a child process on a loopback port,
//! WebDriver sessions on headless Chromium through it, and axe-core run in the open page.
//!
//! `cargo xtask test` installs Debian's `chromium` and `chromium-driver` and axe-core from npm, and
//! names them in [`CHROMEDRIVER_VARIABLE`], [`CHROMIUM_VARIABLE`] and [`AXE_CORE_VARIABLE`]. Scripts
//! run over WebDriver are not subject to the page's Content-Security-Policy, so axe-core works on
//! pages that allow no inline scripts.

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use fantoccini::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use serde_json::json;
use tempfile::TempDir;

use crate::ports;
use crate::process::{Child, Spec};

/// The variable naming chromedriver; [`DEFAULT_CHROMEDRIVER`] when unset.
pub const CHROMEDRIVER_VARIABLE: &str = "CHROMEDRIVER";

/// The variable naming the Chromium binary; [`DEFAULT_CHROMIUM`] when unset.
pub const CHROMIUM_VARIABLE: &str = "CHROMIUM";

/// The variable naming axe-core's `axe.min.js`.
pub const AXE_CORE_VARIABLE: &str = "AXE_CORE_SCRIPT";

/// Where Debian's `chromium-driver` puts chromedriver.
pub const DEFAULT_CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Where Debian's `chromium` puts Chromium.
pub const DEFAULT_CHROMIUM: &str = "/usr/bin/chromium";

/// How long chromedriver may take to start.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How Chromium runs for a session, besides its profile.
const CHROMIUM_ARGS: [&str; 11] = [
    "--headless=new",
    // The tests run as root, where Chromium's sandbox cannot start.
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
    // Chromium exits when chromedriver does, even when it is killed, instead of outliving it.
    "--remote-debugging-pipe",
];

/// The impacts of the axe-core violations that [`axe`] reports.
const REPORTED_IMPACTS: [&str; 2] = ["serious", "critical"];

/// Runs the injected axe-core on the whole page and hands back the violations of the given impacts,
/// or the error.
const RUN_AXE: &str = "
    const [impacts, done] = arguments;
    axe.run(document, { resultTypes: ['violations'] }).then(
        (results) => done({ violations: results.violations
            .filter((violation) => impacts.includes(violation.impact))
            .map((violation) => ({
                id: violation.id,
                impact: violation.impact,
                help: violation.help,
                nodes: violation.nodes.map((node) => node.target.join(' ')),
            })) }),
        (error) => done({ error: String(error) }),
    );
";

/// A running chromedriver.
pub struct Browser {
    child: Child,
    port: u16,
}

impl Browser {
    /// Starts chromedriver on a free loopback port, logging to `log_dir`, and waits until it is
    /// ready for sessions.
    pub async fn start(log_dir: &Path) -> anyhow::Result<Self> {
        let chromedriver = path_from(CHROMEDRIVER_VARIABLE, DEFAULT_CHROMEDRIVER);
        let port = ports::reserve()?;
        let spec = Spec::new("chromedriver", &chromedriver, log_dir).arg(format!("--port={port}"));
        let mut child = Child::spawn(spec).await.with_context(|| {
            format!(
                "cannot start chromedriver ({}): run the suite with `cargo xtask test`, which installs it, or set \
                 {CHROMEDRIVER_VARIABLE}",
                chromedriver.display()
            )
        })?;
        child.wait_until_ready(&format!("http://127.0.0.1:{port}/status"), READY_TIMEOUT).await?;
        Ok(Self { child, port })
    }

    /// Opens a new session on headless Chromium with a fresh profile.
    pub async fn session(&self) -> anyhow::Result<Session> {
        let chromium = path_from(CHROMIUM_VARIABLE, DEFAULT_CHROMIUM);
        let profile = tempfile::Builder::new().prefix("oncepay-chromium-").tempdir()?;
        let mut args = CHROMIUM_ARGS.map(str::to_owned).to_vec();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        let mut capabilities = fantoccini::wd::Capabilities::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert("goog:chromeOptions".into(), json!({ "binary": chromium, "args": args }));
        let client = fantoccini::ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .with_context(|| {
                format!(
                    "cannot open a session on {}: run the suite with `cargo xtask test`, which installs Chromium, \
                     or set {CHROMIUM_VARIABLE}",
                    chromium.display()
                )
            })?;
        Ok(Session { client, _profile: profile })
    }

    /// Stops chromedriver, and with it every browser it started.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.child.terminate(Duration::from_secs(5)).await.map(|_| ())
    }
}

/// A WebDriver session: a [`Client`], and the profile directory its browser uses.
pub struct Session {
    client: Client,
    /// Removed when the session is dropped.
    _profile: TempDir,
}

impl Session {
    /// Ends the session and closes its browser, then removes its profile.
    pub async fn close(self) -> anyhow::Result<()> {
        self.client.close().await.context("cannot end the WebDriver session")
    }
}

impl Deref for Session {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

/// An accessibility problem axe-core found in a page.
#[derive(Debug, Clone, Deserialize)]
pub struct Violation {
    /// The axe-core rule, e.g. `image-alt`.
    pub id: String,
    /// How much it hinders people: `serious` or `critical`.
    pub impact: String,
    /// What the rule asks for.
    pub help: String,
    /// The CSS selectors of the elements that break it.
    pub nodes: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}, at {}", self.id, self.impact, self.help, self.nodes.join(", "))
    }
}

/// What [`RUN_AXE`] hands back.
#[derive(Deserialize)]
#[serde(untagged)]
enum AxeOutcome {
    Ran { violations: Vec<Violation> },
    Failed { error: String },
}

/// Runs axe-core (from [`AXE_CORE_VARIABLE`]) on the page open in `client` and returns its serious
/// and critical violations.
pub async fn axe(client: &Client) -> anyhow::Result<Vec<Violation>> {
    let Some(path) = std::env::var_os(AXE_CORE_VARIABLE) else {
        bail!(
            "{AXE_CORE_VARIABLE} is not set: run the suite with `cargo xtask test`, which installs axe-core, or set \
             it to axe.min.js of an installed axe-core"
        )
    };
    let path = PathBuf::from(path);
    let script = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    client.execute(&script, vec![]).await.context("cannot inject axe-core into the page")?;
    let outcome = client.execute_async(RUN_AXE, vec![json!(REPORTED_IMPACTS)]).await.context("cannot run axe-core")?;
    match serde_json::from_value(outcome).context("axe-core's results have an unexpected shape")? {
        AxeOutcome::Ran { violations } => Ok(violations),
        AxeOutcome::Failed { error } => bail!("axe-core failed: {error}"),
    }
}

/// The path in `variable`, or `default` when it is unset.
fn path_from(variable: &str, default: &str) -> PathBuf {
    std::env::var_os(variable).map_or_else(|| PathBuf::from(default), PathBuf::from)
}
