-- The accept statement: one idempotency key, its payment, the payment's outbox row and its first
-- audit row, atomically in a single statement, and, when $13 is true, the wake-up for the workers.
--
-- The wake-up is optional because a NOTIFY serialises commits: PostgreSQL holds a cluster-wide lock
-- from just before a notifying transaction commits until its commit record is flushed, so accepts
-- that notify cannot share a WAL flush (group commit) and each waits for its own fsync. The api
-- passes false and sends one coalesced NOTIFY for many accepts after they commit (BENCHMARKS.md).
--
-- If the key already exists, nothing is written and no row is returned. If another transaction is
-- inserting the same key right now, this waits for it (up to the connection's lock_timeout) and then
-- returns no row once it commits. Foreign keys are checked at the end of the statement, after every
-- CTE has run, so the insertion order inside it does not matter.
--
-- $1 tenant_id, $2 idempotency key, $3 fingerprint, $4 payment_id, $5 key retention in seconds,
-- $6 amount, $7 currency, $8 customer_id, $9 description, $10 metadata, $11 traceparent, $12 tracestate,
-- $13 whether to notify the workers at commit.
WITH new_key AS (
    INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
    VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING tenant_id, payment_id, expires_at
), payment AS (
    INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, description, metadata)
    SELECT tenant_id, payment_id, $6, $7, $8, $9, $10 FROM new_key
    RETURNING tenant_id, payment_id, created_at, updated_at
), outbox_row AS (
    INSERT INTO outbox (tenant_id, payment_id, traceparent, tracestate)
    SELECT tenant_id, payment_id, $11, $12 FROM payment
), audit AS (
    INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason)
    SELECT tenant_id, payment_id, NULL, 'pending', 'api', 'accepted' FROM payment
)
SELECT p.created_at, p.updated_at, k.expires_at,
       CASE WHEN $13 THEN pg_notify('oncepay_outbox', '') END AS notified
FROM payment p JOIN new_key k USING (tenant_id, payment_id)
