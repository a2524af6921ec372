-- Stores a terminal payment's response on its idempotency key, in the transaction that made it
-- terminal, so that a replay is a single primary-key read.
--
-- $1 tenant_id, $2 payment_id, $3 the response body (the payment resource).
UPDATE idempotency_keys SET response_status = 200, response_body = $3
WHERE tenant_id = $1 AND payment_id = $2
