//! A throwaway RabbitMQ node in a temporary directory, from the installed server (Debian's
//! `rabbitmq-server`).
//!
//! The node is a node of its own, whatever else runs on the machine: its own name, its own AMQP,
//! distribution and epmd ports (each from [`crate::ports::reserve`]), its own epmd, data, logs,
//! Erlang cookie and configuration, none of `/etc/rabbitmq` read. It listens on 127.0.0.1 only. Its
//! one user, `oncepay`, is an administrator and an impersonator (it may publish with any `user_id`,
//! as tests that stand for many tenants' producers do); [`Node::add_user`] adds producers that may
//! not. Dropping a [`Node`] kills the node and its epmd and deletes everything.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::Command;

use crate::pg::wait_for_port;

/// The node's administrator (and impersonator).
pub const ADMIN: &str = "oncepay";

/// The variable that gives the tests a RabbitMQ node: an `amqp://` URL of a user tagged
/// `administrator` and `impersonator`. `cargo xtask test` sets it (to a throwaway node of its own,
/// unless it was set already).
pub const TEST_URL_VARIABLE: &str = "ONCEPAY_TEST_AMQP_URL";

/// The tests' RabbitMQ node, from [`TEST_URL_VARIABLE`].
///
/// # Panics
///
/// If it is not set: run the tests with `cargo xtask test`, or set it.
pub fn test_url() -> String {
    std::env::var(TEST_URL_VARIABLE).unwrap_or_else(|_| {
        panic!("{TEST_URL_VARIABLE} is not set: run the tests with `cargo xtask test`, or point it at a RabbitMQ node")
    })
}

/// How many times [`publish_confirmed`] sends a message RabbitMQ keeps refusing.
const PUBLISH_TRIES: u32 = 10;

