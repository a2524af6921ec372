//! Migrating one statement at a time (the Citus path of `db::migrate`) against a real PostgreSQL:
//! from any version, it builds the schema sqlx builds, and records the migrations so that sqlx
//! finds nothing to apply and every checksum equal.

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used)]

use oncepay_store::db::{self, MIGRATOR};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor as _, PgPool};

/// The schema, as text: every column, constraint, index and function of `public`.
async fn schema(pool: &PgPool) -> String {
    sqlx::query_scalar!(
        r#"SELECT concat_ws(E'\n',
             (SELECT string_agg(format('%s.%s %s %s %s', table_name, column_name, data_type, is_nullable,
                                       column_default), E'\n' ORDER BY table_name, column_name)
              FROM information_schema.columns WHERE table_schema = 'public'),
             (SELECT string_agg(format('%s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid)),
                                E'\n' ORDER BY conrelid::regclass::text, conname)
              FROM pg_constraint WHERE connamespace = 'public'::regnamespace),
             (SELECT string_agg(indexdef, E'\n' ORDER BY indexdef) FROM pg_indexes WHERE schemaname = 'public'),
             (SELECT string_agg(pg_get_functiondef(oid), E'\n' ORDER BY proname)
              FROM pg_proc WHERE pronamespace = 'public'::regnamespace)) AS "schema!""#
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A second, empty database on the same server, migrated by sqlx as usual.
async fn migrated_by_sqlx(pool: &PgPool, name: &str) -> PgPool {
    pool.execute(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}"))).await.unwrap();
    pool.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).await.unwrap();
    let other = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(pool.connect_options().as_ref().clone().database(name))
        .await
        .unwrap();
    MIGRATOR.run(&other).await.unwrap();
    other
}

#[sqlx::test(migrations = false)]
async fn a_database_halfway_is_brought_up_to_date_to_the_schema_sqlx_builds(pool: PgPool) {
    // Where the databases distributed before migration 130 were.
    MIGRATOR.run_to(120, &pool).await.unwrap();

    db::migrate_one_statement_at_a_time(&pool).await.unwrap();

    MIGRATOR.run(&pool).await.expect("sqlx finds every migration applied, each with its own checksum");
    db::check_ready(&pool).await.unwrap();
    let reference = migrated_by_sqlx(&pool, "oncepay_reference_halfway").await;
    assert_eq!(schema(&pool).await, schema(&reference).await);
    reference.close().await;
    pool.execute("DROP DATABASE oncepay_reference_halfway").await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn an_empty_database_is_migrated_to_the_schema_sqlx_builds(pool: PgPool) {
    db::migrate_one_statement_at_a_time(&pool).await.unwrap();
    db::migrate_one_statement_at_a_time(&pool).await.expect("a second run finds nothing to do");

    MIGRATOR.run(&pool).await.expect("sqlx finds every migration applied, each with its own checksum");
    let reference = migrated_by_sqlx(&pool, "oncepay_reference_empty").await;
    assert_eq!(schema(&pool).await, schema(&reference).await);
    reference.close().await;
    pool.execute("DROP DATABASE oncepay_reference_empty").await.unwrap();
}
