//! The reaper's deletion of refund keys, against a real PostgreSQL: expired keys of terminal
//! refunds go, in batches; a key's retention starts again when its refund becomes final; keys of
//! refunds still in flight stay however old they are.

use oncepay_domain::ids::{RefundId, TenantId};
use oncepay_domain::refund_status::{RefundStatus, RefundTransition};
use oncepay_reconciler::reaper::Counts;
use oncepay_store::fixtures::{count, tenant};
use oncepay_store::refunds::settling::{self, RefundChange, RefundSettlement};
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::support::{count_for_refund, reaper, refund, succeeded_payment, unknown_refund};

/// Makes the refund's key three days old with a day's retention, so expired two days ago.
async fn expire_key(pool: &PgPool, refund_id: RefundId) {
    sqlx::query!(
        "UPDATE refund_keys SET created_at = now() - interval '3 days', expires_at = now() - interval '2 days'
         WHERE refund_id = $1",
        refund_id.as_uuid()
    )
    .execute(pool)
    .await
    .unwrap();
}

/// An `unknown` refund settled by the test: succeeded as `re_<key>`, or failed.
async fn settled(pool: &PgPool, tenant_id: TenantId, key: &str, succeeded: bool) -> RefundId {
    let refund_id = unsettled(pool, tenant_id, key).await;
    settle(pool, tenant_id, refund_id, key, succeeded).await;
    refund_id
}

/// An `unknown` refund of a payment of its own.
async fn unsettled(pool: &PgPool, tenant_id: TenantId, key: &str) -> RefundId {
    let payment_id = succeeded_payment(pool, tenant_id, key, 100).await;
    unknown_refund(pool, tenant_id, payment_id, &format!("refund-{key}"), 100, 60).await
}

/// Settles the `unknown` refund `refund_id`: succeeded as `re_<key>`, or failed.
async fn settle(pool: &PgPool, tenant_id: TenantId, refund_id: RefundId, key: &str, succeeded: bool) {
    let (transition, settlement) = if succeeded {
        let refund = format!("re_{key}");
        (
            RefundTransition::Refunded,
            RefundSettlement::Succeeded { provider_refund_id: refund, refunded_at: OffsetDateTime::now_utc() },
        )
    } else {
        let failed =
            RefundSettlement::Failed { code: "refund_failed".into(), message: "No.".into(), provider_refund_id: None };
        (RefundTransition::Refused, failed)
    };
    let change = RefundChange {
        tenant_id,
        refund_id,
        from: RefundStatus::Unknown,
        transition,
        actor: "test",
        reason: "test setup",
        detail: None,
    };
    settling::settle(&mut pool.acquire().await.unwrap(), &change, &settlement).await.unwrap();
}

async fn has_key(pool: &PgPool, refund_id: RefundId) -> bool {
    count_for_refund(pool, "refund_keys", refund_id).await == 1
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn expired_keys_of_terminal_refunds_go_and_keys_of_refunds_in_flight_stay(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let succeeded = settled(&pool, tenant_id, "succeeded", true).await;
    let failed = settled(&pool, tenant_id, "failed", false).await;
    // Its key expired while the refund was unknown; settling it starts the retention again.
    let settled_just_now = unsettled(&pool, tenant_id, "just-now").await;
    expire_key(&pool, settled_just_now).await;
    settle(&pool, tenant_id, settled_just_now, "just-now", true).await;
    let not_yet_expired = settled(&pool, tenant_id, "retained", true).await;
    let payment_id = succeeded_payment(&pool, tenant_id, "in-flight", 1000).await;
    let unknown = unknown_refund(&pool, tenant_id, payment_id, "unknown", 100, 60).await;
    let dead = unknown_refund(&pool, tenant_id, payment_id, "dead", 100, 60).await;
    let change = RefundChange {
        tenant_id,
        refund_id: dead,
        from: RefundStatus::Unknown,
        transition: RefundTransition::Exhausted,
        actor: "test",
        reason: "attempts spent",
        detail: None,
    };
    settling::apply(&mut pool.acquire().await.unwrap(), &change, None, OffsetDateTime::now_utc()).await.unwrap();
    // Accepted last: the refunds above were claimed as their tenant's due refunds.
    let pending = refund(&pool, tenant_id, payment_id, "pending", 100).await;
    for refund_id in [succeeded, failed, pending, unknown, dead] {
        expire_key(&pool, refund_id).await;
    }

    let counts = reaper(&pool, 100).run_once().await.unwrap();

    assert_eq!(counts, Counts { refund_keys: 2, ..Counts::default() });
    assert!(!has_key(&pool, succeeded).await);
    assert!(!has_key(&pool, failed).await);
    for refund_id in [settled_just_now, not_yet_expired, pending, unknown, dead] {
        assert!(has_key(&pool, refund_id).await, "{refund_id}");
    }
    // The refund itself, its audit trail and its ledger entry are never reaped.
    assert_eq!(count_for_refund(&pool, "refunds", succeeded).await, 1);
    assert_eq!(count_for_refund(&pool, "refund_ledger_entries", succeeded).await, 1);
    assert!(count_for_refund(&pool, "refund_events", succeeded).await > 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn refund_keys_are_reaped_in_batches_of_the_configured_size(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    for i in 0..5 {
        let refund_id = settled(&pool, tenant_id, &format!("k{i}"), true).await;
        expire_key(&pool, refund_id).await;
    }
    let reaper = reaper(&pool, 2);

    let passes = [reaper.run_once().await.unwrap(), reaper.run_once().await.unwrap(), reaper.run_once().await.unwrap()];

    assert_eq!(passes.map(|c| c.refund_keys), [2, 2, 1]);
    assert_eq!(count(&pool, "refund_keys").await, 0);
    assert_eq!(count(&pool, "idempotency_keys").await, 5, "the payments' keys have not expired");
}