/// Publishes `body` on `channel` (in confirm mode) and waits until RabbitMQ has taken it, publishing
/// it again while RabbitMQ refuses it. A refusal (a nack) means RabbitMQ did not take the message; a
/// quorum queue on a busy node answers one now and then, and a producer's answer is to send it again.
///
/// # Errors
///
/// If the channel fails, if no queue takes the message (it is returned), or if RabbitMQ refuses it
/// every time.
pub async fn publish_confirmed(
    channel: &lapin::Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: lapin::BasicProperties,
) -> anyhow::Result<()> {
    for _ in 0..PUBLISH_TRIES {
        let options = lapin::options::BasicPublishOptions::default();
        let confirmation = channel
            .basic_publish(exchange.into(), routing_key.into(), options, body, properties.clone())
            .await?
            .await?;
        match confirmation {
            lapin::Confirmation::Ack(None) => return Ok(()),
            lapin::Confirmation::Nack(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            other => bail!("RabbitMQ did not take the message for {routing_key}: {other:?}"),
        }
    }
    bail!("RabbitMQ refused the message for {routing_key} {PUBLISH_TRIES} times")
}

/// Debian's `rabbitmq-server` script, the one [`Node::start`] runs when `$RABBITMQ_SBIN` is unset.
pub const DEBIAN_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

/// How long a node may take to boot.
const BOOT_TIMEOUT: Duration = Duration::from_secs(60);

/// A running throwaway node.
pub struct Node {
    dir: tempfile::TempDir,
    sbin: PathBuf,
    name: String,
    port: u16,
    dist_port: u16,
    epmd_port: u16,
    password: String,
    /// The node's own epmd (Erlang's port mapper), whose process group the server joins.
    epmd: tokio::process::Child,
    server: Option<tokio::process::Child>,
}

impl Node {
    /// Creates and starts a node.
    pub async fn start() -> anyhow::Result<Self> {
        let sbin = find_sbin()?;
        let dir = tempfile::Builder::new()
            .prefix("oncepay-rabbitmq-")
            .tempdir()
            .context("cannot create a temporary directory for RabbitMQ")?;
        let reserve = crate::ports::reserve;
        let (port, dist_port, epmd_port) = (reserve()?, reserve()?, reserve()?);
        let password = random_token();
        let epmd = Command::new("epmd")
            .args(["-port", &epmd_port.to_string(), "-address", "127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start epmd (Erlang's, installed with rabbitmq-server)")?;
        wait_for_port(epmd_port, BOOT_TIMEOUT).await?;
        let mut node = Self {
            name: format!("oncepay-{port}@localhost"),
            dir,
            sbin,
            port,
            dist_port,
            epmd_port,
            password,
            epmd,
            server: None,
        };
        node.write_configuration()?;
        node.resume().await?;
        Ok(node)
    }

    /// The AMQP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// An AMQP URL of the default virtual host as the administrator.
    pub fn url(&self) -> String {
        self.url_as(ADMIN, &self.password)
    }

    /// An AMQP URL of the default virtual host as `user`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("amqp://{user}:{password}@127.0.0.1:{}/%2f", self.port)
    }

    /// The node's log, for diagnosing a failed test.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("log").join(format!("{}.log", self.name))
    }

    /// Adds `user` with `password`, free to configure, write and read everything in the default
    /// virtual host, without tags: RabbitMQ refuses its messages whose `user_id` is not `user`.
    pub async fn add_user(&self, user: &str, password: &str) -> anyhow::Result<()> {
        self.ctl(&["add_user", user, password]).await?;
        self.ctl(&["set_permissions", "-p", "/", user, ".*", ".*", ".*"]).await.map(drop)
    }

    /// Closes every client connection, as a network cut would (the node stays up).
    pub async fn close_connections(&self) -> anyhow::Result<()> {
        self.ctl(&["close_all_connections", "cut by the test"]).await.map(drop)
    }

    /// The messages in `queue`, ready and unacknowledged both (`None`: there is no such queue).
    pub async fn messages(&self, queue: &str) -> anyhow::Result<Option<u64>> {
        let listed = self.ctl(&["list_queues", "--no-table-headers", "name", "messages"]).await?;
        for line in listed.lines() {
            if let Some((name, messages)) = line.trim().rsplit_once(char::is_whitespace)
                && name.trim_end() == queue
            {
                return Ok(Some(messages.parse().with_context(|| format!("rabbitmqctl listed {line:?}"))?));
            }
        }
        Ok(None)
    }

    /// Stops the node cleanly; its durable queues and their messages stay on disk.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut server) = self.server.take() {
            self.ctl(&["stop"]).await?;
            server.wait().await.context("waiting for the RabbitMQ node to stop")?;
        }
        Ok(())
    }

    /// Starts the node (again, after [`Node::stop`]) on the same ports and data.
    pub async fn resume(&mut self) -> anyhow::Result<()> {
        if self.server.is_some() {
            return Ok(());
        }
        let log = std::fs::File::create(self.dir.path().join("server.out"))?;
        let mut command = Command::new(self.sbin.join("rabbitmq-server"));
        self.environment(&mut command);
        let group = self.epmd.id().and_then(|pid| i32::try_from(pid).ok()).context("epmd has exited")?;
        command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).process_group(group).kill_on_drop(true);
        let mut server = command.spawn().context("cannot start rabbitmq-server")?;
        let ready = tokio::select! {
            ready = wait_for_port(self.port, BOOT_TIMEOUT) => ready,
            exited = server.wait() => Err(anyhow::anyhow!("rabbitmq-server exited: {exited:?}")),
        };
        if let Err(error) = ready {
            let _ = server.kill().await;
            let out = std::fs::read_to_string(self.dir.path().join("server.out")).unwrap_or_default();
            bail!("the RabbitMQ node did not start ({error}); its output:\n{out}");
        }
        self.server = Some(server);
        Ok(())
    }

    /// Runs `rabbitmqctl` against this node; what it printed.
    pub async fn ctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut command = Command::new(self.sbin.join("rabbitmqctl"));
        self.environment(&mut command);
        let output = command
            .args(["-q", "-n", &self.name])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .context("cannot run rabbitmqctl")?;
        if !output.status.success() {
            bail!("rabbitmqctl {args:?} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The configuration, the plugins (none) and the Erlang cookie, all inside the directory.
    fn write_configuration(&self) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.dir.path();
        let configuration = format!(
            "listeners.tcp.default = 127.0.0.1:{port}\n\
             loopback_users = none\n\
             default_user = {ADMIN}\n\
             default_pass = {password}\n\
             default_user_tags.administrator = true\n\
             default_user_tags.impersonator = true\n\
             default_permissions.configure = .*\n\
             default_permissions.read = .*\n\
             default_permissions.write = .*\n\
             log.file.level = warning\n\
             log.console = false\n",
            port = self.port,
            password = self.password,
        );
        std::fs::write(dir.join("rabbitmq.conf"), configuration)?;
        std::fs::write(dir.join("enabled_plugins"), "[].\n")?;
        let cookie = dir.join(".erlang.cookie");
        std::fs::write(&cookie, random_token())?;
        std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400))?;
        Ok(())
    }

    /// What makes `command` (the server or `rabbitmqctl`) this node's and no other's.
    fn environment(&self, command: &mut Command) {
        let dir = self.dir.path();
        let path = |name: &str| dir.join(name).into_os_string();
        command
            .env("HOME", dir)
            .env("RABBITMQ_CONF_ENV_FILE", path("rabbitmq-env.conf"))
            .env("RABBITMQ_CONFIG_FILE", path("rabbitmq"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", path("advanced.config"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", path("mnesia"))
            .env("RABBITMQ_LOG_BASE", path("log"))
            .env("RABBITMQ_PID_FILE", path("pid"))
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env_remove("ERL_FLAGS")
            .env_remove("RABBITMQ_ERLANG_COOKIE");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Blocking: Drop cannot await, and the directory must not vanish under a live node. The
        // epmd's process group holds the server and every process it started.
        if let Some(pid) = self.epmd.id().and_then(|pid| i32::try_from(pid).ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Where the server's own scripts are (`rabbitmq-server` and `rabbitmqctl`, not the wrappers in
/// `/usr/sbin` that switch to the `rabbitmq` user): `$RABBITMQ_SBIN`, else Debian's
/// `/usr/lib/rabbitmq/bin`.
fn find_sbin() -> anyhow::Result<PathBuf> {
    let debian = Path::new(DEBIAN_SERVER).parent().map(Path::to_path_buf);
    for dir in std::env::var_os("RABBITMQ_SBIN").map(PathBuf::from).into_iter().chain(debian) {
        if dir.join("rabbitmq-server").is_file() && dir.join("rabbitmqctl").is_file() {
            return Ok(dir);
        }
    }
    bail!("no RabbitMQ server found: install rabbitmq-server (Debian), or set RABBITMQ_SBIN")
}

/// 32 random letters, for the password and the cookie.
fn random_token() -> String {
    let mut bytes = [0_u8; 32];
    if let Ok(mut random) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut random, &mut bytes);
    }
    bytes.iter().map(|byte| char::from(b'a' + byte % 26)).collect()
}
