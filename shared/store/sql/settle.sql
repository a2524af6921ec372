-- Terminal status changes for one or more payments of one tenant, the i-th element of every array
-- describing the i-th change: the compare-and-set on each payment, its audit row and, for a success,
-- its ledger entry, in one call (`settle_payments`, migrations/0150). Returns every payment that
-- moved, as it now is (its stored response is written from that row by `store_response.sql`). A
-- payment that was no longer in its expected status is missing from the result: another actor moved
-- it first, and nothing was written for it. Every statement of the function names the tenant, so
-- under Citus the call stays on that tenant's shard (SCALING.md).
--
-- Waking long polls is the caller's business: the reconciler and operators `NOTIFY` in the same
-- transaction, the worker announces its payments after commit (a NOTIFY serialises commits, see
-- accept.sql).
--
-- $1 tenant id, $2 payment ids, $3 new statuses, $4 expected statuses, $5 provider charge ids,
-- $6 failure codes, $7 failure messages, $8 actors, $9 reasons, $10 audit details,
-- $11 ledger amounts, $12 ledger currencies, $13 when the provider charged.
-- The quoted aliases tell sqlx's query macros the Rust types, as in payment.sql.
SELECT tenant_id AS "tenant_id!: TenantId",
       payment_id AS "payment_id!: PaymentId",
       status AS "status!: PaymentStatus",
       amount AS "amount!: Amount",
       currency AS "currency!: Currency",
       customer_id AS "customer_id!",
       description,
       metadata AS "metadata!: Json<BTreeMap<String, String>>",
       payment_method AS "payment_method: PaymentMethod",
       provider_customer AS "provider_customer: ProviderCustomer",
       provider_account AS "provider_account: ProviderAccount",
       provider_charge_id,
       failure_code,
       failure_message,
       send_attempts AS "send_attempts!",
       first_sent_at,
       refunded AS "refunded!",
       created_at AS "created_at!",
       updated_at AS "updated_at!",
       event_count AS "event_count!"
-- Every argument is cast: the benchmark's pgbench script passes text arrays.
FROM settle_payments($1::uuid, $2::uuid[], $3::text[]::payment_status[], $4::text[]::payment_status[],
                     $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::jsonb[], $11::bigint[],
                     $12::text[], $13::timestamptz[])
