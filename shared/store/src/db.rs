//! PostgreSQL: the migrations, the connection pool, and the readiness check.

use std::str::FromStr;
use std::time::Duration;

use secrecy::ExposeSecret;
use sqlx::migrate::{Migrate, MigrateError, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{AssertSqlSafe, Connection, PgPool};

use oncepay_service::config::DatabaseSettings;

/// The schema, embedded from `migrations/` at build time.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// Where sqlx records the applied migrations.
const MIGRATIONS_TABLE: &str = "_sqlx_migrations";

/// Connection options for `settings`: every connection carries the binary's `application_name`
/// (visible in `pg_stat_activity`), a `statement_timeout`, and JIT compilation off. With
/// `database.ca_file`, every connection is TLS, checked against that file's authorities: the
/// server's name too, unless the URL settles for `sslmode=verify-ca`.
pub fn connect_options(settings: &DatabaseSettings, application_name: &str) -> Result<PgConnectOptions, sqlx::Error> {
    let mut options = PgConnectOptions::from_str(settings.url.expose_secret())?
        .application_name(application_name)
        // No JIT compilation: every statement oncepay runs is short, and compiling one whose plan
        // merely looks expensive (a claim's per-row subquery) took longer than running it.
        .options([("statement_timeout", format!("{}ms", settings.statement_timeout_ms)), ("jit", "off".to_owned())]);
    if let Some(ca_file) = &settings.ca_file {
        // Read once, here: a file that cannot be read stops the process at start, not every
        // connection later.
        let pem = std::fs::read(ca_file).map_err(|error| {
            sqlx::Error::Configuration(format!("cannot read database.ca_file {}: {error}", ca_file.display()).into())
        })?;
        options = options.ssl_root_cert_from_pem(pem);
        if !matches!(options.get_ssl_mode(), PgSslMode::VerifyCa) {
            options = options.ssl_mode(PgSslMode::VerifyFull);
        }
    }
    Ok(options)
}

/// A lazily connecting pool, so a binary starts (and serves `/healthz`) while the database is down;
/// every request then fails closed with 503 until it is back.
pub fn pool(settings: &DatabaseSettings, options: PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(Duration::from_millis(settings.acquire_timeout_ms))
        .connect_lazy_with(options)
}

/// How long one attempt of [`wait_until_reachable`] may take.
const ATTEMPT_WITHIN: Duration = Duration::from_secs(5);
/// The pause between two attempts of [`wait_until_reachable`].
const ATTEMPT_EVERY: Duration = Duration::from_millis(250);

/// Why PostgreSQL took no connection from a command.
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    /// An error that trying again would not mend: a wrong password, an unknown database.
    #[error("{0}")]
    Refused(sqlx::Error),
    /// None within the wait.
    #[error("no connection within {} s ({attempts} attempts); the last one: {last}", within.as_secs())]
    TimedOut {
        /// The wait.
        within: Duration,
        /// The attempts made.
        attempts: u32,
        /// What the last attempt met.
        last: String,
    },
}

/// Waits up to `within` for PostgreSQL to take a connection on `options`, for a one-shot command
/// that nothing retries (a service's loops retry on their own). Each attempt gets at most 5 s: one
/// that hangs (a name lookup, or a connection whose packets are lost) leaves time for the next,
/// where a pool's acquire spends its whole timeout on it. What may pass (no answer, a refused or
/// broken connection, a server starting up or full) is tried again every quarter second; what will
/// not (a wrong password, an unknown database) ends the wait at once.
pub async fn wait_until_reachable(options: &PgConnectOptions, within: Duration) -> Result<(), Unreachable> {
    let deadline = tokio::time::Instant::now() + within;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let attempt = tokio::time::timeout(left.min(ATTEMPT_WITHIN), sqlx::PgConnection::connect_with(options)).await;
        let last = match attempt {
            Ok(Ok(conn)) => {
                // Only to be polite to the server: the command connects again through its pool.
                let _ = conn.close().await;
                return Ok(());
            }
            Ok(Err(error)) if !may_pass(&error) => return Err(Unreachable::Refused(error)),
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {} s", left.min(ATTEMPT_WITHIN).as_secs_f32()),
        };
        if tokio::time::Instant::now() + ATTEMPT_EVERY >= deadline {
            return Err(Unreachable::TimedOut { within, attempts, last });
        }
        tokio::time::sleep(ATTEMPT_EVERY).await;
    }
}

