//! The worker's statements on the outbox besides the claim (`oncepay_store::claims`): the scan for
//! the tenants that have due rows (`sql/due_tenants.sql`), and the fenced take and release that end a
//! send (`sql/take.sql`, for one send or many at once; `sql/release.sql`).
//!
//! A result counts only while the claim's fencing token is still on the row: [`take`] and [`release`]
//! change nothing once it is gone. This module never calls the provider and never decides an outcome.

use std::collections::HashSet;
use std::time::Duration;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_store::StoreError;
use oncepay_store::claims::Claimed;
use sqlx::PgConnection;
use sqlx::types::Uuid;

/// The tenants with due rows that no one holds (`sql/due_tenants.sql`).
pub async fn due_tenants(conn: &mut PgConnection) -> Result<Vec<TenantId>, StoreError> {
    Ok(sqlx::query_file_scalar!("sql/due_tenants.sql").fetch_all(conn).await?)
}

/// Ends the send: deletes the row if `claimed`'s token is still on it. `false`: the lease was taken
/// over, and nothing may be recorded.
pub async fn take(conn: &mut PgConnection, claimed: &Claimed) -> Result<bool, StoreError> {
    Ok(!take_all(conn, &[claimed]).await?.is_empty())
}

/// Ends many sends at once: deletes each row whose claim's token is still on it, and returns the
/// payments whose rows it deleted. Any payment not returned lost its lease: nothing may be recorded
/// for it. One statement per tenant among them, so that each names its shard under Citus
/// (SCALING.md).
pub async fn take_all(conn: &mut PgConnection, claimed: &[&Claimed]) -> Result<HashSet<PaymentId>, StoreError> {
    let mut tenants: Vec<TenantId> = claimed.iter().map(|c| c.tenant_id).collect();
    tenants.sort_unstable();
    tenants.dedup();
    let mut taken = HashSet::with_capacity(claimed.len());
    for tenant_id in tenants {
        let ours = claimed.iter().filter(|c| c.tenant_id == tenant_id);
        let payment_ids: Vec<Uuid> = ours.clone().map(|c| c.payment_id.as_uuid()).collect();
        let tokens: Vec<i64> = ours.map(|c| c.fencing_token).collect();
        let rows = sqlx::query_file_scalar!("sql/take.sql", tenant_id.as_uuid(), &payment_ids, &tokens)
            .fetch_all(&mut *conn)
            .await?;
        taken.extend(rows.into_iter().map(PaymentId::from_uuid));
    }
    Ok(taken)
}

/// Frees the row for a retry after `delay` if `claimed`'s token is still on it. `false`: the lease
/// was taken over, and nothing may be recorded.
pub async fn release(conn: &mut PgConnection, claimed: &Claimed, delay: Duration) -> Result<bool, StoreError> {
    let released = sqlx::query_file!(
        "sql/release.sql",
        claimed.tenant_id.as_uuid(),
        claimed.payment_id.as_uuid(),
        claimed.fencing_token,
        delay.as_secs_f64()
    )
    .execute(conn)
    .await?;
    Ok(released.rows_affected() == 1)
}

/// Deletes the row of a payment that no longer needs sending, whatever its lease. Only for a caller
/// that already holds the row (it took or released it in the same transaction).
pub async fn discard(conn: &mut PgConnection, claimed: &Claimed) -> Result<(), StoreError> {
    sqlx::query!(
        "DELETE FROM outbox WHERE tenant_id = $1 AND payment_id = $2",
        claimed.tenant_id.as_uuid(),
        claimed.payment_id.as_uuid()
    )
    .execute(conn)
    .await?;
    Ok(())
}
