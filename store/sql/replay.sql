-- The replay read: one primary-key lookup of (tenant, idempotency key). Once the payment is terminal
-- the stored response is all a replay needs.
--
-- $1 tenant_id, $2 idempotency key.
SELECT fingerprint, payment_id, expires_at, response_status, response_body
FROM idempotency_keys
WHERE tenant_id = $1 AND idempotency_key = $2
