//! `oncepay-chaos`: the fault-injection harness. Runs the whole system under a seeded workload and
//! fault schedule, checks every invariant of the contract, prints the report, and exits 1 on any
//! violation (2 if the run itself could not be carried out).
//!
//! ```sh
//! cargo build --workspace --bins && target/debug/oncepay-chaos --profile short --seed 42
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use oncepay_tests::chaos::{self, ChaosConfig, Crashable, Profile};

/// Runs oncepay under faults and checks that it keeps its promise.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// `short` (a few minutes, what CI runs) or `long` (about half an hour).
    #[arg(long, value_enum, default_value = "short")]
    profile: Profile,
    /// The seed behind the workload, the fault schedule and the fail points; random if not given.
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds of faults (and of intents being started), instead of the profile's.
    #[arg(long)]
    span_secs: Option<u64>,
    /// Payment intents in all, instead of the profile's.
    #[arg(long)]
    intents: Option<usize>,
    /// Intents in progress at once, instead of the profile's.
    #[arg(long)]
    concurrency: Option<usize>,
    /// A directory with `oncepay-worker` and `oncepay-api` built with `--features failpoints`; by
    /// default they are built into `target/chaos` first.
    #[arg(long)]
    failpoint_bins: Option<PathBuf>,
    /// Fraction of intents published to RabbitMQ (on a node of the run's own, from Debian's
    /// `rabbitmq-server`) instead of sent over HTTP, instead of the profile's; 0 runs no broker.
    #[arg(long)]
    broker_rate: Option<f64>,
    /// Keep every process's log even if the run passes (a failing run always keeps them).
    #[arg(long)]
    keep_logs: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let seed = cli.seed.unwrap_or_else(rand::random);
    let mut config = ChaosConfig::new(cli.profile, seed);
    if let Some(secs) = cli.span_secs {
        config.span = std::time::Duration::from_secs(secs);
    }
    if let Some(intents) = cli.intents {
        config.intents = intents;
    }
    if let Some(concurrency) = cli.concurrency {
        config.concurrency = concurrency;
    }
    if let Some(rate) = cli.broker_rate {
        config.broker_rate = rate;
    }
    config.keep_logs = cli.keep_logs;
    eprintln!("oncepay-chaos: seed {seed}, profile {:?}", cli.profile);

    let crashable = match cli.failpoint_bins {
        Some(dir) => Ok(Crashable::in_dir(&dir)),
        None => Crashable::build().await,
    };
    let outcome = match crashable {
        Ok(crashable) => chaos::run(&config, crashable).await,
        Err(error) => Err(error),
    };
    match outcome {
        Ok(outcome) => {
            #[allow(clippy::print_stdout)] // The report is this program's output.
            {
                println!("{}", outcome.report);
                if let Some(logs) = &outcome.logs {
                    println!("logs             {}", logs.display());
                }
            }
            if outcome.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(error) => {
            eprintln!("oncepay-chaos: the run could not be carried out (seed {seed}): {error:#}");
            ExitCode::from(2)
        }
    }
}
