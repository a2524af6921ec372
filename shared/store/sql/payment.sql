-- Payments of one tenant, by primary key: one, or every payment a batch of long polls re-reads.
-- The quoted aliases tell sqlx's query macros the Rust types of the columns.
--
-- $1 tenant_id, $2 payment ids.
SELECT tenant_id AS "tenant_id: TenantId",
       payment_id AS "payment_id: PaymentId",
       status AS "status: PaymentStatus",
       amount AS "amount: Amount",
       currency AS "currency: Currency",
       customer_id,
       description,
       metadata AS "metadata: Json<BTreeMap<String, String>>",
       payment_method AS "payment_method: PaymentMethod",
       provider_customer AS "provider_customer: ProviderCustomer",
       provider_account AS "provider_account: ProviderAccount",
       provider_charge_id,
       failure_code,
       failure_message,
       send_attempts,
       first_sent_at,
       refunded,
       created_at,
       updated_at,
       event_count
FROM payments
WHERE tenant_id = $1 AND payment_id = ANY($2)
