//! `oncepay-bench`: runs the benchmark, prints the table, writes the JSON report.
//!
//! Usually started by `cargo xtask bench`, which builds it and the binaries it drives in release
//! first; they must sit in the same directory as this executable.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use oncepay_bench::report::{self, Report};
use oncepay_bench::run::{self, Options, Phase, Profile};
use oncepay_bench::targets;
use oncepay_devkit::server::Kind;

/// Benchmarks oncepay against raw PostgreSQL running the same SQL.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Short windows and small backlogs: a smoke run of every phase.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Also compare 10 million stored keys with 10 thousand (adds about 12 minutes), the console's
    /// reads with a million payments with the same with ten thousand (about 3 more), take
    /// payments from RabbitMQ (about 1 more) and deliver events to an endpoint (about 3 more).
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
    /// After the run on one PostgreSQL, the same run on a throwaway Citus cluster (a coordinator and
    /// two worker nodes; Citus must be installed for the server, nothing here installs it), and each
    /// Citus row's rate as a ratio to the same row's on one PostgreSQL.
    #[arg(long, conflicts_with = "citus_only")]
    citus: bool,
    /// The run on a Citus cluster alone, without one PostgreSQL's to compare with.
    #[arg(long)]
    citus_only: bool,
    /// How long the provider takes over each payment in the events phase, in milliseconds (0: at
    /// once, and the worker finishes as many as the CPU lets it).
    #[arg(long, default_value_t = 200)]
    events_provider_ms: u64,
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
        events_provider_ms: cli.events_provider_ms,
    };
    let servers: &[Kind] = match (cli.citus, cli.citus_only) {
        (_, true) => &[Kind::Citus],
        (true, false) => &[Kind::Single, Kind::Citus],
        (false, false) => &[Kind::Single],
    };
    let mut single: Option<Report> = None;
    for &kind in servers {
        // After a run on one PostgreSQL, the Citus run's processes log beside its logs, not into them.
        let options = if kind == Kind::Citus && servers.len() > 1 {
            Options { log_dir: options.log_dir.join("citus"), ..options.clone() }
        } else {
            options.clone()
        };
        let mut report = run::run(&options, kind).await?;
        if let Some(single) = &single {
            report.against_single = report::against_single(&single.rows, &report.rows);
        }
        let out = if kind == Kind::Citus && servers.len() > 1 { citus_path(&out) } else { out.clone() };
        write(&out, &report)?;
        if let Some(error) = &report.error {
            anyhow::bail!("the run on {} stopped early: {error}", report.server);
        }
        single = Some(report);
    }
    Ok(())
}

/// Where the Citus report goes when one PostgreSQL's takes `out`: beside it, `-citus` added.
fn citus_path(out: &Path) -> PathBuf {
    let stem = out.file_stem().map_or_else(|| "oncepay-bench".into(), |stem| stem.to_string_lossy().into_owned());
    let extension = out.extension().map_or_else(|| "json".into(), |e| e.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}-citus.{extension}"))
}

/// Writes `report` to `out` as JSON and prints its tables.
fn write(out: &Path, report: &Report) -> anyhow::Result<()> {
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(report)?).with_context(|| format!("writing {}", out.display()))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "\non {}\n{}", report.server, report::table(&report.rows))?;
    if !report.targets.is_empty() {
        writeln!(stdout, "the issues' targets on one PostgreSQL:\n{}", targets::table(&report.targets))?;
    }
    if !report.against_single.is_empty() {
        writeln!(
            stdout,
            "on Citus, against one PostgreSQL:\n{}",
            report::against_single_table(&report.against_single)
        )?;
    }
    writeln!(stdout, "report: {}", out.display())?;
    Ok(())
}
