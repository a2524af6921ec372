-- Stores terminal payments' responses on their idempotency keys, in the transaction that made them
-- terminal, so that a replay is a single primary-key read. The payments are one tenant's; the i-th
-- element of every array belongs to the i-th payment.
--
-- The key's retention restarts now: a payment settled days after it was accepted (by an operator,
-- say) keeps its key for the full retention from here, so a client retrying with the same key finds
-- it instead of creating a second payment. The new expiry is computed in a SELECT, not in the
-- UPDATE's SET: Citus refuses STABLE functions over a row's columns in an UPDATE, and adding an
-- interval to a timestamptz is STABLE.
--
-- $1 tenant id, $2 payment ids, $3 the response bodies (the payment resources).
WITH extended AS (
    SELECT k.idempotency_key, r.body,
           GREATEST(k.expires_at, now() + (k.expires_at - k.created_at)) AS expires_at
    FROM idempotency_keys k
    JOIN unnest($2::uuid[], $3::jsonb[]) AS r(payment_id, body) ON r.payment_id = k.payment_id
    WHERE k.tenant_id = $1
)
UPDATE idempotency_keys k
SET response_status = 200, response_body = e.body, expires_at = e.expires_at
FROM extended e
WHERE k.tenant_id = $1 AND k.idempotency_key = e.idempotency_key
