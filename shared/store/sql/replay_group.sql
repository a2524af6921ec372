-- The replay read for several keys of one tenant at once: one primary-key lookup each, in one
-- statement (`oncepay_store::intake::stored_many`). Requests that would wait for their tenant's write
-- under way read their keys together this way, instead of one statement each (`sql/replay.sql`).
-- A key not stored has no row.
--
-- $1 tenant_id, $2 idempotency keys.
SELECT idempotency_key AS "idempotency_key!", fingerprint AS "fingerprint!", payment_id AS "payment_id!: PaymentId",
       expires_at AS "expires_at!", response_status, response_body AS "response_body: Json<Box<RawValue>>"
FROM idempotency_keys
WHERE tenant_id = $1 AND idempotency_key = ANY ($2)
