//! `oncepay-reconciler`: parses the command line, loads the settings, and runs the service (`serve`,
//! the default) or one operator command.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use oncepay_ops::operators::client::OpsClient;
use oncepay_ops::render;
use oncepay_reconciler::cli::{self, Cli, Command};
use oncepay_reconciler::settings::Settings;
use oncepay_reconciler::startup::Application;
use oncepay_service::config::DatabaseSettings;
use oncepay_service::{shutdown, telemetry};
use oncepay_store::db;
use secrecy::SecretString;

/// Exit code for a configuration that cannot work (sysexits' EX_CONFIG).
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
    match cli.command {
        None | Some(Command::Serve) => runtime.block_on(serve(settings)),
        Some(command) => runtime.block_on(operator_command(command, cli.json, settings)),
    }
}

async fn serve(settings: Settings) -> ExitCode {
    if let Err(error) = settings.webhooks.serving_secrets(settings.provider.kind) {
        eprintln!("oncepay-reconciler: {error}");
        return ExitCode::from(CONFIG_INVALID);
    }
    let _telemetry = match telemetry::init("oncepay-reconciler", &settings.telemetry) {
        Ok(guard) => guard,
        Err(error) => {
            eprintln!("oncepay-reconciler: cannot start telemetry: {error:#}");
            return ExitCode::from(CONFIG_INVALID);
        }
    };
    let served = match Application::build(settings) {
        Ok(application) => application.run_until_stopped(shutdown::on_termination_signal()).await,
        Err(error) => Err(error),
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "the reconciler failed");
            ExitCode::FAILURE
        }
    }
}

async fn operator_command(command: Command, as_json: bool, settings: Settings) -> ExitCode {
    let options = match db::connect_options(&settings.database, "oncepay-reconciler-cli") {
        Ok(options) => options,
        Err(error) => {
            eprintln!("oncepay-reconciler: database.url is not a PostgreSQL URL: {error}");
            return ExitCode::from(CONFIG_INVALID);
        }
    };
    // A command's later connections may wait as long as its first (`cli::DATABASE_WITHIN`).
    let command_within = u64::try_from(cli::DATABASE_WITHIN.as_millis()).unwrap_or(u64::MAX);
    let database = DatabaseSettings {
        acquire_timeout_ms: settings.database.acquire_timeout_ms.max(command_within),
        ..settings.database.clone()
    };
    let pool = db::pool(&database, options);
    // Only `main` reads the environment.
    let ops = match (std::env::var("ONCEPAY_OPS_URL"), std::env::var("ONCEPAY_OPS_TOKEN")) {
        (Ok(url), Ok(token)) => match OpsClient::new(&url, SecretString::from(token)) {
            Ok(ops) => Some(ops),
            Err(error) => {
                eprintln!("oncepay-reconciler: {}", error.one_line());
                return error.exit_code();
            }
        },
        _ => None,
    };
    let ops_url = std::env::var("ONCEPAY_OPS_URL").ok();
    let ctx = cli::Context { settings, pool, ops, ops_url };
    let result = cli::execute(command, &ctx).await;
    ctx.pool.close().await;
    match result {
        Ok(report) => {
            let mut stdout = std::io::stdout().lock();
            match render::write(report.as_ref(), as_json, &mut stdout).and_then(|()| stdout.flush()) {
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
