//! A real OpenID provider as a child process: `oidc-provider` from npm under Node, run by the
//! project's `tests/oidc/serve.mjs` on a loopback port, with the clients it is given. Anyone signs
//! in with any name at its login page; the name is the identity's `sub`.
//!
//! `cargo xtask test` installs it into the target directory and names the script in
//! [`SCRIPT_VARIABLE`]; the operator sign-in tests start it from there.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::ports;
use crate::process::{Child, Spec};

/// The variable naming the installed `serve.mjs`. Not `ONCEPAY_…`: oncepay's processes read those
/// as their configuration.
pub const SCRIPT_VARIABLE: &str = "OIDC_PROVIDER_SCRIPT";

/// How long the provider may take to start.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A client registered at the provider.
#[derive(Debug, Clone, Serialize)]
pub struct Client {
    /// Its id.
    pub client_id: String,
    /// Its secret.
    pub client_secret: String,
    /// Where the provider may send the browser back.
    pub redirect_uris: Vec<String>,
}

/// A running provider.
pub struct OidcProvider {
    child: Child,
    issuer: String,
    port: u16,
}

impl OidcProvider {
    /// The installed script, from [`SCRIPT_VARIABLE`].
    pub fn script() -> anyhow::Result<PathBuf> {
        match std::env::var_os(SCRIPT_VARIABLE) {
            Some(script) => Ok(PathBuf::from(script)),
            None => bail!(
                "{SCRIPT_VARIABLE} is not set: run the suite with `cargo xtask test`, which installs the OpenID \
                 provider, or set it to tests/oidc/serve.mjs in a directory where `npm ci` ran"
            ),
        }
    }

    /// Starts the provider on a free loopback port with `clients`, naming itself `issuer` (`None`:
    /// its own address), logging to `log_dir`, and waits until it serves its discovery document.
    pub async fn start(clients: &[Client], issuer: Option<&str>, log_dir: &Path) -> anyhow::Result<Self> {
        let script = Self::script()?;
        let port = ports::reserve()?;
        let address = format!("http://127.0.0.1:{port}");
        let issuer = issuer.map_or_else(|| address.clone(), str::to_owned);
        let spec = Spec::new("oidc-provider", "node", log_dir)
            .arg(script.to_string_lossy())
            .env("OIDC_PORT", port.to_string())
            .env("OIDC_ISSUER", &issuer)
            .env("OIDC_CLIENTS", serde_json::to_string(clients)?);
        let mut child = Child::spawn(spec).await.context("cannot start the OpenID provider (is node installed?)")?;
        child.wait_until_ready(&format!("{address}/.well-known/openid-configuration"), READY_TIMEOUT).await?;
        Ok(Self { child, issuer, port })
    }

    /// The issuer it names itself with.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Its address.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops it.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.child.terminate(Duration::from_secs(5)).await.map(|_| ())
    }
}
