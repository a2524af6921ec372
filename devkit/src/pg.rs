//! A throwaway PostgreSQL cluster in a temporary directory, from the installed server binaries.
//!
//! The server listens on 127.0.0.1 on a free port and on a socket inside the directory, with
//! `trust` authentication for the `postgres` role. Dropping a [`Cluster`] stops the server and
//! deletes everything.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use nix::unistd::{Uid, User};
use tokio::process::Command;

use crate::wait::wait_until;

/// How much durability to trade for speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// PostgreSQL's defaults (`fsync`, `synchronous_commit` on): for benchmarks and crash tests.
    Durable,
    /// No fsync and no full-page writes: a crash of the machine may lose data, a crash of
    /// PostgreSQL (`crash()`) does not, because commits still wait for their WAL to be written to
    /// the operating system. For tests.
    Fast,
}

/// A server certificate and its private key, both PEM.
pub struct Tls<'a> {
    /// The certificate (with its chain, if any).
    pub certificate_pem: &'a str,
    /// The certificate's private key.
    pub key_pem: &'a str,
}

/// A running throwaway cluster.
pub struct Cluster {
    dir: tempfile::TempDir,
    bin_dir: PathBuf,
    owner: Option<User>,
    port: u16,
    durability: Durability,
    /// Server settings on top of the defaults, as `-c name=value`.
    settings: Vec<(String, String)>,
    running: bool,
}

impl Cluster {
    /// Creates and starts a cluster.
    pub async fn start(durability: Durability) -> anyhow::Result<Self> {
        Self::start_with(durability, &[]).await
    }

    /// Creates and starts a cluster with server `settings` on top of the defaults, e.g.
    /// `shared_preload_libraries`.
    pub async fn start_with(durability: Durability, settings: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut cluster = Self::create(durability, settings).await?;
        cluster.resume().await?;
        Ok(cluster)
    }

    /// Creates and starts a cluster that takes TCP connections over TLS only, with `tls`'s
    /// certificate (the socket inside the directory stays plain, for `psql`).
    pub async fn start_with_tls(durability: Durability, tls: &Tls<'_>) -> anyhow::Result<Self> {
        let mut cluster = Self::create(durability, &[("ssl", "on")]).await?;
        let data = cluster.dir.path().join("data");
        cluster.write_private(&data.join("server.crt"), tls.certificate_pem)?;
        cluster.write_private(&data.join("server.key"), tls.key_pem)?;
        let hba = "local all all trust\n\
                   hostssl all all 127.0.0.1/32 trust\n\
                   hostnossl all all 0.0.0.0/0 reject\n";
        cluster.write_private(&data.join("pg_hba.conf"), hba)?;
        cluster.resume().await?;
        Ok(cluster)
    }

    /// A stopped cluster, fresh from `initdb`.
    async fn create(durability: Durability, settings: &[(&str, &str)]) -> anyhow::Result<Self> {
        let bin_dir = find_bin_dir().await?;
        let owner = unprivileged_owner()?;
        let dir = tempfile::Builder::new()
            .prefix("oncepay-pg-")
            .tempdir()
            .context("cannot create a temporary directory for PostgreSQL")?;
        if let Some(user) = &owner {
            std::os::unix::fs::chown(dir.path(), Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .context("cannot hand the temporary directory to the PostgreSQL user")?;
        }
        let settings = settings.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect();
        let cluster =
            Self { dir, bin_dir, owner, port: crate::ports::reserve()?, durability, settings, running: false };
        cluster
            .run_tool(
                "initdb",
                &[
                    "-D",
                    &cluster.data_dir_str(),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-instructions",
                ],
            )
            .await
            .context("initdb failed")?;
        Ok(cluster)
    }

    /// Writes `contents` to `path`, readable by the server's user alone (as it wants its key).
    fn write_private(&self, path: &std::path::Path, contents: &str) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        if let Some(user) = &self.owner {
            std::os::unix::fs::chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .with_context(|| format!("cannot hand {} to the PostgreSQL user", path.display()))?;
        }
        Ok(())
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for `database` as the `postgres` superuser.
    pub fn url(&self, database: &str) -> String {
        self.url_as("postgres", database)
    }

    /// A URL for `database` as `role` (every role may sign in without a password).
    pub fn url_as(&self, role: &str, database: &str) -> String {
        format!("postgres://{role}@127.0.0.1:{}/{database}", self.port)
    }

    /// The server log, for diagnosing a failed test.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// Creates a database.
    pub async fn create_database(&self, name: &str) -> anyhow::Result<()> {
        self.psql("postgres", &format!("CREATE DATABASE \"{name}\"")).await
    }

    /// Runs one SQL command with `psql`.
    pub async fn psql(&self, database: &str, sql: &str) -> anyhow::Result<()> {
        let status = Command::new(self.bin_dir.join("psql"))
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", database, "-c", sql])
            .stdout(Stdio::null())
            .status()
            .await
            .context("cannot run psql")?;
        if !status.success() {
            bail!("psql failed running {sql:?}");
        }
        Ok(())
    }

    /// Crashes the server: `pg_ctl stop -m immediate`, as a power cut would (minus the disk).
    pub async fn crash(&mut self) -> anyhow::Result<()> {
        self.stop_with("immediate").await
    }

    /// Stops the server cleanly.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.stop_with("fast").await
    }

