//! A container engine for `cargo xtask compose-check`, and the images the check runs on.
//!
//! Where a Docker engine responds, the check uses it and its registry. Where none does (this
//! project's CI machines), it installs podman from Debian's packages and runs a podman of its own,
//! with its own storage, run state, networks and API socket under one scratch directory. Everything
//! that podman holds was made by this run, so the stand-in images can take the names the Dockerfile
//! and compose file use, and cleaning up is removing the directory: nothing of the machine's own
//! containers, images or networks is ever touched.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// The Debian packages an engine-less machine needs. `docker-compose` must come without its
/// recommendations, which would pull in a Docker engine that cannot run here. netavark sets up each
/// network's firewall rules by running `iptables`, yet no package of these depends on it: without it
/// every container fails to start with "netavark: No such file or directory".
const PODMAN_PACKAGES: [&str; 7] =
    ["podman", "runc", "netavark", "aardvark-dns", "iptables", "docker-compose", "mmdebstrap"];

/// The podman engine's settings, found on a trial run: `runc`, as `crun` cannot set resource limits
/// in this VM; no default ulimits; and the netavark network backend, so that containers find each
/// other by service name.
const CONTAINERS_CONF: &str = r#"[containers]
default_ulimits = []

[engine]
runtime = "runc"

[network]
network_backend = "netavark"
network_config_dir = "NETWORKS"
"#;

/// The start of the name of a run's podman directory; the run's process id follows.
const DIR_PREFIX: &str = "oncepay-compose-check-";

/// A base image stand-in older than this is made again, so security updates reach it.
const BASE_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// The engine the check runs on.
pub enum Engine {
    /// A Docker engine that was already running.
    Docker {
        /// `docker compose`, or `docker-compose` where the plugin is missing.
        compose: Vec<String>,
    },
    /// A podman of this run's own, removed with its storage at the end.
    Podman(Podman),
}

/// A podman of this run's own.
pub struct Podman {
    /// Everything it holds: storage, run state, networks, its configuration and its socket.
    dir: PathBuf,
    /// `podman system service`, which serves the Docker API on `dir/podman.sock` for Debian's
    /// `docker-compose` (none for a podman left behind by an earlier run that was killed, which is
    /// only being removed).
    service: Option<Child>,
}

