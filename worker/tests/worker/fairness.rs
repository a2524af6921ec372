//! Claims are fair across tenants: each claim takes every tenant's oldest due payment before any
//! tenant's second, so one tenant's backlog does not delay the others' payments.

use oncepay_domain::ids::{PaymentId, TenantId};
use sqlx::PgPool;

use crate::support::{self, accept, config, drainer, tenant};

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_tenants_backlog_does_not_delay_another_tenants_payments(pool: PgPool) {
    let (busy, quiet, small) = (tenant(&pool).await, tenant(&pool).await, tenant(&pool).await);
    let mut backlog = Vec::new();
    for _ in 0..20 {
        backlog.push(accept(&pool, busy, 100).await.payment_id);
    }
    let quiet_ones = [accept(&pool, quiet, 100).await.payment_id, accept(&pool, quiet, 100).await.payment_id];
    let small_one = accept(&pool, small, 100).await.payment_id;

    let claimed: Vec<(TenantId, PaymentId)> = drainer(&pool, &support::refusing_url(), config("fair"))
        .claim(6)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.tenant_id, c.payment_id))
        .collect();

    // Each tenant's oldest first, then each tenant's second, then the busy tenant's third.
    let mut expected = vec![
        (busy, backlog[0]),
        (quiet, quiet_ones[0]),
        (small, small_one),
        (busy, backlog[1]),
        (quiet, quiet_ones[1]),
        (busy, backlog[2]),
    ];
    let mut claimed_sorted = claimed.clone();
    claimed_sorted.sort();
    expected.sort();
    assert_eq!(claimed_sorted, expected, "claimed {claimed:?}");
}
