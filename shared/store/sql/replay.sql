-- The replay read: one primary-key lookup of (tenant, idempotency key). Once the payment is terminal
-- the stored response is all a replay needs.
--
-- Also `oncepay_store::intake::stored`: a request that would wait for its tenant's write under way
-- looks up its key meanwhile.
--
-- $1 tenant_id, $2 idempotency key.
SELECT fingerprint, payment_id AS "payment_id: PaymentId", expires_at, response_status,
       response_body AS "response_body: Json<Box<RawValue>>"
FROM idempotency_keys
WHERE tenant_id = $1 AND idempotency_key = $2
