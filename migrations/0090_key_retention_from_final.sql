-- A key's retention now restarts when its payment becomes final (`shared/sql/store_response.sql`), so
-- that a payment settled late keeps its key long enough for a client's retry to find it. Keys of
-- payments that became final before this migration get the same treatment, measured from the
-- payment's last change.
UPDATE idempotency_keys k
SET expires_at = p.updated_at + (k.expires_at - k.created_at)
FROM payments p
WHERE p.tenant_id = k.tenant_id AND p.payment_id = k.payment_id
  AND p.status IN ('succeeded', 'failed')
  AND k.expires_at < p.updated_at + (k.expires_at - k.created_at);
