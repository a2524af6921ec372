//! The backlog sample against a real PostgreSQL: it counts the outbox by state, the unknown queue,
//! the open dead letters and the open conflicts on refunds exactly, and reports the age of the
//! oldest waiting payment and of the oldest unknown one.

use std::time::Duration;

use oncepay_domain::ids::PaymentId;
use oncepay_ops::dead_letters::actions::Operator;
use oncepay_ops::dead_letters::refunds as dead_refunds;
use oncepay_ops::dead_letters::{self, Kind};
use oncepay_reconciler::backlog::{self, Backlog};
use oncepay_store::fixtures::tenant;
use serde_json::json;
use sqlx::PgPool;

use crate::refund_proposals::contradicted_refund;
use crate::support::{accept, succeeded_payment, unknown_payment};

async fn sql(pool: &PgPool, statement: &str, payment_id: PaymentId) {
    sqlx::query(sqlx::AssertSqlSafe(statement.to_owned())).bind(payment_id.as_uuid()).execute(pool).await.unwrap();
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_empty_system_has_no_backlog(pool: PgPool) {
    assert_eq!(backlog::sample(&pool).await.unwrap(), Backlog::default());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_sample_counts_every_kind_of_waiting_work_and_the_oldest_of_it(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    // The outbox: two due (one accepted ten minutes ago), one waiting for a retry, one leased.
    let old = accept(&pool, tenant_id, "due-old", 100).await;
    sql(&pool, "UPDATE outbox SET created_at = now() - interval '10 minutes' WHERE payment_id = $1", old).await;
    accept(&pool, tenant_id, "due-new", 100).await;
    let scheduled = accept(&pool, tenant_id, "scheduled", 100).await;
    sql(&pool, "UPDATE outbox SET available_at = now() + interval '1 minute' WHERE payment_id = $1", scheduled).await;
    let leased = accept(&pool, tenant_id, "leased", 100).await;
    sql(
        &pool,
        "UPDATE outbox SET locked_by = 'w', locked_until = now() + interval '1 minute',
                fencing_token = nextval('outbox_fencing_token_seq'), attempts = 1
         WHERE payment_id = $1",
        leased,
    )
    .await;
    // Three unknown payments, the oldest unknown for an hour; two of them dead-lettered or in conflict
    // with open entries, and one entry an operator already resolved.
    let long_unknown = unknown_payment(&pool, tenant_id, "unknown-old", 100, 60).await;
    sql(&pool, "UPDATE unknown_payments SET since = now() - interval '1 hour' WHERE payment_id = $1", long_unknown)
        .await;
    unknown_payment(&pool, tenant_id, "unknown-new", 100, 60).await;
    let resolved = unknown_payment(&pool, tenant_id, "unknown-resolved", 100, 60).await;
    let mut conn = pool.acquire().await.unwrap();
    for (payment_id, kind) in [(long_unknown, Kind::Unresolved), (resolved, Kind::Unresolved), (old, Kind::Conflict)] {
        dead_letters::record(&mut conn, tenant_id, payment_id, kind, "test", json!([]), 1).await.unwrap();
    }
    sql(
        &pool,
        "UPDATE dead_letters SET resolved_at = now(), resolved_by = 'operator:test', resolution = 'acknowledged',
                resolution_note = 'test'
         WHERE payment_id = $1",
        resolved,
    )
    .await;

    let sampled = backlog::sample(&pool).await.unwrap();

    let counts = (
        sampled.outbox_due,
        sampled.outbox_scheduled,
        sampled.outbox_leased,
        sampled.unknown,
        sampled.dead_letters_unresolved,
        sampled.dead_letters_conflict,
    );
    assert_eq!(counts, (2, 1, 1, 3, 1, 1), "{sampled:?}");
    let around =
        |age: Duration, expected: u64| age >= Duration::from_secs(expected) && age < Duration::from_secs(expected + 60);
    assert!(around(sampled.oldest_pending, 600), "{sampled:?}");
    assert!(around(sampled.oldest_unknown, 3600), "{sampled:?}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_sample_counts_the_open_conflicts_on_final_refunds(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, tenant_id, "order-1", 1999).await;
    let open = contradicted_refund(&pool, tenant_id, payment_id, "r-open").await;
    let acknowledged = contradicted_refund(&pool, tenant_id, payment_id, "r-acknowledged").await;
    let operator = Operator::parse("alice").unwrap();
    let mut conn = pool.acquire().await.unwrap();
    dead_refunds::acknowledge(&mut conn, tenant_id, acknowledged, &operator, "paid back by hand").await.unwrap();

    let sampled = backlog::sample(&pool).await.unwrap();

    assert_eq!(sampled.refund_conflicts, 1, "{sampled:?}");
    assert_eq!((sampled.dead_letters_unresolved, sampled.dead_letters_conflict), (0, 0), "payments' only");
    let open_entries: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM refund_dead_letters WHERE refund_id = $1 AND resolved_at IS NULL"#,
        open.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(open_entries, 1);
}
