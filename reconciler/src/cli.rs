//! The command line: `oncepay-reconciler [serve]` runs the service; every other subcommand is an
//! operator tool that does one thing against the database and exits.
//!
//! This module owns the argument grammar ([`Cli`]), the mapping of failures to exit codes
//! ([`CliError::exit_code`]) and the dispatch of operator commands to the modules that implement
//! them. It reads no environment variable and no configuration itself: `main` passes in what it loaded.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use oncepay_domain::ids::PaymentId;
use oncepay_provider::ConfiguredProvider;
use oncepay_store::db;
use sqlx::PgPool;
use uuid::Uuid;

use crate::dead_letters::actions::{self, Asked, Operator, Retry};
use crate::dead_letters::queries::{self, Filter};
use crate::operators::accounts;
use crate::recon::{self, Reconciliation};
use crate::render::Report;
use crate::settings::Settings;
use crate::tenants;

/// `oncepay-reconciler`: the reconciler service and the operator CLI.
#[derive(Debug, Parser)]
#[command(name = "oncepay-reconciler", version, about, long_about = None)]
pub struct Cli {
    /// A TOML file overriding the embedded defaults.
    #[arg(long, global = true, env = "ONCEPAY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs the service: webhooks, poller, sweeper, reaper, nightly reconciliation (the default).
    Serve,
    /// Applies every pending database migration, then exits.
    Migrate,
    /// Tenants: create (with a first API key), list, connect to a provider account.
    #[command(subcommand)]
    Tenants(TenantsCommand),
    /// A tenant's API keys: issue another, revoke one.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Payments automation could not settle: list, show, retry, resolve.
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(DeadLettersCommand),
    /// Ledger reconciliation: run a window now, list runs, show a run's discrepancies.
    #[command(subcommand)]
    Recon(ReconCommand),
    /// Operator accounts: only the first admin is made here; admins make the rest through the
    /// operations API.
    #[command(subcommand)]
    Operators(OperatorsCommand),
}

/// `operators …`.
#[derive(Debug, Subcommand)]
pub enum OperatorsCommand {
    /// On an installation with no operator yet, creates the first admin and prints a personal token
    /// for the operations API, once. Refused once any operator exists.
    Bootstrap {
        /// The admin's name: 1–63 of a-z 0-9 . _ -, starting with a letter or digit.
        name: String,
    },
}

/// `recon …`.
#[derive(Debug, Subcommand)]
pub enum ReconCommand {
    /// Reconciles the window [from, to) now (dates are UTC midnights).
    Run {
        /// Start, inclusive: a date (2026-03-01) or an RFC 3339 time.
        #[arg(long)]
        from: String,
        /// End, exclusive: a date (2026-03-02) or an RFC 3339 time.
        #[arg(long)]
        to: String,
    },
    /// Lists the latest runs, newest first.
    Runs {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Shows a run and its discrepancies by class.
    Show {
        /// The run's id.
        run_id: Uuid,
    },
}

/// `tenants …`.
#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// Creates a tenant and prints its first API key, once.
    Create {
        /// Operator-facing handle: 1–63 of a-z 0-9 _ -, starting with a letter or digit.
        name: String,
        /// Requests per second this tenant may make to one api process (default: the api's).
        #[arg(long)]
        rate_limit: Option<i32>,
        /// The provider account its payments are charged to in connect mode (a Stripe connected
        /// account, `acct_…`); `tenants connect` sets it later.
        #[arg(long)]
        provider_account: Option<String>,
    },
    /// Lists every tenant.
    List,
    /// Sets the provider account a tenant's payments are charged to from now on (Stripe Connect:
    /// its connected account, `acct_…`). Payments accepted before keep the account they were
    /// accepted with.
    Connect {
        /// The tenant's name.
        tenant: String,
        /// The account, e.g. `acct_1032D82eZvKYlo2C`.
        account: String,
    },
    /// Removes a tenant's provider account: in connect mode it can take no payments until one is set
    /// again. Payments accepted before keep theirs.
    Disconnect {
        /// The tenant's name.
        tenant: String,
    },
}

/// `keys …`.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Issues another API key for a tenant and prints it, once.
    Issue {
        /// The tenant's name.
        tenant: String,
    },
    /// Revokes one of a tenant's keys; the api refuses it within its `auth.cache_ttl_secs`.
    Revoke {
        /// The tenant's name.
        tenant: String,
        /// The key id printed when the key was issued.
        key_id: String,
    },
}

