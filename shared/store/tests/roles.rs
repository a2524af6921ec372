//! The processes' database roles (migration 0380) against a real PostgreSQL: each role is refused
//! what it must not do, no role owns a table, and every table's grants are the ones
//! docs/operating.md lists ("Database roles"). Each test gets a fresh, migrated database, reached as
//! each role in turn.

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use sqlx::{Connection, PgConnection, PgPool};

const API: &str = "oncepay_api";
const WORKER: &str = "oncepay_worker";
const RECONCILER: &str = "oncepay_reconciler";

/// A connection to the test's database as `role`.
async fn connect_as(pool: &PgPool, role: &str) -> PgConnection {
    PgConnection::connect_with(&pool.connect_options().as_ref().clone().username(role)).await.unwrap()
}

/// Runs `sql` as `role` and returns PostgreSQL's error code, or `None` when it was allowed.
async fn refusal(pool: &PgPool, role: &str, sql: &'static str) -> Option<String> {
    let mut connection = connect_as(pool, role).await;
    let result = sqlx::raw_sql(sql).execute(&mut connection).await;
    result.err().map(|error| match error {
        sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()).unwrap_or_default(),
        other => panic!("{role} running {sql:?}: not a database error: {other}"),
    })
}

/// Asserts `role` is refused `sql` for want of privilege (SQLSTATE 42501), not for any other reason.
async fn assert_refused(pool: &PgPool, role: &str, sql: &'static str) {
    let code = refusal(pool, role, sql).await;
    assert_eq!(code.as_deref(), Some("42501"), "{role} must be refused {sql:?} for want of privilege");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_api_and_the_worker_may_not_touch_operator_tables(pool: PgPool) {
    for role in [API, WORKER] {
        for sql in [
            "SELECT count(*) FROM operators",
            "SELECT count(*) FROM operator_tokens",
            "SELECT count(*) FROM operator_sessions",
            "SELECT count(*) FROM proposals",
            "SELECT count(*) FROM operator_audit",
            "INSERT INTO operator_audit (operator_name, action, outcome) VALUES ('mallory', 'x', 'done')",
        ] {
            assert_refused(&pool, role, sql).await;
        }
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_api_may_not_settle_a_payment_nor_issue_a_key(pool: PgPool) {
    for sql in [
        "UPDATE payments SET status = 'succeeded'",
        "UPDATE payments SET refunded = amount",
        "INSERT INTO ledger_entries (tenant_id, payment_id, amount, currency) \
         VALUES (gen_random_uuid(), gen_random_uuid(), 1, 'EUR')",
        "INSERT INTO api_keys (tenant_id, key_id, secret_sha256, label) \
         VALUES (gen_random_uuid(), 'k', sha256('s'), 'l')",
        "UPDATE tenants SET provider_account = 'acct_other'",
        "DELETE FROM idempotency_keys",
    ] {
        assert_refused(&pool, API, sql).await;
    }
    // What it does need stays allowed: the refund reservation, and nothing else of a payment.
    assert_eq!(refusal(&pool, API, "UPDATE payments SET refunds_reserved = refunds_reserved").await, None);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn nobody_removes_or_hides_an_audit_row_not_even_the_reconciler(pool: PgPool) {
    for role in [API, WORKER, RECONCILER] {
        for sql in [
            "UPDATE operator_audit SET action = 'nothing'",
            "DELETE FROM operator_audit",
            "TRUNCATE operator_audit",
            "ALTER TABLE operator_audit DISABLE TRIGGER USER",
            "SET session_replication_role = replica",
            "CREATE TABLE shadow (id int)",
        ] {
            assert_refused(&pool, role, sql).await;
        }
    }
    // The reconciler appends and reads.
    assert_eq!(
        refusal(
            &pool,
            RECONCILER,
            "INSERT INTO operator_audit (operator_name, action, outcome) VALUES ('ada', 'test', 'done')"
        )
        .await,
        None
    );
    assert_eq!(refusal(&pool, RECONCILER, "SELECT count(*) FROM operator_audit").await, None);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn only_the_migrating_role_owns_tables(pool: PgPool) {
    let owners: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, pg_get_userbyid(c.relowner)::text FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S', 'v', 'm') \
           AND pg_get_userbyid(c.relowner) <> current_user",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(owners, Vec::<(String, String)>::new(), "tables owned by another role than the migrating one");
    let powerful: Vec<String> = sqlx::query_scalar(
        "SELECT rolname::text FROM pg_roles WHERE rolname = ANY($1) \
           AND (rolsuper OR rolcreaterole OR rolcreatedb OR rolreplication OR rolbypassrls)",
    )
    .bind([API, WORKER, RECONCILER])
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(powerful, Vec::<String>::new(), "a process role with more than a login");
}

/// Every table's privileges for each role, as `role table` → `SELECT,INSERT,…` (table-wide ones,
/// then column ones as `UPDATE(column)`).
async fn grants(pool: &PgPool) -> BTreeMap<String, String> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT grantee::text, table_name::text, privilege_type::text FROM information_schema.role_table_grants \
         WHERE table_schema = 'public' AND grantee = ANY($1) \
         UNION ALL \
         SELECT grantee::text, table_name::text, privilege_type || '(' || column_name || ')' \
         FROM information_schema.column_privileges c \
         WHERE table_schema = 'public' AND grantee = ANY($1) AND NOT EXISTS ( \
             SELECT 1 FROM information_schema.role_table_grants t WHERE t.table_schema = 'public' \
               AND t.grantee = c.grantee AND t.table_name = c.table_name AND t.privilege_type = c.privilege_type) \
         ORDER BY 1, 2, 3",
    )
    .bind([API, WORKER, RECONCILER])
    .fetch_all(pool)
    .await
    .unwrap();
    let mut grants = BTreeMap::<String, Vec<String>>::new();
    for (role, table, privilege) in rows {
        grants.entry(format!("{role} {table}")).or_default().push(privilege);
    }
    grants.into_iter().map(|(key, privileges)| (key, privileges.join(","))).collect()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn every_table_grants_each_role_exactly_what_the_readme_lists(pool: PgPool) {
    let read = "SELECT";
    let append = "INSERT,SELECT";
    let change = "INSERT,SELECT,UPDATE";
    let all = "DELETE,INSERT,SELECT,UPDATE";
    let mut expected: BTreeMap<String, String> = BTreeMap::new();
    let mut grant = |role: &str, tables: &[&str], privileges: &str| {
        for table in tables {
            expected.insert(format!("{role} {table}"), privileges.to_owned());
        }
    };
    grant(API, &["_sqlx_migrations", "tenants", "api_keys", "broker_users"], read);
    grant(API, &["idempotency_keys", "broker_queue_samples"], change);
    grant(API, &["payment_events", "outbox", "refunds", "refund_keys", "refund_events", "refund_outbox"], append);
    grant(API, &["payments"], "INSERT,SELECT,UPDATE(refunds_reserved)");
    // Merchants manage their endpoints, write test events, and replay deliveries (removing an
    // endpoint removes its deliveries and their attempts; a replay keeps a delivered one's attempt).
    grant(API, &["merchant_endpoints", "merchant_deliveries"], all);
    grant(API, &["merchant_events"], append);
    grant(API, &["merchant_delivery_attempts"], "DELETE,INSERT,SELECT");

    grant(WORKER, &["_sqlx_migrations", "tenants"], read);
    grant(WORKER, &["payments", "idempotency_keys", "refunds", "refund_keys"], "SELECT,UPDATE");
    grant(WORKER, &["payment_events", "ledger_entries", "refund_events", "refund_ledger_entries"], append);
    grant(WORKER, &["outbox", "refund_outbox"], all);
    grant(WORKER, &["unknown_payments"], change);
    // The events of the changes it makes, and their delivery.
    grant(WORKER, &["merchant_events", "merchant_delivery_attempts"], append);
    grant(WORKER, &["merchant_deliveries"], change);
    grant(WORKER, &["merchant_endpoints"], "SELECT,UPDATE");

    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    for table in &tables {
        let privileges = match table.as_str() {
            "_sqlx_migrations" => read,
            "operator_audit" => append,
            _ => all,
        };
        grant(RECONCILER, &[table.as_str()], privileges);
    }
    // The console's one view: every attempt of a delivery.
    grant(RECONCILER, &["merchant_delivery_all_attempts"], read);

    // A new table shows up here with no grants: give each role what it needs in the migration that
    // makes the table, and list it in docs/operating.md, "Database roles".
    assert_eq!(grants(&pool).await, expected);
}
