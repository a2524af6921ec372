-- The worker's claim: takes up to $1 due outbox rows that no one holds, leases them to this worker
-- under fresh fencing tokens, moves their payments pending → processing (counting the attempt and
-- remembering the first send) and writes an audit row each, all in one statement.
--
-- Claims are fair across tenants: each tenant's due rows are numbered oldest first, and a claim
-- takes every tenant's first before any tenant's second, so one tenant's backlog cannot delay the
-- others' payments; within a tenant, the oldest goes first. The candidates are read without locks
-- (a window function cannot lock), then locked with SKIP LOCKED, which lets any number of workers
-- claim at once without waiting on each other or ever taking the same row; a row another worker
-- took meanwhile is skipped and the next candidate taken instead (each tenant offers four claims'
-- worth, so workers claiming at once from one tenant's backlog do not come away empty). Only rows whose payment is
-- `pending` are taken (the UPDATE repeats the guard, so a payment that moved after the snapshot is
-- left out and its row stays unleased). Rows are locked before their payments, as everywhere else
-- the outbox is written.
--
-- $1 batch size, $2 worker id (locked_by), $3 lease in seconds, $4 actor (`worker:<id>`),
-- $5 resend horizon in seconds (the provider's key window minus the safety margin).
WITH candidates AS (
    SELECT c.tenant_id, c.payment_id, c.turn, c.available_at
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT o.tenant_id, o.payment_id, o.available_at,
               row_number() OVER (ORDER BY o.available_at) AS turn
        FROM outbox o
        JOIN payments p USING (tenant_id, payment_id)
        WHERE o.tenant_id = t.tenant_id AND o.locked_until IS NULL AND o.available_at <= now()
          AND p.status = 'pending'
        ORDER BY o.available_at
        -- More than one claim needs: workers claiming at once skip each other's locked rows.
        LIMIT $1::bigint * 4
    ) c
), due AS (
    SELECT o.tenant_id, o.payment_id
    FROM outbox o
    JOIN candidates c USING (tenant_id, payment_id)
    WHERE o.locked_until IS NULL AND o.available_at <= now()
    ORDER BY c.turn, c.available_at
    LIMIT $1
    FOR UPDATE OF o SKIP LOCKED
), claimed AS (
    UPDATE payments p
    SET status = 'processing',
        send_attempts = p.send_attempts + 1,
        first_sent_at = COALESCE(p.first_sent_at, now()),
        updated_at = now()
    FROM due
    WHERE p.tenant_id = due.tenant_id AND p.payment_id = due.payment_id AND p.status = 'pending'
    RETURNING p.tenant_id, p.payment_id, p.amount, p.currency, p.customer_id, p.metadata,
              p.payment_method, p.send_attempts, p.first_sent_at, p.may_be_charged, p.created_at
), leased AS (
    UPDATE outbox o
    SET locked_by = $2,
        locked_until = now() + make_interval(secs => $3),
        fencing_token = nextval('outbox_fencing_token_seq'),
        attempts = o.attempts + 1
    FROM claimed c
    WHERE o.tenant_id = c.tenant_id AND o.payment_id = c.payment_id
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