/// `dead-letters …`.
#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// Lists dead letters, oldest first (open ones unless --all).
    List {
        /// Only entries awaiting an operator (the default).
        #[arg(long, conflicts_with = "all")]
        open: bool,
        /// Resolved entries too.
        #[arg(long)]
        all: bool,
    },
    /// Shows a payment's dead letters: why, evidence, attempts, age, and its audit trail.
    Show {
        /// The payment's id.
        payment_id: PaymentId,
    },
    /// Sends a dead-lettered payment again, with the same downstream key.
    Retry {
        /// The payment's id.
        payment_id: PaymentId,
        /// Why (recorded with your name).
        #[arg(long)]
        reason: String,
        /// Who you are (default: $USER).
        #[arg(long)]
        operator: Option<String>,
        /// Resend although the provider may have forgotten the key (a double charge is then possible).
        #[arg(long)]
        outside_key_window: bool,
    },
    /// Settles a dead-lettered payment, or acknowledges a conflict on a terminal one.
    Resolve {
        /// The payment's id.
        payment_id: PaymentId,
        /// What the payment's outcome was.
        #[arg(long = "as", value_enum, required_unless_present = "acknowledge", conflicts_with = "acknowledge")]
        outcome: Option<ResolveAs>,
        /// For a conflict on a terminal payment: record that you looked at it; the state stays.
        #[arg(long, conflicts_with_all = ["charge_id", "amount"])]
        acknowledge: bool,
        /// Why (recorded with your name).
        #[arg(long)]
        reason: String,
        /// The provider's charge (required with --as succeeded).
        #[arg(long)]
        charge_id: Option<String>,
        /// What the provider charged, in minor units, when it no longer lists the charge by key.
        #[arg(long, requires_all = ["currency", "charged_at"])]
        amount: Option<i64>,
        /// The charge's currency (with --amount).
        #[arg(long, requires = "amount")]
        currency: Option<String>,
        /// When the provider created the charge, RFC 3339 (with --amount).
        #[arg(long, requires = "amount")]
        charged_at: Option<String>,
        /// With --as failed: settle as failed although a recorded charge says the payment succeeded
        /// (you refunded it, say); --reason must say why.
        #[arg(long, requires = "outcome")]
        force: bool,
        /// Who you are (default: $USER).
        #[arg(long)]
        operator: Option<String>,
    },
}

/// `resolve --as`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResolveAs {
    /// The provider charged the customer.
    Succeeded,
    /// No money moved.
    Failed,
}

/// Why an operator command did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An argument is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The named tenant, key, payment, dead letter or run does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The action does not apply to the current state; nothing was changed.
    #[error("{0}")]
    Refused(String),
    /// The operator's role does not allow the action; nothing was changed.
    #[error("{0}")]
    Forbidden(String),
    /// Something failed underneath (the database, the provider).
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl CliError {
    /// The process exit code for this failure: 1 failed (e.g. the database is unreachable), 2 bad
    /// usage or argument, 3 the named thing does not exist, 4 refused (the action does not apply to
    /// the thing's current state), 5 not allowed for the operator's role. A command that succeeds
    /// exits 0, and `main` exits 78 when the configuration is invalid.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Self::Failed(_) => 1,
            Self::Invalid(_) => 2,
            Self::NotFound(_) => 3,
            Self::Refused(_) => 4,
            Self::Forbidden(_) => 5,
        })
    }

    /// The one-line message for stderr, with the cause chain of an underlying failure.
    pub fn one_line(&self) -> String {
        match self {
            Self::Failed(error) => format!("{error:#}"),
            other => other.to_string(),
        }
    }
}

/// What operator commands need; built by `main`.
pub struct Context {
    /// The loaded settings.
    pub settings: Settings,
    /// A pool on the configured database.
    pub pool: PgPool,
    /// The operator's name when `--operator` is not given (`$USER`, read by `main`).
    pub default_operator: Option<String>,
}

/// Runs one operator command (anything but `serve`).
pub async fn execute(command: Command, ctx: &Context) -> Result<Box<dyn Report>, CliError> {
    match command {
        Command::Serve => Err(CliError::Invalid("`serve` runs the service; it is not an operator command".into())),
        Command::Migrate => migrate(&ctx.pool).await.map(boxed),
        Command::Tenants(TenantsCommand::Create { name, rate_limit, provider_account }) => {
            let conn = &mut *connection(ctx).await?;
            tenants::create(conn, &name, rate_limit, provider_account.as_deref()).await.map(boxed)
        }
        Command::Tenants(TenantsCommand::List) => tenants::list(&mut *connection(ctx).await?).await.map(boxed),
        Command::Tenants(TenantsCommand::Connect { tenant, account }) => {
            tenants::connect(&mut *connection(ctx).await?, &tenant, Some(&account)).await.map(boxed)
        }
        Command::Tenants(TenantsCommand::Disconnect { tenant }) => {
            tenants::connect(&mut *connection(ctx).await?, &tenant, None).await.map(boxed)
        }
        Command::Keys(KeysCommand::Issue { tenant }) => {
            tenants::issue_key(&mut *connection(ctx).await?, &tenant).await.map(boxed)
        }
        Command::Keys(KeysCommand::Revoke { tenant, key_id }) => {
            tenants::revoke_key(&mut *connection(ctx).await?, &tenant, &key_id).await.map(boxed)
        }
        Command::DeadLetters(command) => dead_letter_command(command, ctx).await,
        Command::Operators(OperatorsCommand::Bootstrap { name }) => {
            let ttl = ctx.settings.operators.token_ttl();
            accounts::bootstrap(&mut *connection(ctx).await?, &name, ttl).await.map(boxed)
        }
        Command::Recon(ReconCommand::Run { from, to }) => {
            let provider =
                ConfiguredProvider::new(&ctx.settings.provider).context("cannot build the provider client")?;
            let recon = Reconciliation::new(ctx.pool.clone(), provider, ctx.settings.recon_config());
            recon::commands::run(&recon, &from, &to).await.map(boxed)
        }
        Command::Recon(ReconCommand::Runs { limit }) => {
            recon::commands::list(&mut *connection(ctx).await?, limit).await.map(boxed)
        }
        Command::Recon(ReconCommand::Show { run_id }) => {
            recon::commands::show(&mut *connection(ctx).await?, run_id).await.map(boxed)
        }
    }
}

