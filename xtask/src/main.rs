//! `cargo xtask`: the project's tasks, `up`, `test`, `prepare`, `bench`, `compose-check` and
//! `mutants` (see `cargo xtask --help`).
//!
//! Every task brings up what it needs itself; nothing must be running beforehand.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use oncepay_devkit::pg::{Cluster, Durability};
use sqlx::Connection as _;
use tokio::process::Command;

mod browser;
mod compose_check;
mod containers;
mod localstripe;
mod mutants;
mod npm;
mod packages;
mod secrets;
mod up;

#[derive(Parser)]
#[command(about = "oncepay's project tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Runs oncepay locally: PostgreSQL, RabbitMQ, the simulator, api, worker and reconciler, until
    /// Ctrl-C.
    Up {
        /// Build and run optimised binaries.
        #[arg(long)]
        release: bool,
        /// The demo tenant to create (or to issue a new key for).
        #[arg(long, default_value = "demo")]
        tenant: String,
        /// On a throwaway Citus cluster (a coordinator and two worker nodes, from the Citus
        /// installed for the server) instead of one PostgreSQL.
        #[arg(long)]
        citus: bool,
        /// The payment provider: the simulator, or localstripe (a fake of Stripe's API, installed
        /// from PyPI as the test command does) through oncepay's Stripe adapter.
        #[arg(long, value_enum, default_value = "simulator")]
        provider: up::Provider,
    },
    /// Runs the whole test suite (installs localstripe, the OpenID provider, axe-core, Chromium and
    /// chromedriver, builds the binaries, then cargo nextest).
    Test {
        /// Runs the cross-process suites (end to end, observability, chaos, Stripe) on a throwaway
        /// Citus cluster, from the Citus installed for the server, instead of the whole suite.
        #[arg(long)]
        citus: bool,
        /// Passed on to `cargo nextest run`, e.g. a test name filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        nextest_args: Vec<String>,
    },
    /// Regenerates `.sqlx/` from a fresh database with every migration applied.
    Prepare {
        /// Only these packages, adding to `.sqlx/` without removing other entries.
        #[arg(short, long = "package")]
        packages: Vec<String>,
    },
    /// Benchmarks oncepay against raw PostgreSQL running the same SQL (release build).
    Bench {
        /// Short windows and small backlogs.
        #[arg(long, conflicts_with = "full")]
        quick: bool,
        /// Also compare 10 million stored keys with 10 thousand (about 12 minutes more).
        #[arg(long)]
        full: bool,
        /// The JSON report (default: target/bench/oncepay-bench-<time>.json).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Passed on to oncepay-bench, e.g. `-- --only accept,replay --api-env ONCEPAY_HTTP__WORKERS=1`.
        #[arg(last = true)]
        bench_args: Vec<String>,
    },
    /// Runs docker-compose.yml for real (Docker, or podman where no Docker engine runs), pays
    /// through it, scales and restarts the workers, and takes it all down again.
    ComposeCheck,
    /// Mutation checks on the money guards: fails on any mutant of a guard that its tests do not
    /// catch, unless it is known to be equivalent (docs/mutation-testing.md).
    Mutants {
        /// Only the subset CI runs on every change.
        #[arg(long)]
        ci: bool,
        /// Only these guards (by name; every one when none is given).
        #[arg(conflicts_with = "ci")]
        guards: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Up { release, tenant, citus, provider } => {
            up::up(&workspace_root(), &up::Options { release, tenant, citus, provider }).await
        }
        Task::Test { citus, nextest_args } => test(citus, &nextest_args).await,
        Task::Prepare { packages } => prepare(&packages).await,
        Task::Bench { quick, full, out, bench_args } => bench(quick, full, out, &bench_args).await,
        Task::ComposeCheck => compose_check::compose_check(&workspace_root()).await,
        Task::Mutants { ci, guards } => mutants::mutants(&workspace_root(), ci, &guards).await,
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn workspace_root() -> PathBuf {
    // xtask/ is one level below the root.
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Where cargo puts what it builds: `CARGO_TARGET_DIR`, or `target/` in the workspace.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// A database server for the task: `DATABASE_URL` if given, else a throwaway cluster (kept alive by
/// the returned guard).
async fn database_server() -> anyhow::Result<(String, Option<Cluster>)> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        eprintln!("xtask: using DATABASE_URL");
        return Ok((url, None));
    }
    let cluster = Cluster::start(Durability::Fast).await.context("cannot start a throwaway PostgreSQL")?;
    eprintln!("xtask: started a throwaway PostgreSQL on port {}", cluster.port());
    Ok((cluster.url("postgres"), Some(cluster)))
}

