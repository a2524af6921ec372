//! `oncepay-worker`: drains the outbox and asks the provider to charge, at most once per payment.
//!
//! Loads the settings (`--config <file>` or `ONCEPAY_CONFIG`, then `ONCEPAY_*` and `DATABASE_URL`),
//! starts telemetry, and runs the worker until SIGTERM or Ctrl-C; then it stops claiming, lets the
//! provider calls in flight finish and be recorded within `worker.shutdown_grace_secs`, and exits 0.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use oncepay_service::{shutdown, telemetry};
use oncepay_worker::app::{App, SERVICE};
use oncepay_worker::settings::Settings;

/// Every payment allocates (rows, JSON, spans); mimalloc's per-thread free lists cost less than the
/// system allocator's (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Drains the outbox and asks the provider to charge, at most once per payment.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// A TOML file overriding the embedded defaults (see config/default.toml).
    #[arg(long, env = "ONCEPAY_CONFIG")]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Crash points, configured from `FAILPOINTS`, exist only in the chaos harness's build.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let settings = Settings::load(cli.config.as_deref())?;
    let _telemetry = telemetry::init(SERVICE, &settings.telemetry).context("starting telemetry")?;
    let shutdown = shutdown::on_termination_signal();
    let app = App::build(&settings).await?;
    tracing::info!(port = app.port()?, worker.id = %app.drainer().config().worker_id, "oncepay-worker started");
    let counts = app.run(shutdown).await?;
    tracing::info!(?counts, "oncepay-worker stopped");
    Ok(())
}
