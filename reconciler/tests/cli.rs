//! The operator CLI: the command functions against a real PostgreSQL, and the real binary run as a
//! child process against a `#[sqlx::test]` database.

// Helpers outside `#[test]` functions fail loudly too: clippy's test exemption does not reach them.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::{Command, Output};

use oncepay_reconciler::cli::CliError;
use oncepay_reconciler::tenants;
use oncepay_shared::api_key;
use oncepay_shared::db;
use oncepay_shared::store::tenants::find_api_key;
use sqlx::PgPool;

/// Whether `token` authenticates as the api checks it: parse, primary-key read, hash comparison.
async fn authenticates(pool: &PgPool, token: &str) -> bool {
    let Some(presented) = api_key::parse(token) else { return false };
    let mut conn = pool.acquire().await.unwrap();
    let stored = find_api_key(&mut conn, presented.tenant_id, &presented.key_id).await.unwrap();
    stored.is_some_and(|key| !key.revoked && presented.secret_hash.matches(&key.secret_sha256))
}

fn reconciler(database_url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oncepay-reconciler"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .env_remove("ONCEPAY_CONFIG")
        .output()
        .unwrap()
}

#[sqlx::test(migrator = "oncepay_shared::db::MIGRATOR")]
async fn a_new_tenants_first_key_authenticates_and_a_revoked_one_does_not(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();

    let created = tenants::create(&mut conn, "acme", Some(50)).await.unwrap();
    let second = tenants::issue_key(&mut conn, "acme").await.unwrap();
    tenants::revoke_key(&mut conn, "acme", &created.key_id).await.unwrap();

    assert_eq!(created.tenant.rate_limit_per_second, Some(50));
    assert_ne!(created.api_key, second.api_key);
    assert!(!authenticates(&pool, &created.api_key).await);
    assert!(authenticates(&pool, &second.api_key).await);
}

#[sqlx::test(migrator = "oncepay_shared::db::MIGRATOR")]
async fn tenant_commands_refuse_what_cannot_be_done_and_change_nothing(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    tenants::create(&mut conn, "acme", None).await.unwrap();

    let taken = tenants::create(&mut conn, "acme", None).await;
    let bad_name = tenants::create(&mut conn, "Acme Corp", None).await;
    let bad_limit = tenants::create(&mut conn, "globex", Some(0)).await;
    let no_tenant = tenants::issue_key(&mut conn, "nobody").await;
    let no_key = tenants::revoke_key(&mut conn, "acme", "0123456789abcdef").await;

    assert!(matches!(taken, Err(CliError::Refused(_))), "{taken:?}");
    assert!(matches!(bad_name, Err(CliError::Invalid(_))), "{bad_name:?}");
    assert!(matches!(bad_limit, Err(CliError::Invalid(_))), "{bad_limit:?}");
    assert!(matches!(no_tenant, Err(CliError::NotFound(_))), "{no_tenant:?}");
    assert!(matches!(no_key, Err(CliError::NotFound(_))), "{no_key:?}");
    assert_eq!(support::count(&pool, "tenants").await, 1);
    assert_eq!(support::count(&pool, "api_keys").await, 1);
}

#[sqlx::test(migrations = false)]
async fn the_binary_migrates_an_empty_database_then_creates_a_tenant_whose_key_authenticates(pool: PgPool) {
    let url = support::url_of(&pool);

    let migrated = reconciler(&url, &["migrate"]);
    let created = reconciler(&url, &["tenants", "create", "acme", "--json"]);
    let again = reconciler(&url, &["tenants", "create", "acme"]);
    let listed = reconciler(&url, &["tenants", "list"]);

    assert!(migrated.status.success(), "{}", String::from_utf8_lossy(&migrated.stderr));
    db::check_ready(&pool).await.unwrap();
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let json: serde_json::Value = serde_json::from_slice(&created.stdout).unwrap();
    assert!(json["notice"].as_str().unwrap().contains("shown once"));
    assert!(authenticates(&pool, json["api_key"].as_str().unwrap()).await);
    assert_eq!(again.status.code(), Some(4));
    let stderr = String::from_utf8(again.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("already exists"), "{stderr}");
    let table = String::from_utf8(listed.stdout).unwrap();
    assert!(table.starts_with("NAME") && table.contains("acme"), "{table}");
}

#[test]
fn an_unreachable_database_is_a_one_line_failure_with_exit_code_1() {
    let output = reconciler("postgres://postgres@127.0.0.1:1/nothing", &["tenants", "list"]);

    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot reach the database"), "{stderr}");
}