impl Engine {
    /// The Docker engine if one responds; otherwise a podman of this run's own, installed first if
    /// it is missing.
    pub async fn start(run_id: &str) -> anyhow::Result<Engine> {
        if let Some(compose) = docker_engine().await {
            eprintln!("compose-check: using the Docker engine");
            return Ok(Engine::Docker { compose });
        }
        install_podman().await?;
        remove_abandoned().await;
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{}-{run_id}", std::process::id()));
        std::fs::create_dir_all(dir.join("networks"))?;
        let conf = CONTAINERS_CONF.replace("NETWORKS", &dir.join("networks").to_string_lossy());
        std::fs::write(dir.join("containers.conf"), conf)?;
        let socket = dir.join("podman.sock");
        let service = podman_command(&dir)
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("service.log"))?)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start podman's API service")?;
        let podman = Podman { dir, service: Some(service) };
        for _ in 0..100 {
            if socket.exists() {
                eprintln!("compose-check: using a podman of its own in {}", podman.dir.display());
                return Ok(Engine::Podman(podman));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Engine::Podman(podman).stop().await;
        bail!("podman's API service did not open its socket within 10 s")
    }

    /// Whether base images must be made here because no registry can be reached.
    pub fn needs_stand_ins(&self) -> bool {
        matches!(self, Engine::Podman(_))
    }

    /// The engine's own command line (`docker` or this run's `podman`).
    pub fn cli(&self) -> Command {
        match self {
            Engine::Docker { .. } => Command::new("docker"),
            Engine::Podman(podman) => podman_command(&podman.dir),
        }
    }

    /// `build` on this engine. podman's builds share the machine's network: on this project's CI
    /// machines a container's own network reaches nothing outside (a trial timed out connecting to
    /// Debian's mirror), and the Dockerfile's runtime stage installs packages.
    pub fn build(&self) -> Command {
        let mut command = self.cli();
        command.args(["build", "--quiet"]);
        if let Engine::Podman(_) = self {
            command.args(["--network", "host"]);
        }
        command
    }

    /// The compose command line, talking to this engine.
    pub fn compose(&self) -> Command {
        match self {
            Engine::Docker { compose } => {
                let mut command = Command::new(&compose[0]);
                command.args(&compose[1..]);
                command
            }
            Engine::Podman(podman) => {
                let mut command = Command::new("docker-compose");
                command.env("DOCKER_HOST", format!("unix://{}", podman.dir.join("podman.sock").display()));
                command
            }
        }
    }

    /// Runs the health check of every running container of `project`, every two seconds, for as long
    /// as the returned task lives. Docker schedules health checks itself; podman only schedules
    /// them through systemd, which is not running here.
    pub fn tick_health_checks(&self, project: &str) -> Option<tokio::task::JoinHandle<()>> {
        let Engine::Podman(podman) = self else { return None };
        let dir = podman.dir.clone();
        let label = format!("label=com.docker.compose.project={project}");
        Some(tokio::spawn(async move {
            loop {
                let listed = podman_command(&dir).args(["ps", "--quiet", "--filter", &label]).output().await;
                if let Ok(listed) = listed {
                    for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
                        // A container without a health check, or one that just stopped, fails the
                        // command: there is nothing to record for it.
                        let _ = podman_command(&dir)
                            .args(["healthcheck", "run", id])
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .status()
                            .await;
                    }
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }))
    }

    /// Stops a podman of this run's own and removes everything it held. A Docker engine is left as
    /// it was: the caller removes what it made there.
    pub async fn stop(self) {
        let Engine::Podman(mut podman) = self else { return };
        // Containers first (a failed run may have left some), so no mount holds the storage.
        for args in [&["rm", "--all", "--force", "--time", "0"][..], &["rmi", "--all", "--force"][..]] {
            let _ = podman_command(&podman.dir).args(args).stdout(Stdio::null()).status().await;
        }
        if let Some(service) = podman.service.as_mut() {
            let _ = service.kill().await;
        }
        if let Err(error) = std::fs::remove_dir_all(&podman.dir) {
            eprintln!("compose-check: cannot remove {}: {error}", podman.dir.display());
        }
    }
}

/// Removes the podmans of earlier runs whose process is gone (killed before it could clean up),
/// with their containers and storage.
async fn remove_abandoned() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(DIR_PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        if pid.parse::<u32>().is_err() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        eprintln!("compose-check: removing {name}, left behind by a run that was killed");
        Engine::Podman(Podman { dir: entry.path(), service: None }).stop().await;
    }
}

/// `podman` confined to `dir`: its storage, run state, networks and configuration.
fn podman_command(dir: &Path) -> Command {
    let mut command = Command::new("podman");
    command
        .env("CONTAINERS_CONF", dir.join("containers.conf"))
        .arg("--root")
        .arg(dir.join("storage"))
        .arg("--runroot")
        .arg(dir.join("run"));
    command
}

/// The compose command of a Docker engine that responds, if there is one.
async fn docker_engine() -> Option<Vec<String>> {
    let responds = |program: &str, args: &[&str]| {
        let mut command = Command::new(program);
        command.args(args).stdout(Stdio::null()).stderr(Stdio::null()).kill_on_drop(true);
        async move {
            matches!(tokio::time::timeout(Duration::from_secs(20), command.status()).await, Ok(Ok(status)) if status.success())
        }
    };
    if !responds("docker", &["info"]).await {
        return None;
    }
    if responds("docker", &["compose", "version"]).await {
        Some(vec!["docker".into(), "compose".into()])
    } else {
        Some(vec!["docker-compose".into()])
    }
}

