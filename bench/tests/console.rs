//! The console's history, loaded into a freshly migrated database: every row passes the schema's
//! constraints (or the load fails), and the rows agree with each other as the services would have
//! left them.

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used)]

use oncepay_bench::console::{self, DEAD_LETTERED_EVERY, TENANTS};
use sqlx::PgPool;

/// More than one loader statement's worth would take long here; a few hundred show the same.
const PAYMENTS: u64 = 500;

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_history_is_what_the_services_would_have_written(pool: PgPool) {
    let dead = i64::try_from(PAYMENTS / DEAD_LETTERED_EVERY).unwrap();
    let settled = i64::try_from(PAYMENTS).unwrap() - dead;

    console::load(&mut pool.acquire().await.unwrap(), PAYMENTS).await.unwrap();

    assert_eq!(count(&pool, "SELECT count(DISTINCT tenant_id) FROM payments").await, TENANTS.len() as i64);
    assert_eq!(count(&pool, "SELECT count(*) FROM payments WHERE status = 'dead_lettered'").await, dead);
    assert_eq!(count(&pool, "SELECT count(*) FROM payments WHERE status = 'succeeded'").await, settled);
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM dead_letters d JOIN payments p USING (tenant_id, payment_id) \
                      WHERE d.resolved_at IS NULL AND d.kind = 'unresolved' AND p.status = 'dead_lettered'"
        )
        .await,
        dead,
        "one open dead letter per dead-lettered payment"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM ledger_entries l JOIN payments p USING (tenant_id, payment_id) \
                      WHERE l.provider_charge_id = p.provider_charge_id AND p.status = 'succeeded'"
        )
        .await,
        settled,
        "one ledger entry per charged payment, for its charge"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM payments p WHERE event_count <> (SELECT count(*) FROM payment_events e \
                      WHERE (e.tenant_id, e.payment_id) = (p.tenant_id, p.payment_id)) \
                      OR status <> (SELECT to_status FROM payment_events e \
                      WHERE (e.tenant_id, e.payment_id, e.seq) = (p.tenant_id, p.payment_id, p.event_count))"
        )
        .await,
        0,
        "each payment's history is counted and ends in its status"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM idempotency_keys k JOIN payments p USING (tenant_id, payment_id) \
                      WHERE (k.response_status IS NOT NULL) = (p.status = 'succeeded')"
        )
        .await,
        i64::try_from(PAYMENTS).unwrap(),
        "one key per payment, with the stored response of a final one"
    );
    let webhooks = count(
        &pool,
        "SELECT count(*) FROM webhook_events w JOIN payments p USING (tenant_id, payment_id) \
         WHERE p.status = 'succeeded' AND w.provider_charge_id = p.provider_charge_id \
         AND w.received_at > p.updated_at AND w.received_at > now() - interval '7 days'",
    )
    .await;
    assert!(
        webhooks > 0 && webhooks == count(&pool, "SELECT count(*) FROM webhook_events").await,
        "the last days' charges have their webhook, within the reaper's retention"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM operator_audit a JOIN dead_letters d USING (tenant_id, payment_id) \
                      WHERE a.action = 'payment.read' AND a.at > d.created_at"
        )
        .await,
        dead,
        "an operator has looked at each dead letter once"
    );
    let dead_key = console::key(DEAD_LETTERED_EVERY * 7);
    let status: String = sqlx::query_scalar(
        "SELECT p.status::text FROM idempotency_keys k JOIN payments p USING (tenant_id, payment_id) \
         WHERE k.idempotency_key = $1",
    )
    .bind(&dead_key)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(status, "dead_lettered", "the keys are named as the benchmark searches for them");
}
