//! The refund phase's data, loaded into a freshly migrated database: the refundable payments,
//! succeeded, named by the ids both load generators compute, each with its whole amount left to
//! refund; and the refunds made before the run, which agree with their payments as refund intake
//! and the worker would have left them. Every row passes the schema's constraints, or the load fails.

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used)]

use oncepay_bench::dataset::{self, Tenant};
use sqlx::PgPool;
use uuid::Uuid;

/// Enough to span more than one byte of the ids' counter.
const PAYMENTS: u64 = 300;

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn refundable_payments_are_succeeded_and_named_as_the_load_generators_name_them(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let tenant = Tenant::create(&mut conn, "bench").await.unwrap();

    let refundable = dataset::load_refundable(&mut conn, tenant.id, PAYMENTS).await.unwrap();

    let ids: Vec<Uuid> = (0..PAYMENTS).map(|i| refundable.payment_id(i)).collect();
    let refundable_rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM payments \
         WHERE tenant_id = $1 AND payment_id = ANY($2) AND status = 'succeeded' \
         AND refunds_reserved = 0 AND refunded = 0 AND amount = 1999 AND currency = 'EUR' \
         AND provider_charge_id IS NOT NULL AND send_attempts = 1",
    )
    .bind(tenant.id.as_uuid())
    .bind(&ids)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(refundable_rows, i64::try_from(PAYMENTS).unwrap());
    assert_eq!(count(&pool, "SELECT count(*) FROM payments").await, refundable_rows, "nothing else was loaded");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn refunded_payments_were_refunded_in_full_once_with_a_key_and_an_audit_row(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let tenant = Tenant::create(&mut conn, "bench").await.unwrap();
    let payments = i64::try_from(PAYMENTS).unwrap();

    let loaded = dataset::load_refunded(&mut conn, tenant.id, PAYMENTS, "history").await.unwrap();

    assert_eq!(loaded, PAYMENTS);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM payments p JOIN refunds r USING (tenant_id, payment_id) \
             WHERE p.status = 'succeeded' AND r.status = 'succeeded' \
             AND p.refunded = p.amount AND p.refunds_reserved = p.amount AND r.amount = p.amount \
             AND r.currency = p.currency AND r.provider_refund_id IS NOT NULL"
        )
        .await,
        payments,
        "each payment refunded in full by one succeeded refund"
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM payments").await, payments);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM refund_keys k JOIN refunds r USING (tenant_id, refund_id) \
             WHERE k.response_status = 200 AND k.response_body ->> 'id' = r.refund_id::text \
             AND k.response_body ->> 'status' = 'succeeded'"
        )
        .await,
        payments,
        "one key per refund, with its stored response"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM refunds r WHERE event_count = (SELECT count(*) FROM refund_events e \
             WHERE (e.tenant_id, e.refund_id) = (r.tenant_id, r.refund_id) AND e.to_status = 'pending')"
        )
        .await,
        payments,
        "each refund's history is counted"
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM refund_outbox").await, 0, "nothing left to send");
}
