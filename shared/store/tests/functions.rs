//! Today's definition of every function the migrations create, kept in `sql/functions/` (one file
//! per function, as PostgreSQL prints it with `pg_get_functiondef`), so that nobody has to read
//! nine migrations to find the current `intake`. The test compares each file with the database a
//! fresh migration builds, and fails on any difference, a function without its file or a file
//! without its function.
//!
//! After a migration changes a function, refresh the files with
//! `REFRESH_SQL_FUNCTIONS=1 cargo xtask test -- -E 'test(sql_functions)'` and read the diff. (Not an
//! `ONCEPAY_` variable: that prefix configures the binaries.)

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use sqlx::PgPool;

/// Where the files are.
fn directory() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql").join("functions")
}

/// Every function in the `public` schema, by name, each overload's definition in turn.
async fn defined(pool: &PgPool) -> BTreeMap<String, String> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT p.proname::text, pg_get_functiondef(p.oid)
           FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = 'public' AND p.prokind = 'f'
          ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut functions: BTreeMap<String, String> = BTreeMap::new();
    for (name, definition) in rows {
        let text = functions.entry(name).or_default();
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(definition.trim_end());
        text.push_str(";\n");
    }
    functions
}

/// The files, by function name.
fn kept() -> BTreeMap<String, String> {
    let Ok(entries) = std::fs::read_dir(directory()) else { return BTreeMap::new() };
    entries
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "sql"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).unwrap())
        })
        .collect()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn sql_functions_are_kept_as_the_migrations_leave_them(pool: PgPool) {
    let defined = defined(&pool).await;
    assert!(defined.contains_key("intake") && defined.contains_key("claim_sends"), "{:?}", defined.keys());

    if std::env::var_os("REFRESH_SQL_FUNCTIONS").is_some() {
        let directory = directory();
        std::fs::create_dir_all(&directory).unwrap();
        for name in kept().keys().filter(|name| !defined.contains_key(*name)) {
            std::fs::remove_file(directory.join(format!("{name}.sql"))).unwrap();
        }
        for (name, definition) in &defined {
            std::fs::write(directory.join(format!("{name}.sql")), definition).unwrap();
        }
    }

    let kept = kept();
    let stale: BTreeSet<&String> =
        defined.keys().chain(kept.keys()).filter(|name| defined.get(*name) != kept.get(*name)).collect();
    assert!(
        stale.is_empty(),
        "shared/store/sql/functions/ is not what the migrations define for {stale:?}; refresh it with \
         REFRESH_SQL_FUNCTIONS=1 cargo xtask test -- -E 'test(sql_functions)'"
    );
}