/// Installs podman and what goes with it from Debian's packages, if any is missing.
async fn install_podman() -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for package in PODMAN_PACKAGES {
        let installed = Command::new("dpkg-query")
            .args(["--show", "--showformat=${db:Status-Status}", package])
            .output()
            .await
            .context("cannot run dpkg-query: without a Docker engine, this check needs Debian's podman")?;
        if String::from_utf8_lossy(&installed.stdout) != "installed" {
            missing.push(package);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("compose-check: no Docker engine responds; installing {}", missing.join(" "));
    let install = || {
        let mut command = Command::new("apt-get");
        command.args(["install", "--yes", "--quiet", "--no-install-recommends"]).args(&missing);
        command.env("DEBIAN_FRONTEND", "noninteractive").stdout(Stdio::null());
        command
    };
    if install().status().await.context("cannot run apt-get")?.success() {
        return Ok(());
    }
    // The package lists may be older than the mirror: refresh them once and try again.
    run(Command::new("apt-get").args(["update", "--quiet"]).stdout(Stdio::null()), "apt-get update").await?;
    run(&mut install(), "installing podman").await
}

/// Makes the images that would otherwise be pulled, under the names the Dockerfile and compose
/// file use: `debian:bookworm-slim`, a minimal Debian bookworm made with mmdebstrap, and on it
/// `postgres:15-bookworm`, Debian's PostgreSQL 15, and `rabbitmq:3.13`, Debian's RabbitMQ
/// (`deploy/compose-check/`). Only for this run's own podman, whose storage holds nothing else.
pub async fn make_stand_ins(engine: &Engine, root: &Path, cache: &Path) -> anyhow::Result<()> {
    let base = cache.join("bookworm-minbase.tar");
    let fresh = std::fs::metadata(&base)
        .and_then(|meta| meta.modified())
        .is_ok_and(|made| SystemTime::now().duration_since(made).unwrap_or(Duration::MAX) < BASE_MAX_AGE);
    if !fresh {
        eprintln!("compose-check: making a Debian bookworm base image with mmdebstrap (about a minute)");
        std::fs::create_dir_all(cache)?;
        let partial = cache.join("bookworm-minbase.partial.tar");
        run(
            Command::new("mmdebstrap")
                .args(["--quiet", "--variant=minbase", "--format=tar", "bookworm"])
                .arg(&partial)
                .arg("http://deb.debian.org/debian"),
            "mmdebstrap",
        )
        .await?;
        std::fs::rename(&partial, &base)?;
    }
    run(
        engine.cli().arg("import").arg(&base).arg("docker.io/library/debian:bookworm-slim").stdout(Stdio::null()),
        "importing the base image",
    )
    .await?;
    for (image, name) in [("postgres:15-bookworm", "postgres"), ("rabbitmq:3.13", "rabbitmq")] {
        let dir = root.join("deploy/compose-check");
        run(
            engine
                .build()
                .args(["--tag", &format!("docker.io/library/{image}"), "--file"])
                .args([dir.join(format!("{name}.Containerfile")), dir]),
            &format!("building the {name} stand-in"),
        )
        .await?;
    }
    Ok(())
}

/// Makes `image` from the Dockerfile's runtime stage, with `binaries` (built on this machine) in
/// place of what its build stage would compile: the build stage's name is given a context of its own
/// holding them, as the stage would, under `out/`. The Dockerfile is used unchanged.
pub async fn build_runtime_image(
    engine: &Engine,
    root: &Path,
    binaries: &[PathBuf],
    image: &str,
) -> anyhow::Result<()> {
    let staging = tempdir(&format!("oncepay-compose-check-binaries-{}", std::process::id()))?;
    let out = staging.join("out");
    std::fs::create_dir_all(&out)?;
    for binary in binaries {
        let name = binary.file_name().context("a binary has no file name")?;
        std::fs::copy(binary, out.join(name)).with_context(|| format!("cannot copy {}", binary.display()))?;
    }
    let built = run(
        engine
            .build()
            .args(["--target", "runtime", "--build-context"])
            .arg(format!("build={}", staging.display()))
            .args(["--tag", image, "--file"])
            .arg(root.join("Dockerfile"))
            .arg(root),
        "building the oncepay image from the Dockerfile",
    )
    .await;
    let _ = std::fs::remove_dir_all(&staging);
    built
}

/// A new empty directory in the system's temporary directory.
fn tempdir(name: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Runs a command to completion; an error naming `what` if it fails.
pub async fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command.status().await.with_context(|| format!("cannot start {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}
