//! The `oncepay-simulator` binary: loads the settings, starts telemetry, runs the simulator until
//! SIGTERM or Ctrl-C, then exits 0 after a graceful shutdown.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use oncepay_service::{shutdown, telemetry};
use oncepay_simulator::Simulator;
use oncepay_simulator::config::Settings;

/// A payment provider simulator with fault injection.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// A TOML file overriding the embedded defaults (environment variables override both).
    #[arg(long, env = "ONCEPAY_CONFIG")]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let settings = Settings::load(args.config.as_deref()).context("invalid configuration")?;
    let _telemetry = telemetry::init("oncepay-simulator", &settings.telemetry)?;
    let simulator = Simulator::start(settings, shutdown::on_termination_signal()).await?;
    simulator.finished().await?;
    tracing::info!("provider simulator stopped");
    Ok(())
}
