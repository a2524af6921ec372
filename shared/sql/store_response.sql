-- Stores terminal payments' responses on their idempotency keys, in the transaction that made them
-- terminal, so that a replay is a single primary-key read. The i-th element of every array belongs
-- to the i-th payment.
--
-- $1 tenant ids, $2 payment ids, $3 the response bodies (the payment resources).
UPDATE idempotency_keys k SET response_status = 200, response_body = r.body
FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) AS r(tenant_id, payment_id, body)
WHERE k.tenant_id = r.tenant_id AND k.payment_id = r.payment_id
