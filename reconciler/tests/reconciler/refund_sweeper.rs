//! The sweeper's takeover of refund leases, against a real PostgreSQL: an expired lease inside the
//! provider's key window sends the refund again with the same key; past it the refund becomes
//! `unknown`, due for a lookup; a live lease is left alone.

use std::time::Duration;

use oncepay_domain::ids::{RefundId, TenantId};
use oncepay_domain::refund_status::RefundStatus;
use oncepay_reconciler::sweeper::{Counts, Sweeper, SweeperConfig};
use oncepay_store::fixtures::tenant;
use oncepay_store::leases::SweepCounts;
use sqlx::PgPool;

use crate::support::{REFUND_KEY_WINDOW, claim_refunds, count_for_refund, refund, refund_status, succeeded_payment};

/// A refund of 100 that `worker-1` claimed, first sent `sent_secs_ago`, whose lease ends
/// `lease_left_secs` from now (negative: expired).
async fn leased(pool: &PgPool, tenant_id: TenantId, key: &str, sent_secs_ago: i64, lease_left_secs: i64) -> RefundId {
    let payment_id = succeeded_payment(pool, tenant_id, key, 100).await;
    let refund_id = refund(pool, tenant_id, payment_id, &format!("refund-{key}"), 100).await;
    claim_refunds(pool, tenant_id, sent_secs_ago).await;
    sqlx::query!(
        "UPDATE refund_outbox SET locked_until = now() + make_interval(secs => $2) WHERE refund_id = $1",
        refund_id.as_uuid(),
        lease_left_secs as f64
    )
    .execute(pool)
    .await
    .unwrap();
    refund_id
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn expired_refund_leases_are_taken_back_by_the_key_window_and_live_ones_are_left_alone(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let in_window = leased(&pool, tenant_id, "in-window", 60, -5).await;
    let past_window = leased(&pool, tenant_id, "past-window", 90_000, -5).await;
    let alive = leased(&pool, tenant_id, "alive", 60, 300).await;
    let config = SweeperConfig { interval: Duration::from_secs(1), batch_size: 10, key_window: REFUND_KEY_WINDOW };
    let sweeper = Sweeper::new(pool.clone(), config);

    let first = sweeper.run_once().await.unwrap();
    let second = sweeper.run_once().await.unwrap();

    assert_eq!(
        first,
        Counts { refunds: SweepCounts { released: 1, uncertain: 1, ..SweepCounts::default() }, ..Counts::default() }
    );
    assert_eq!(second, Counts::default());
    assert_eq!(refund_status(&pool, in_window).await, RefundStatus::Pending);
    let unleased: Option<bool> =
        sqlx::query_scalar!("SELECT locked_until IS NULL FROM refund_outbox WHERE refund_id = $1", in_window.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(unleased, Some(true), "queued for a worker, unleased");
    assert_eq!(refund_status(&pool, past_window).await, RefundStatus::Unknown);
    assert_eq!(count_for_refund(&pool, "refund_outbox", past_window).await, 0);
    let due: Option<bool> =
        sqlx::query_scalar!("SELECT next_lookup_at <= now() FROM refunds WHERE refund_id = $1", past_window.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(due, Some(true), "due for the poller's first lookup");
    assert_eq!(refund_status(&pool, alive).await, RefundStatus::Processing);
    let actors: Vec<String> = sqlx::query_scalar!(
        "SELECT actor FROM refund_events WHERE refund_id = ANY($1) AND to_status IN ('pending', 'unknown') AND seq > 1",
        &[in_window.as_uuid(), past_window.as_uuid()]
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(actors, ["sweeper", "sweeper"]);
}