/// Whether a failed connection attempt may succeed if made again soon.
fn may_pass(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) => true,
        // cannot_connect_now (starting up or shutting down), too_many_connections.
        sqlx::Error::Database(error) => matches!(error.code().as_deref(), Some("57P03" | "53300")),
        _ => false,
    }
}

/// Why a binary is not ready to serve.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// PostgreSQL cannot be reached.
    #[error("the database cannot be reached")]
    Unreachable(#[source] sqlx::Error),
    /// The schema is older than this binary expects.
    #[error("the database schema is at version {found:?}, this binary needs {expected}")]
    SchemaBehind {
        /// The latest applied migration, if any.
        found: Option<i64>,
        /// The latest migration this binary embeds.
        expected: i64,
    },
}

/// Checks that the database responds and that every embedded migration has been applied.
pub async fn check_ready(pool: &PgPool) -> Result<(), NotReady> {
    let expected = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let found: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(pool)
        .await
        .or_else(|error| match &error {
            // No migrations table at all: nothing was applied.
            sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01") => Ok(None),
            _ => Err(NotReady::Unreachable(error)),
        })?;
    match found {
        Some(version) if version >= expected => Ok(()),
        found => Err(NotReady::SchemaBehind { found, expected }),
    }
}

/// Where the schema lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One PostgreSQL.
    Single,
    /// A Citus cluster, every tenant's rows on one node (`sql/citus.sql`, SCALING.md).
    DistributedByTenant,
}

/// Applies every pending migration and, when the database has the `citus` extension, distributes
/// the tables by tenant (`sql/citus.sql`). Returns where the schema now lives.
pub async fn migrate(pool: &PgPool) -> Result<Layout, MigrateError> {
    let citus: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
        .fetch_one(pool)
        .await?;
    if citus {
        migrate_one_statement_at_a_time(pool).await?;
    }
    // On Citus this finds nothing left to apply, and still checks that every applied migration is
    // the one embedded here.
    MIGRATOR.run(pool).await?;
    if !citus {
        return Ok(Layout::Single);
    }
    sqlx::raw_sql(include_str!("../sql/citus.sql")).execute(pool).await?;
    Ok(Layout::DistributedByTenant)
}

/// Applies every pending migration one statement at a time, each migration in one transaction,
/// and records it as sqlx does.
///
/// sqlx sends a migration as one query of many statements. Once the tables are distributed, Citus
/// passes some DDL on to the other nodes as the text of the whole query, which they refuse
/// ("cannot insert multiple commands into a prepared statement"; seen upgrading a database
/// distributed at migration 120). Statement by statement, each carries its own text. The
/// transaction runs in Citus's sequential mode, since Citus refuses a command on a type after a
/// parallel command on a distributed table in the same transaction. On plain PostgreSQL the setting
/// means nothing, and this gives the same schema as `MIGRATOR.run` (tested).
pub async fn migrate_one_statement_at_a_time(pool: &PgPool) -> Result<(), MigrateError> {
    // A connection of its own, not the pool's: if a migration fails, it closes, and the migration
    // lock it holds goes with it.
    let mut conn = sqlx::PgConnection::connect_with(&pool.connect_options()).await?;
    conn.ensure_migrations_table(MIGRATIONS_TABLE).await?;
    conn.lock().await?;
    let applied: Vec<i64> =
        conn.list_applied_migrations(MIGRATIONS_TABLE).await?.iter().map(|migration| migration.version).collect();
    let pending = MIGRATOR
        .iter()
        .filter(|migration| migration.migration_type.is_up_migration() && !applied.contains(&migration.version));
    for migration in pending {
        let mut tx = conn.begin().await?;
        sqlx::raw_sql("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'").execute(&mut *tx).await?;
        for statement in crate::statements::split(migration.sql.as_str()) {
            sqlx::raw_sql(AssertSqlSafe(statement))
                .execute(&mut *tx)
                .await
                .map_err(|error| MigrateError::ExecuteMigration(error, migration.version))?;
        }
        tx.skip(MIGRATIONS_TABLE, migration).await?;
        tx.commit().await?;
    }
    conn.unlock().await?;
    conn.close().await?;
    Ok(())
}
