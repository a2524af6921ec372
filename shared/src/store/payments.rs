//! Reading payments. The one place that maps a `payments` row to [`Payment`] (`sql/payment.sql`, a
//! file so the benchmark can run the same read under pgbench).

use std::collections::BTreeMap;

use sqlx::PgConnection;
use sqlx::types::Json;

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
    let payment = sqlx::query_file_as!(Payment, "sql/payment.sql", tenant_id.as_uuid(), payment_id.as_uuid(),)
        .fetch_optional(conn)
        .await?;
    Ok(payment)
}
