//! `cargo xtask`: the project's tasks.
//!
//! - `cargo xtask test [-- nextest args]`: the whole test suite, against a throwaway PostgreSQL
//!   cluster (or `DATABASE_URL` when set). This is what CI runs.
//! - `cargo xtask prepare`: refreshes the committed sqlx offline query data (`.sqlx/`) from a fresh,
//!   migrated database.
//!
//! Every task brings up what it needs itself; nothing must be running beforehand.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use oncepay_devkit::pg::{Cluster, Durability};
use tokio::process::Command;

#[derive(Parser)]
#[command(about = "oncepay's project tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Runs the whole test suite (builds the binaries, then cargo nextest).
    Test {
        /// Passed on to `cargo nextest run`, e.g. a test name filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        nextest_args: Vec<String>,
    },
    /// Regenerates `.sqlx/` from a fresh database with every migration applied.
    Prepare,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Test { nextest_args } => test(&nextest_args).await,
        Task::Prepare => prepare().await,
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

async fn test(nextest_args: &[String]) -> anyhow::Result<ExitCode> {
    let (url, _cluster) = database_server().await?;
    // The tests reach PostgreSQL through DATABASE_URL; the build must not (SQLX_OFFLINE).
    let env = [("DATABASE_URL", url.as_str()), ("SQLX_OFFLINE", "true")];
    if !cargo(&["build", "--workspace", "--bins", "--locked"], &env).await? {
        bail!("building the binaries failed");
    }
    let mut args = vec!["nextest", "run", "--workspace", "--locked", "--no-fail-fast"];
    args.extend(nextest_args.iter().map(String::as_str));
    Ok(if cargo(&args, &env).await? { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn prepare() -> anyhow::Result<ExitCode> {
    let root = workspace_root();
    let (server_url, cluster) = database_server().await?;
    let url = match &cluster {
        Some(cluster) => {
            cluster.create_database("oncepay_prepare").await?;
            cluster.url("oncepay_prepare")
        }
        None => server_url,
    };
    apply_migrations(&url, &root.join("migrations")).await?;

    let offline_dir = root.join(".sqlx");
    if offline_dir.exists() {
        std::fs::remove_dir_all(&offline_dir)?;
    }
    std::fs::create_dir_all(&offline_dir)?;
    // The query macros only run when their crate is recompiled; touching each crate's root forces it.
    for entry in std::fs::read_dir(&root)? {
        let dir = entry?.path();
        for root_file in ["src/lib.rs", "src/main.rs"] {
            let path = dir.join(root_file);
            if path.is_file() {
                let file = std::fs::File::options().append(true).open(&path)?;
                file.set_modified(std::time::SystemTime::now())?;
            }
        }
    }
    let offline = offline_dir.to_string_lossy().into_owned();
    let env = [("DATABASE_URL", url.as_str()), ("SQLX_OFFLINE", "false"), ("SQLX_OFFLINE_DIR", offline.as_str())];
    if !cargo(&["check", "--workspace", "--all-targets"], &env).await? {
        bail!("cargo check failed against the prepared database");
    }
    let count = std::fs::read_dir(&offline_dir)?.count();
    eprintln!("xtask: wrote {count} queries to {}", offline_dir.display());
    Ok(ExitCode::SUCCESS)
}

/// Applies `migrations/*.sql` in order with psql (the query macros need the schema, not sqlx's
/// migration bookkeeping).
async fn apply_migrations(url: &str, dir: &Path) -> anyhow::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    for file in files {
        let status = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", url, "-f"])
            .arg(&file)
            .status()
            .await
            .context("cannot run psql")?;
        if !status.success() {
            bail!("applying {} failed", file.display());
        }
    }
    Ok(())
}
