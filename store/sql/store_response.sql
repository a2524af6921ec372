-- Stores terminal payments' responses on their idempotency keys, in the transaction that made them
-- terminal, so that a replay is a single primary-key read. The payments are one tenant's; the i-th
-- element of every array belongs to the i-th payment.
--
-- The key's retention restarts now: a payment settled days after it was accepted (by an operator,
-- say) keeps its key for the full retention from here, so a client retrying with the same key finds
-- it instead of creating a second payment.
--
-- $1 tenant id, $2 payment ids, $3 the response bodies (the payment resources).
UPDATE idempotency_keys k
SET response_status = 200, response_body = r.body,
    expires_at = GREATEST(k.expires_at, now() + (k.expires_at - k.created_at))
FROM unnest($2::uuid[], $3::jsonb[]) AS r(payment_id, body)
WHERE k.tenant_id = $1 AND k.payment_id = r.payment_id