/// The RabbitMQ node the tests publish to: `ONCEPAY_TEST_AMQP_URL` when set, else a throwaway node
/// of its own (installing Debian's rabbitmq-server first if it is missing), whatever else runs on
/// the machine.
async fn broker_node() -> anyhow::Result<(String, Option<oncepay_devkit::rabbitmq::Node>)> {
    use oncepay_devkit::rabbitmq::{self, Node};
    if let Ok(url) = std::env::var(rabbitmq::TEST_URL_VARIABLE) {
        eprintln!("xtask: using {}", rabbitmq::TEST_URL_VARIABLE);
        return Ok((url, None));
    }
    packages::ensure(&["rabbitmq-server"], &[rabbitmq::DEBIAN_SERVER], "for the broker intake's tests").await?;
    let node = Node::start().await.context("cannot start a throwaway RabbitMQ node")?;
    eprintln!("xtask: started a throwaway RabbitMQ node on port {}", node.port());
    Ok((node.url(), Some(node)))
}

async fn cargo(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<bool> {
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(workspace_root())
        .status()
        .await
        .with_context(|| format!("cannot run cargo {}", args.join(" ")))?;
    Ok(status.success())
}

/// The whole test suite, against a throwaway PostgreSQL cluster (or `DATABASE_URL` when set), with
/// localstripe installed for the Stripe end-to-end suite, a real OpenID provider for the operators'
/// sign-in, and Chromium, chromedriver and axe-core for the console's browser tests. This is what CI
/// runs.
///
/// With `citus`, only the cross-process suites, each on a throwaway Citus cluster of its own
/// (`TEST_DATABASE=citus`); a clear error when Citus is not installed.
async fn test(citus: bool, nextest_args: &[String]) -> anyhow::Result<ExitCode> {
    let root = workspace_root();
    if citus {
        oncepay_devkit::citus::installed().await?;
    }
    let python = localstripe::install(&root, &target_dir(&root)).await.context("cannot install localstripe")?;
    let python = python.to_string_lossy();
    let oidc = npm::install(&root, &target_dir(&root), &npm::OIDC_PROVIDER)
        .await
        .context("cannot install the OpenID provider")?
        .join("serve.mjs");
    let oidc = oidc.to_string_lossy();
    let axe = npm::install(&root, &target_dir(&root), &npm::AXE_CORE)
        .await
        .context("cannot install axe-core")?
        .join("node_modules/axe-core/axe.min.js");
    let axe = axe.to_string_lossy();
    browser::install().await.context("cannot install Chromium and chromedriver")?;
    let (url, _cluster) = if citus { (String::new(), None) } else { database_server().await? };
    let (amqp_url, _node) = broker_node().await?;
    // The tests reach PostgreSQL through DATABASE_URL; the build must not (SQLX_OFFLINE).
    let mut env = vec![
        ("SQLX_OFFLINE", "true"),
        ("LOCALSTRIPE_PYTHON", python.as_ref()),
        (oncepay_devkit::oidc::SCRIPT_VARIABLE, oidc.as_ref()),
        (oncepay_devkit::browser::AXE_CORE_VARIABLE, axe.as_ref()),
        (oncepay_devkit::browser::CHROMEDRIVER_VARIABLE, oncepay_devkit::browser::DEFAULT_CHROMEDRIVER),
        (oncepay_devkit::browser::CHROMIUM_VARIABLE, oncepay_devkit::browser::DEFAULT_CHROMIUM),
        (oncepay_devkit::rabbitmq::TEST_URL_VARIABLE, amqp_url.as_str()),
    ];
    if citus {
        env.push((oncepay_devkit::server::VARIABLE, "citus"));
    } else {
        env.push(("DATABASE_URL", url.as_str()));
    }
    if !cargo(&["build", "--workspace", "--bins", "--locked"], &env).await? {
        bail!("building the binaries failed");
    }
    let mut args = vec!["nextest", "run", "--locked", "--no-fail-fast"];
    if citus {
        args.extend(["--package", "oncepay-tests"]);
    } else {
        args.push("--workspace");
    }
    args.extend(nextest_args.iter().map(String::as_str));
    Ok(if cargo(&args, &env).await? { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Builds the api, worker, simulator, reconciler and benchmark in release and runs `oncepay-bench`,
/// which measures oncepay against raw PostgreSQL on a throwaway cluster of its own (BENCHMARKS.md).
async fn bench(quick: bool, full: bool, out: Option<PathBuf>, bench_args: &[String]) -> anyhow::Result<ExitCode> {
    let root = workspace_root();
    let binaries = ["-p", "oncepay-api", "-p", "oncepay-worker", "-p", "oncepay-simulator", "-p", "oncepay-reconciler"];
    let build = [&["build", "--release", "--locked"][..], &binaries[..]].concat();
    if !cargo(&[&build[..], &["-p", "oncepay-bench"]].concat(), &[("SQLX_OFFLINE", "true")]).await? {
        bail!("building the release binaries failed");
    }
    let target_dir = target_dir(&root);
    // The report's default home; a relative --out is the caller's, not this directory's.
    let reports = target_dir.join("bench");
    std::fs::create_dir_all(&reports)?;
    let mut command = Command::new(target_dir.join("release").join("oncepay-bench"));
    command.current_dir(&reports);
    if quick {
        command.arg("--quick");
    }
    if full {
        command.arg("--full");
    }
    if let Some(out) = out {
        command.arg("--out").arg(std::env::current_dir()?.join(out));
    }
    let commit = Command::new("git").args(["describe", "--always", "--dirty"]).current_dir(&root).output().await;
    if let Ok(commit) = commit
        && commit.status.success()
    {
        command.arg("--commit").arg(String::from_utf8_lossy(&commit.stdout).trim());
    }
    let status = command.args(bench_args).status().await.context("cannot run oncepay-bench")?;
    Ok(if status.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Refreshes the committed sqlx offline query data (`.sqlx/`) from a throwaway, migrated cluster:
/// for the whole workspace (stale entries removed), or additively for `packages`.
async fn prepare(packages: &[String]) -> anyhow::Result<ExitCode> {
    let root = workspace_root();
    // Always a fresh cluster: a DATABASE_URL may point at a database that is already migrated, or
    // migrated to a different revision than this checkout.
    let cluster = Cluster::start(Durability::Fast).await.context("cannot start a throwaway PostgreSQL")?;
    cluster.create_database("oncepay_prepare").await?;
    let url = cluster.url("oncepay_prepare");
    apply_migrations(&url, &root.join("migrations")).await?;

    // Write into a scratch directory and only touch `.sqlx/` once the check has passed, so a failed
    // run never leaves the committed data half-written.
    let scratch = tempfile_dir(&root)?;
    // The query macros only run when their crate is recompiled; touching each crate's root forces it.
    // The crates are the top-level directories and the library crates under `shared/`.
    let top: Vec<PathBuf> =
        std::fs::read_dir(&root)?.map(|entry| entry.map(|entry| entry.path())).collect::<Result<_, _>>()?;
    let shared: Vec<PathBuf> = std::fs::read_dir(root.join("shared"))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<_, _>>()?;
    for dir in top.into_iter().chain(shared) {
        for root_file in ["src/lib.rs", "src/main.rs"] {
            let path = dir.join(root_file);
            if path.is_file() {
                let file = std::fs::File::options().append(true).open(&path)?;
                file.set_modified(std::time::SystemTime::now())?;
            }
        }
    }
    let scratch_str = scratch.to_string_lossy().into_owned();
    let env = [("DATABASE_URL", url.as_str()), ("SQLX_OFFLINE", "false"), ("SQLX_OFFLINE_DIR", scratch_str.as_str())];
    let mut args = vec!["check", "--all-targets"];
    if packages.is_empty() {
        args.push("--workspace");
    }
    for package in packages {
        args.extend(["--package", package.as_str()]);
    }
    if !cargo(&args, &env).await? {
        std::fs::remove_dir_all(&scratch)?;
        bail!("cargo check failed against the prepared database; .sqlx/ is unchanged");
    }

    let offline_dir = root.join(".sqlx");
    if packages.is_empty() && offline_dir.exists() {
        std::fs::remove_dir_all(&offline_dir)?;
    }
    std::fs::create_dir_all(&offline_dir)?;
    let mut count = 0;
    for entry in std::fs::read_dir(&scratch)? {
        let entry = entry?;
        std::fs::rename(entry.path(), offline_dir.join(entry.file_name()))?;
        count += 1;
    }
    std::fs::remove_dir_all(&scratch)?;
    eprintln!("xtask: wrote {count} queries to {}", offline_dir.display());
    Ok(ExitCode::SUCCESS)
}

/// A fresh scratch directory inside the target directory (same filesystem as `.sqlx/`, so entries can
/// be renamed into place).
fn tempfile_dir(root: &Path) -> anyhow::Result<PathBuf> {
    let dir = root.join("target").join(format!("sqlx-prepare-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Applies `migrations/` with sqlx's migrator, read from the directory at run time, so the schema
/// the query macros check against is built exactly as `reconciler migrate` builds it, bookkeeping
/// table included (the roles' migration grants on it).
async fn apply_migrations(url: &str, dir: &Path) -> anyhow::Result<()> {
    let migrator = sqlx::migrate::Migrator::new(dir).await.context("cannot read the migrations")?;
    let mut conn = sqlx::PgConnection::connect(url).await.context("cannot connect to the prepare database")?;
    migrator.run(&mut conn).await.context("applying the migrations failed")?;
    Ok(())
}