async fn dead_letter_command(command: DeadLettersCommand, ctx: &Context) -> Result<Box<dyn Report>, CliError> {
    match command {
        DeadLettersCommand::List { open: _, all } => {
            let filter = if all { Filter::All } else { Filter::Open };
            queries::list(&mut *connection(ctx).await?, filter, None).await.map(boxed)
        }
        DeadLettersCommand::Show { payment_id } => {
            queries::show(&mut *connection(ctx).await?, payment_id).await.map(boxed)
        }
        DeadLettersCommand::Retry { payment_id, reason, operator, outside_key_window } => {
            let operator = operator_of(operator, ctx)?;
            let retry = Retry {
                payment_id,
                operator: &operator,
                reason: &reason,
                resend_horizon: ctx.settings.key_window().resend_horizon(),
                outside_key_window,
            };
            actions::retry(&mut *connection(ctx).await?, &retry).await.map(boxed)
        }
        DeadLettersCommand::Resolve {
            payment_id,
            outcome,
            acknowledge: _,
            reason,
            charge_id,
            amount,
            currency,
            charged_at,
            force,
            operator,
        } => {
            let operator = operator_of(operator, ctx)?;
            let asked = match outcome {
                None => Asked::Acknowledge,
                Some(ResolveAs::Failed) => Asked::Failed { charge_id, force },
                Some(ResolveAs::Succeeded) => Asked::Succeeded { charge_id, amount, currency, charged_at },
            };
            let provider = || {
                ConfiguredProvider::new(&ctx.settings.provider)
                    .context("cannot build the provider client")
                    .map_err(CliError::Failed)
            };
            let decision = actions::resolution(&mut *connection(ctx).await?, provider, payment_id, asked).await?;
            actions::resolve(&mut *connection(ctx).await?, payment_id, &decision, &operator, &reason).await.map(boxed)
        }
    }
}

fn operator_of(given: Option<String>, ctx: &Context) -> Result<Operator, CliError> {
    Operator::parse(given.as_deref().or(ctx.default_operator.as_deref()).unwrap_or_default())
}

fn boxed<R: Report + 'static>(report: R) -> Box<dyn Report> {
    Box::new(report)
}

async fn connection(ctx: &Context) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, CliError> {
    Ok(ctx.pool.acquire().await.context("cannot reach the database")?)
}

/// `migrate`: the schema version after applying every pending migration.
#[derive(Debug, serde::Serialize)]
pub struct Migrated {
    /// The latest applied migration.
    pub schema_version: i64,
    /// Whether the tables are distributed by tenant on Citus.
    pub distributed: bool,
}

impl Report for Migrated {
    fn human(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        let layout = if self.distributed { "; tables distributed by tenant on Citus" } else { "" };
        writeln!(out, "migrations applied; schema version {}{layout}", self.schema_version)
    }

    fn json(&self) -> serde_json::Value {
        crate::render::to_json(self)
    }
}

async fn migrate(pool: &PgPool) -> Result<Migrated, CliError> {
    let layout = db::migrate(pool).await.context("cannot apply the migrations")?;
    db::check_ready(pool).await.context("the schema is not current after migrating")?;
    let schema_version = db::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    Ok(Migrated { schema_version, distributed: layout == db::Layout::DistributedByTenant })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_subcommand_means_serve() {
        let cli = Cli::try_parse_from(["oncepay-reconciler"]).unwrap();
        assert!(cli.command.is_none());
    }

    #[test]
    fn resolving_needs_an_outcome_or_an_acknowledgement_and_a_reason() {
        let id = "0190c1f2-aaaa-7bbb-8ccc-123456789abc";
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["oncepay-reconciler", "dead-letters", "resolve", id], args].concat())
        };
        assert!(parse(&["--as", "failed", "--reason", "card expired"]).is_ok());
        assert!(parse(&["--acknowledge", "--reason", "refunded by hand"]).is_ok());
        assert!(parse(&["--reason", "no outcome"]).is_err());
        assert!(parse(&["--as", "failed"]).is_err());
        assert!(parse(&["--as", "failed", "--acknowledge", "--reason", "both"]).is_err());
        assert!(parse(&["--as", "succeeded", "--charge-id", "ch_1", "--amount", "5", "--reason", "x"]).is_err());
    }
}
