//! The sweeper against a real PostgreSQL: an expired lease inside the provider's key window is
//! released for a resend with the same key; past the window the payment becomes `unknown` and is
//! queued for the poller; a live lease is left alone.

use std::time::Duration;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_provider::KeyWindow;
use oncepay_reconciler::sweeper::{Counts, Sweeper, SweeperConfig};
use oncepay_store::fixtures::tenant;
use oncepay_store::leases::SweepCounts;
use oncepay_store::transitions;
use sqlx::PgPool;

use crate::support::{accept, change, count_for, status};

/// A payment claimed by `worker-1`, first sent `sent_secs_ago`, whose lease ends `lease_left_secs`
/// from now (negative: expired).
async fn leased(pool: &PgPool, tenant_id: TenantId, key: &str, sent_secs_ago: i64, lease_left_secs: i64) -> PaymentId {
    let payment_id = accept(pool, tenant_id, key, 100).await;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query!(
        "UPDATE payments SET send_attempts = 1, first_sent_at = now() - make_interval(secs => $2)
         WHERE payment_id = $1",
        payment_id.as_uuid(),
        sent_secs_ago as f64
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query!(
        "UPDATE outbox SET locked_by = 'worker-1', locked_until = now() + make_interval(secs => $2),
                fencing_token = nextval('outbox_fencing_token_seq'), attempts = 1
         WHERE payment_id = $1",
        payment_id.as_uuid(),
        lease_left_secs as f64
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    transitions::apply(&mut tx, &change(tenant_id, payment_id, PaymentStatus::Pending, Transition::Claim))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    payment_id
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn expired_leases_are_taken_back_by_the_key_window_and_live_ones_are_left_alone(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let in_window = leased(&pool, tenant_id, "in-window", 60, -5).await;
    let past_window = leased(&pool, tenant_id, "past-window", 90_000, -5).await;
    let alive = leased(&pool, tenant_id, "alive", 60, 300).await;
    let config = SweeperConfig {
        interval: Duration::from_secs(1),
        batch_size: 10,
        key_window: KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3600) },
    };
    let sweeper = Sweeper::new(pool.clone(), config);

    let first = sweeper.run_once().await.unwrap();
    let second = sweeper.run_once().await.unwrap();

    assert_eq!(
        first,
        Counts { payments: SweepCounts { released: 1, uncertain: 1, ..SweepCounts::default() }, ..Counts::default() }
    );
    assert_eq!(second, Counts::default());
    assert_eq!(status(&pool, tenant_id, in_window).await, PaymentStatus::Pending);
    assert_eq!(count_for(&pool, "outbox", in_window).await, 1);
    assert_eq!(status(&pool, tenant_id, past_window).await, PaymentStatus::Unknown);
    assert_eq!(count_for(&pool, "outbox", past_window).await, 0);
    assert_eq!(count_for(&pool, "unknown_payments", past_window).await, 1);
    assert_eq!(status(&pool, tenant_id, alive).await, PaymentStatus::Processing);
}
