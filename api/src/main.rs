//! `oncepay-api`: loads its settings, starts telemetry and metrics, and serves until SIGTERM.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use oncepay_api::{Application, Settings};
use oncepay_service::{metrics, shutdown, telemetry};

/// Every request allocates (headers, JSON, spans); mimalloc's per-thread free lists cost less than
/// the system allocator's (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The HTTP intake of oncepay.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// A TOML file overriding the embedded defaults (see config/default.toml).
    #[arg(long, env = "ONCEPAY_CONFIG")]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The crash point, configured from `FAILPOINTS`, exists only in the chaos harness's build.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let settings = Settings::load(cli.config.as_deref())?;
    let _telemetry = telemetry::init("oncepay-api", &settings.telemetry).context("cannot start telemetry")?;
    metrics::install();
    oncepay_api::metrics::describe();

    let application = Application::build(settings)?;
    tracing::info!(port = application.port(), "oncepay-api is listening");
    application.run_until_stopped(shutdown::on_termination_signal()).await?;
    tracing::info!("oncepay-api stopped");
    Ok(())
}
