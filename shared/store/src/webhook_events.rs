//! The provider's signed webhooks, as the reconciler received them: the charges they reported
//! outlive the provider's memory of a payment's key, so lookups and operators' resends read them.

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_provider::Charge;
use sqlx::PgConnection;
use sqlx::types::Json;

use crate::StoreError;

/// The charges signed webhooks reported for a payment, oldest first: evidence that outlives the
/// provider's memory of the payment's key.
pub async fn recorded_charges(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Vec<Charge>, StoreError> {
    let rows = sqlx::query_scalar!(
        r#"
        SELECT charge AS "charge!: Json<Charge>" FROM webhook_events
        WHERE tenant_id = $1 AND payment_id = $2 AND charge IS NOT NULL
        ORDER BY received_at, webhook_id
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|Json(charge)| charge).collect())
}
