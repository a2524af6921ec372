//! `oncepay-bench`: runs the benchmark, prints the table, writes the JSON report.
//!
//! Usually started by `cargo xtask bench`, which builds it and the binaries it drives in release
//! first; they must sit in the same directory as this executable.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use oncepay_bench::report;
use oncepay_bench::run::{self, Options, Phase, Profile};

/// Benchmarks oncepay against raw PostgreSQL running the same SQL.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Short windows and small backlogs: a smoke run of every phase.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Also compare 10 million stored keys with 10 thousand (adds about 12 minutes), and the
    /// console's reads with a million payments with the same with ten thousand (about 3 more).
    #[arg(long)]
    full: bool,
    /// Where to write the JSON report (default: `oncepay-bench-<time>.json` here).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only these phases (repeatable or comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Phase>,
    /// A note kept in the report, e.g. the lever this run tries.
    #[arg(long)]
    label: Option<String>,
    /// `KEY=VALUE` added to every api process's environment (repeatable).
    #[arg(long = "api-env", value_parser = key_value)]
    api_env: Vec<(String, String)>,
    /// `KEY=VALUE` added to every worker process's environment (repeatable).
    #[arg(long = "worker-env", value_parser = key_value)]
    worker_env: Vec<(String, String)>,
    /// Where the processes' logs go (default: beside the report).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Run on a throwaway Citus cluster, a coordinator and two worker nodes, instead of one
    /// PostgreSQL (Citus must be installed for the server; nothing here installs it).
    #[arg(long)]
    citus: bool,
    /// The commit the binaries were built from, kept in the report. (Not an environment variable:
    /// the binaries it starts would read any `ONCEPAY_*` one as configuration.)
    #[arg(long)]
    commit: Option<String>,
}

/// Niceness every process of the run inherits (PostgreSQL, the binaries, pgbench), so that
/// background work on the machine (builds, usually niced) takes less CPU from the measurement.
const NICENESS: &str = "-10";

/// Lowers this process's niceness before any child starts; says what happened, for the report.
fn raise_priority() -> String {
    let pid = std::process::id().to_string();
    match std::process::Command::new("renice").args(["-n", NICENESS, "-p", &pid]).output() {
        Ok(output) if output.status.success() => format!("niceness {NICENESS} for every process of the run"),
        Ok(output) => format!("niceness unchanged: {}", String::from_utf8_lossy(&output.stderr).trim()),
        Err(error) => format!("niceness unchanged: cannot run renice: {error}"),
    }
}

fn key_value(text: &str) -> Result<(String, String), String> {
    text.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match bench().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("oncepay-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn bench() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let stamp = time::OffsetDateTime::now_utc()
        .format(time::macros::format_description!("[year][month][day]-[hour][minute][second]"))?;
    let out = cli.out.unwrap_or_else(|| PathBuf::from(format!("oncepay-bench-{stamp}.json")));
    let log_dir = cli.log_dir.unwrap_or_else(|| {
        out.parent().map_or_else(|| PathBuf::from("."), PathBuf::from).join(format!("oncepay-bench-logs-{stamp}"))
    });
    let profile = match (cli.quick, cli.full) {
        (true, _) => Profile::Quick,
        (_, true) => Profile::Full,
        _ => Profile::Standard,
    };
    let priority = raise_priority();
    eprintln!("bench: {priority}");
    let options = Options {
        priority,
        profile,
        phases: cli.only,
        label: cli.label,
        api_env: cli.api_env,
        worker_env: cli.worker_env,
        log_dir,
        command: std::env::args().collect(),
        git_commit: cli.commit,
        citus: cli.citus,
    };
    let report = run::run(&options).await?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", out.display()))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "\non {}\n{}", report.server, report::table(&report.rows))?;
    writeln!(stdout, "report: {}", out.display())?;
    match &report.error {
        Some(error) => anyhow::bail!("the run stopped early: {error}"),
        None => Ok(()),
    }
}
