//! Reading payments: the row ([`Payment`]), the one statement that reads it (`sql/payment.sql`, a
//! file so the benchmark runs the same read under pgbench), and the one rendering of a row as the
//! resource clients see.

use std::collections::BTreeMap;

use sqlx::PgConnection;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::payment::{Failure, PaymentResource};
use oncepay_domain::provider_ref::{PaymentMethod, ProviderAccount, ProviderCustomer};
use oncepay_domain::status::PaymentStatus;

use crate::StoreError;

/// A row of `payments`.
#[derive(Debug, Clone)]
pub struct Payment {
    /// The owner.
    pub tenant_id: TenantId,
    /// The payment's id.
    pub payment_id: PaymentId,
    /// Where it stands.
    pub status: PaymentStatus,
    /// What to charge, in minor units.
    pub amount: Amount,
    /// In which currency.
    pub currency: Currency,
    /// The merchant's customer reference.
    pub customer_id: String,
    /// The merchant's free text.
    pub description: Option<String>,
    /// The merchant's key/value pairs.
    pub metadata: Json<BTreeMap<String, String>>,
    /// What the provider is to charge, if the merchant named it.
    pub payment_method: Option<PaymentMethod>,
    /// The provider's customer that method belongs to, if the merchant named one.
    pub provider_customer: Option<ProviderCustomer>,
    /// The provider account it is charged to (a Stripe connected account), fixed when it was
    /// accepted; `None` is the account of oncepay's own credentials.
    pub provider_account: Option<ProviderAccount>,
    /// The provider's charge, once known.
    pub provider_charge_id: Option<String>,
    /// Why it failed, when `status` is `failed`.
    pub failure_code: Option<String>,
    /// A readable explanation of `failure_code`.
    pub failure_message: Option<String>,
    /// How many times a worker claimed it for sending.
    pub send_attempts: i32,
    /// When a worker first claimed it for sending.
    pub first_sent_at: Option<OffsetDateTime>,
    /// Minor units given back so far: the sum of its succeeded refunds.
    pub refunded: i64,
    /// When the api accepted it.
    pub created_at: OffsetDateTime,
    /// When its status last changed.
    pub updated_at: OffsetDateTime,
    /// How many changes its history holds: the last change's place (`payment_events.seq`).
    pub event_count: i32,
}

impl From<&Payment> for PaymentResource {
    fn from(payment: &Payment) -> Self {
        let failure = match (&payment.failure_code, &payment.failure_message) {
            (Some(code), Some(message)) if payment.status == PaymentStatus::Failed => {
                Some(Failure { code: code.clone(), message: message.clone() })
            }
            _ => None,
        };
        Self {
            id: payment.payment_id,
            status: payment.status,
            amount: payment.amount,
            currency: payment.currency,
            customer_id: payment.customer_id.clone(),
            description: payment.description.clone(),
            metadata: payment.metadata.0.clone(),
            payment_method: payment.payment_method.as_ref().map(|method| method.as_str().to_owned()),
            provider_customer: payment.provider_customer.as_ref().map(|customer| customer.as_str().to_owned()),
            created_at: payment.created_at,
            updated_at: payment.updated_at,
            provider_charge_id: payment.provider_charge_id.clone(),
            amount_refunded: payment.refunded,
            failure,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use serde_json::json;
    use time::macros::datetime;
    use uuid::Uuid;

    use super::*;

    fn payment(status: PaymentStatus) -> Payment {
        Payment {
            tenant_id: TenantId::from_uuid(Uuid::nil()),
            payment_id: PaymentId::from_uuid(Uuid::from_u128(7)),
            status,
            amount: Amount::new(1999).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            customer_id: "cus_1".into(),
            description: None,
            metadata: Json(BTreeMap::from([("order".into(), "42".into())])),
            payment_method: None,
            provider_customer: None,
            provider_account: None,
            provider_charge_id: None,
            failure_code: None,
            failure_message: None,
            send_attempts: 0,
            first_sent_at: None,
            refunded: 0,
            created_at: datetime!(2026-11-22 04:23:00.5 UTC),
            updated_at: datetime!(2026-11-22 04:23:01 UTC),
            event_count: 1,
        }
    }

    #[test]
    fn a_pending_payment_renders_without_the_fields_it_does_not_have() {
        let rendered = serde_json::to_value(PaymentResource::from(&payment(PaymentStatus::Pending))).unwrap();

        assert_eq!(
            rendered,
            json!({
                "id": "00000000-0000-0000-0000-000000000007",
                "status": "pending",
                "amount": 1999,
                "currency": "EUR",
                "customer_id": "cus_1",
                "metadata": {"order": "42"},
                "created_at": "2026-11-22T04:23:00.5Z",
                "updated_at": "2026-11-22T04:23:01Z",
                "amount_refunded": 0,
            })
        );
    }

    #[test]
    fn a_failed_payment_explains_why() {
        let mut failed = payment(PaymentStatus::Failed);
        failed.failure_code = Some("card_declined".into());
        failed.failure_message = Some("The card was declined.".into());
        failed.provider_charge_id = Some("ch_1".into());

        let rendered = serde_json::to_value(PaymentResource::from(&failed)).unwrap();

        assert_eq!(rendered["failure"], json!({"code": "card_declined", "message": "The card was declined."}));
        assert_eq!(rendered["provider_charge_id"], "ch_1");
    }

    #[test]
    fn a_payment_method_is_shown_as_requested() {
        let mut with_method = payment(PaymentStatus::Pending);
        with_method.payment_method = Some(PaymentMethod::parse("pm_card_visa").unwrap());

        let rendered = serde_json::to_value(PaymentResource::from(&with_method)).unwrap();

        assert_eq!(rendered["payment_method"], "pm_card_visa");
    }
}
