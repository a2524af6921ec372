//! The command line: `oncepay-reconciler [serve]` runs the service; every other subcommand is an
//! operator tool that does one thing against the database and exits.
//!
//! This module owns the argument grammar ([`Cli`]), the mapping of failures to exit codes
//! ([`CliError`]) and the dispatch of operator commands to the modules that implement them. It
//! reads no environment variable and no configuration itself: `main` passes in what it loaded.
//!
//! Exit codes: 0 done; 1 failed (e.g. the database is unreachable); 2 bad usage or argument; 3 the
//! named thing does not exist; 4 refused (the action does not apply to the thing's current state);
//! 78 the configuration is invalid.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use oncepay_shared::db;
use sqlx::PgPool;

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
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Applies every pending database migration, then exits.
    Migrate,
    /// Tenants: create (with a first API key) and list.
    #[command(subcommand)]
    Tenants(TenantsCommand),
    /// A tenant's API keys: issue another, revoke one.
    #[command(subcommand)]
    Keys(KeysCommand),
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
    },
    /// Lists every tenant.
    List,
}

/// `keys …`.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Issues another API key for a tenant and prints it, once.
    Issue {
        /// The tenant's name.
        tenant: String,
    },
    /// Revokes one of a tenant's keys; it stops authenticating at once.
    Revoke {
        /// The tenant's name.
        tenant: String,
        /// The key id printed when the key was issued.
        key_id: String,
    },
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
    /// Something failed underneath (the database, the provider).
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl CliError {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Self::Failed(_) => 1,
            Self::Invalid(_) => 2,
            Self::NotFound(_) => 3,
            Self::Refused(_) => 4,
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
}

/// Runs one operator command (anything but `serve`).
pub async fn execute(command: Command, ctx: &Context) -> Result<Box<dyn Report>, CliError> {
    match command {
        Command::Migrate => migrate(&ctx.pool).await.map(boxed),
        Command::Tenants(TenantsCommand::Create { name, rate_limit }) => {
            tenants::create(&mut *connection(ctx).await?, &name, rate_limit).await.map(boxed)
        }
        Command::Tenants(TenantsCommand::List) => tenants::list(&mut *connection(ctx).await?).await.map(boxed),
        Command::Keys(KeysCommand::Issue { tenant }) => {
            tenants::issue_key(&mut *connection(ctx).await?, &tenant).await.map(boxed)
        }
        Command::Keys(KeysCommand::Revoke { tenant, key_id }) => {
            tenants::revoke_key(&mut *connection(ctx).await?, &tenant, &key_id).await.map(boxed)
        }
    }
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
}

impl Report for Migrated {
    fn human(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        writeln!(out, "migrations applied; schema version {}", self.schema_version)
    }

    fn json(&self) -> serde_json::Value {
        crate::render::to_json(self)
    }
}

async fn migrate(pool: &PgPool) -> Result<Migrated, CliError> {
    db::migrate(pool).await.context("cannot apply the migrations")?;
    db::check_ready(pool).await.context("the schema is not current after migrating")?;
    let schema_version = db::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    Ok(Migrated { schema_version })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }
}
