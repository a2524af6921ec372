//! Reading payments. The one place that maps a `payments` row to [`Payment`].

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
    let payment = sqlx::query_as!(
        Payment,
        r#"
        SELECT tenant_id AS "tenant_id: TenantId",
               payment_id AS "payment_id: PaymentId",
               status AS "status: PaymentStatus",
               amount AS "amount: Amount",
               currency AS "currency: Currency",
               customer_id,
               description,
               metadata AS "metadata: Json<BTreeMap<String, String>>",
               provider_charge_id,
               failure_code,
               failure_message,
               send_attempts,
               first_sent_at,
               created_at,
               updated_at
        FROM payments
        WHERE tenant_id = $1 AND payment_id = $2
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(payment)
}