    /// Starts the server again on the same port and data (after [`Cluster::crash`] or
    /// [`Cluster::stop`]); it recovers from its WAL.
    pub async fn resume(&mut self) -> anyhow::Result<()> {
        let durability = match self.durability {
            Durability::Durable => "",
            Durability::Fast => " -c fsync=off -c full_page_writes=off",
        };
        let extra: String = self.settings.iter().map(|(name, value)| format!(" -c {name}={value}")).collect();
        let options = format!(
            "-p {port} -k {socket} -c listen_addresses=127.0.0.1 -c max_connections=300 \
             -c shared_buffers=256MB -c log_min_messages=warning{durability}{extra}",
            port = self.port,
            socket = self.dir.path().display(),
        );
        self.run_tool(
            "pg_ctl",
            &["-D", &self.data_dir_str(), "-l", &self.log_path().to_string_lossy(), "-o", &options, "-w", "start"],
        )
        .await
        .with_context(|| format!("PostgreSQL did not start; see {}", self.log_path().display()))?;
        self.running = true;
        Ok(())
    }

    async fn stop_with(&mut self, mode: &str) -> anyhow::Result<()> {
        if self.running {
            self.run_tool("pg_ctl", &["-D", &self.data_dir_str(), "-m", mode, "-w", "stop"]).await?;
            self.running = false;
        }
        Ok(())
    }

    fn data_dir_str(&self) -> String {
        self.dir.path().join("data").to_string_lossy().into_owned()
    }

    async fn run_tool(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        let mut command = Command::new(self.bin_dir.join(tool));
        command.args(args).stdout(Stdio::null()).stderr(Stdio::piped()).current_dir(self.dir.path());
        if let Some(user) = &self.owner {
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        let output = command.output().await.with_context(|| format!("cannot run {tool}"))?;
        if !output.status.success() {
            bail!("{tool} {args:?} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.running {
            // A blocking stop: Drop cannot await, and the directory must not vanish under a live server.
            let mut command = std::process::Command::new(self.bin_dir.join("pg_ctl"));
            command
                .args(["-D", &self.data_dir_str(), "-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(user) = &self.owner {
                std::os::unix::process::CommandExt::uid(&mut command, user.uid.as_raw());
                std::os::unix::process::CommandExt::gid(&mut command, user.gid.as_raw());
            }
            let _ = command.status();
        }
    }
}

/// The directory the installed server loads extension libraries from: its own `pg_config
/// --pkglibdir`, else the `lib` beside its `bin`.
pub async fn library_dir() -> anyhow::Result<PathBuf> {
    let bin_dir = find_bin_dir().await?;
    if let Ok(output) = Command::new(bin_dir.join("pg_config")).arg("--pkglibdir").output().await
        && output.status.success()
    {
        return Ok(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    }
    Ok(bin_dir.parent().map_or_else(|| bin_dir.clone(), |dir| dir.join("lib")))
}

/// Where the server binaries are: `$PG_BINDIR`, else `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin`.
async fn find_bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output().await
        && output.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .context("no PostgreSQL server binaries found: install postgresql, or set PG_BINDIR")
}

/// The user to run PostgreSQL as when we are root: `initdb` refuses to run as root, so the cluster
/// is created and run as an unprivileged system user (`postgres`, else `nobody`) that owns the
/// temporary directory.
fn unprivileged_owner() -> anyhow::Result<Option<User>> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        if let Some(user) = User::from_name(name)? {
            return Ok(Some(user));
        }
    }
    bail!("running as root and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as")
}

/// Waits until something accepts TCP connections on `port` of 127.0.0.1, up to `timeout`.
pub async fn wait_for_port(port: u16, timeout: Duration) -> anyhow::Result<()> {
    let what = format!("something to listen on port {port}");
    wait_until(&what, timeout, || async { tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(drop) })
        .await
}
