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
