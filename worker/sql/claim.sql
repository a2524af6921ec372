-- The worker's claim from one tenant: takes up to $1 of the tenant's due outbox rows that no one
-- holds, oldest first, leases them to this worker under fresh fencing tokens, moves their payments
-- pending → processing (counting the attempt and remembering the first send) and writes an audit
-- row each, all in one statement.
--
-- A claim's fencing token is 2^62 plus the payment's claim count (`send_attempts`, which every
-- claim raises under the payment's row lock), so it grows with every claim of the payment. A fence
-- only compares a token with the current one of its own payment, so a count per payment is all it
-- needs, and it needs no sequence shared by every payment (under Citus, a tenant's UPDATE cannot
-- draw one). The 2^62 keeps it from ever equalling a token that shared sequence gave before, which a
-- worker of the version before may still hold during an upgrade: the sequence would need 2^62
-- claims to get there.
--
-- It names one tenant, so under Citus it runs on that tenant's shard alone (SCALING.md); the worker
-- takes turns over the tenants with due rows (`worker/src/rotation.rs`), so one tenant's backlog
-- cannot delay the others' payments. SKIP LOCKED lets any number of workers claim at once without
-- waiting on each other or ever taking the same row. Only rows whose payment is `pending` are taken
-- (the UPDATE repeats the guard, so a payment that moved after the snapshot is left out and its row
-- stays unleased). Rows are locked before their payments, as everywhere else the outbox is written.
--
-- $1 batch size, $2 worker id (locked_by), $3 lease in seconds, $4 actor (`worker:<id>`),
-- $5 resend horizon in seconds (the provider's key window minus the safety margin), $6 tenant id.
WITH due AS (
    SELECT o.tenant_id, o.payment_id
    FROM outbox o
    JOIN payments p USING (tenant_id, payment_id)
    WHERE o.tenant_id = $6 AND o.locked_until IS NULL AND o.available_at <= now() AND p.status = 'pending'
    ORDER BY o.available_at
    LIMIT $1
    FOR UPDATE OF o SKIP LOCKED
), claimed AS (
    UPDATE payments p
    SET status = 'processing',
        send_attempts = p.send_attempts + 1,
        -- The first send's time, kept: LEAST ignores a NULL (Citus refuses now() in a COALESCE).
        first_sent_at = LEAST(p.first_sent_at, now()),
        updated_at = now()
    FROM due
    WHERE p.tenant_id = $6 AND p.payment_id = due.payment_id AND p.status = 'pending'
    RETURNING p.tenant_id, p.payment_id, p.amount, p.currency, p.customer_id, p.metadata,
              p.payment_method, p.send_attempts, p.first_sent_at, p.may_be_charged, p.created_at
), leased AS (
    UPDATE outbox o
    SET locked_by = $2,
        locked_until = now() + make_interval(secs => $3),
        fencing_token = 4611686018427387904 + c.send_attempts,
        attempts = o.attempts + 1
    FROM claimed c
    WHERE o.tenant_id = $6 AND o.payment_id = c.payment_id
    RETURNING o.tenant_id, o.payment_id, o.fencing_token, o.locked_until, o.attempts, o.traceparent,
              o.tracestate
), audit AS (
    INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason, detail)
    SELECT c.tenant_id, c.payment_id, 'pending', 'processing', $4, 'claimed for sending to the provider',
           jsonb_build_object('attempt', l.attempts, 'send_attempts', c.send_attempts,
                              'fencing_token', l.fencing_token)
    FROM claimed c JOIN leased l USING (tenant_id, payment_id)
)
-- The quoted aliases tell sqlx's query macros the Rust types and that nothing here is NULL.
SELECT c.tenant_id AS "tenant_id: TenantId", c.payment_id AS "payment_id: PaymentId", c.amount AS "amount: Amount", c.currency AS "currency: Currency",
       c.customer_id, c.metadata AS "metadata: Json<BTreeMap<String, String>>",
       c.payment_method AS "payment_method: PaymentMethod", c.send_attempts,
       c.created_at AS accepted_at, c.may_be_charged,
       l.fencing_token AS "fencing_token!", l.locked_until AS "locked_until!", l.attempts,
       l.traceparent, l.tracestate,
       now() - c.first_sent_at < make_interval(secs => $5) AS "in_key_window!"
FROM claimed c JOIN leased l USING (tenant_id, payment_id)
