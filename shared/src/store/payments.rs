//! Reading payments. The one place that maps a `payments` row to [`Payment`] (`sql/payment.sql`, a
//! file so the benchmark can run the same read under pgbench).

use std::collections::BTreeMap;

use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use crate::ids::{PaymentId, TenantId};
use crate::money::{Amount, Currency};
use crate::payment::Payment;
use crate::status::PaymentStatus;
use crate::store::StoreError;

/// The payment `payment_id` of `tenant_id`, if it exists. Another tenant's payment does not.
#[tracing::instrument(name = "store.fetch_payment", skip_all, fields(payment.id = %payment_id))]
pub async fn fetch(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Option<Payment>, StoreError> {
    Ok(read(conn, tenant_id, &[payment_id]).await?.pop())
}

/// Those of `payment_ids` that are payments of `tenant_id`, in no particular order.
#[tracing::instrument(name = "store.fetch_payments", skip_all, fields(payments = payment_ids.len()))]
pub async fn fetch_many(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_ids: &[PaymentId],
) -> Result<Vec<Payment>, StoreError> {
    read(conn, tenant_id, payment_ids).await
}

async fn read(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_ids: &[PaymentId],
) -> Result<Vec<Payment>, StoreError> {
    let ids: Vec<Uuid> = payment_ids.iter().map(PaymentId::as_uuid).collect();
    let payments = sqlx::query_file_as!(Payment, "sql/payment.sql", tenant_id.as_uuid(), &ids).fetch_all(conn).await?;
    Ok(payments)
}
