//! `oncepay-reconciler`: parses the command line, loads the settings, and runs the command.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use oncepay_reconciler::cli::{self, Cli};
use oncepay_reconciler::render;
use oncepay_reconciler::settings::Settings;
use oncepay_shared::db;

const CONFIG_INVALID: u8 = 78;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("oncepay-reconciler: {error}");
            return ExitCode::from(CONFIG_INVALID);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("oncepay-reconciler: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(operator_command(cli, settings))
}

async fn operator_command(cli: Cli, settings: Settings) -> ExitCode {
    let options = match db::connect_options(&settings.database, "oncepay-reconciler-cli") {
        Ok(options) => options,
        Err(error) => {
            eprintln!("oncepay-reconciler: database.url is not a PostgreSQL URL: {error}");
            return ExitCode::from(CONFIG_INVALID);
        }
    };
    let pool = db::pool(&settings.database, options);
    // The operator's name defaults to the login name; only `main` reads the environment.
    let default_operator = std::env::var("USER").ok();
    let ctx = cli::Context { settings, pool, default_operator };
    let result = cli::execute(cli.command, &ctx).await;
    ctx.pool.close().await;
    match result {
        Ok(report) => {
            let mut stdout = std::io::stdout().lock();
            match render::write(report.as_ref(), cli.json, &mut stdout).and_then(|()| stdout.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("oncepay-reconciler: cannot write the output: {error}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(error) => {
            eprintln!("oncepay-reconciler: {}", error.one_line());
            error.exit_code()
        }
    }
}
