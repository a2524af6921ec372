//! The backlog sample against a real PostgreSQL: of payments and of refunds alike, it counts the
//! outbox by state and those `unknown` exactly and reports the age of the oldest waiting and of the
//! oldest unknown; and it counts the open dead letters, the dead-lettered refunds and the open
//! conflicts on refunds.

use std::time::Duration;

use oncepay_domain::ids::PaymentId;
use oncepay_ops::dead_letters::actions::Operator;
use oncepay_ops::dead_letters::refunds as dead_refunds;
use oncepay_ops::dead_letters::{self, Kind};
use oncepay_reconciler::backlog::{self, Backlog, Queue};
use oncepay_store::fixtures::tenant;
use serde_json::json;
use sqlx::PgPool;

use crate::refund_proposals::{contradicted_refund, dead_lettered_refund};
use crate::support::{accept, refund, succeeded_payment, unknown_payment, unknown_refund};

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

    let payments = &sampled.payments;
    let counts = (payments.outbox_due, payments.outbox_scheduled, payments.outbox_leased, payments.unknown);
    assert_eq!(counts, (2, 1, 1, 3), "{sampled:?}");
    assert_eq!((sampled.dead_letters_unresolved, sampled.dead_letters_conflict), (1, 1), "{sampled:?}");
    assert!(around(payments.oldest_pending, 600), "{sampled:?}");
    assert!(around(payments.oldest_unknown, 3600), "{sampled:?}");
    assert_eq!(sampled.refunds, Queue::default(), "payments' only");
}

fn around(age: Duration, expected: u64) -> bool {
    age >= Duration::from_secs(expected) && age < Duration::from_secs(expected + 60)
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_sample_counts_refunds_waiting_unknown_and_dead_lettered_as_it_counts_payments(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, tenant_id, "order-1", 100_000).await;
    // Two unknown refunds, one of them for an hour, and one dead-lettered; made first, because each
    // is sent by claiming every refund that is due.
    let long_unknown = unknown_refund(&pool, tenant_id, payment_id, "unknown-old", 100, 60).await;
    sqlx::query!(
        "UPDATE refund_events SET created_at = now() - interval '1 hour' WHERE refund_id = $1 AND to_status = 'unknown'",
        long_unknown.as_uuid()
    )
    .execute(&pool)
    .await
    .unwrap();
    unknown_refund(&pool, tenant_id, payment_id, "unknown-new", 100, 60).await;
    dead_lettered_refund(&pool, tenant_id, payment_id, "dead-lettered", 100, 60).await;
    // The refund outbox: two due (one asked for ten minutes ago), one waiting for a retry, one leased.
    let refund_sql = |statement: &'static str, refund_id: oncepay_domain::ids::RefundId| {
        let pool = pool.clone();
        async move {
            sqlx::query(statement).bind(refund_id.as_uuid()).execute(&pool).await.unwrap();
        }
    };
    let old = refund(&pool, tenant_id, payment_id, "due-old", 100).await;
    refund_sql("UPDATE refund_outbox SET created_at = now() - interval '10 minutes' WHERE refund_id = $1", old).await;
    refund(&pool, tenant_id, payment_id, "due-new", 100).await;
    let scheduled = refund(&pool, tenant_id, payment_id, "scheduled", 100).await;
    refund_sql("UPDATE refund_outbox SET available_at = now() + interval '1 minute' WHERE refund_id = $1", scheduled)
        .await;
    let leased = refund(&pool, tenant_id, payment_id, "leased", 100).await;
    refund_sql(
        "UPDATE refund_outbox SET locked_by = 'w', locked_until = now() + interval '1 minute', fencing_token = 1,
                attempts = 1
         WHERE refund_id = $1",
        leased,
    )
    .await;

    let sampled = backlog::sample(&pool).await.unwrap();

    let refunds = &sampled.refunds;
    let counts = (refunds.outbox_due, refunds.outbox_scheduled, refunds.outbox_leased, refunds.unknown);
    assert_eq!(counts, (2, 1, 1, 2), "{sampled:?}");
    assert_eq!(sampled.refunds_dead_lettered, 1, "{sampled:?}");
    assert!(around(refunds.oldest_pending, 600), "{sampled:?}");
    assert!(around(refunds.oldest_unknown, 3600), "{sampled:?}");
    assert_eq!(sampled.payments.unknown, 0, "refunds' only");
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
