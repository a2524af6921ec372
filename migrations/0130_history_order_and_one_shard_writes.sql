-- Two changes, so that every write of the worker's hot path stays on its tenant's shard under Citus,
-- and a payment's history stays in order there (SCALING.md).
--
-- 1. A payment's history is ordered by its own count, not by `payment_events.event_id`.
--
--    `event_id` is an identity. Under Citus each node draws its own range (a worker node's values
--    start near 2^49, the coordinator's at 1), so after a tenant moves between nodes its new events
--    can sort before its old ones. Now the payment counts its audit rows (`payments.event_count`), and
--    every audit row records its place in the payment's history (`payment_events.seq`, from 1). A
--    status change raises the count in the same UPDATE that moves the payment, under the payment's
--    row lock, and the audit row takes the new count: one writer at a time per payment, so the places
--    are 1, 2, 3… with no gaps, on any node.
--
--    Both default to 1: the audit row written when the payment is created (by `intake`) is the
--    first. Every later row must name its place; one that does not collides with the first on the
--    primary key, which is now (tenant, payment, place). `event_id` goes: nothing reads it any more,
--    and under Citus its identity default made every INSERT … SELECT into the table run through the
--    coordinator (the identity is drawn there), which Citus commits with two-phase commit.
--
-- 2. The claim and the settlement become functions whose statements each name the tenant.
--
--    Citus never plans a statement with INSERT CTEs on one shard: it runs each CTE on its own and
--    ships the results between nodes, and the transaction then commits with two-phase commit. The
--    claim (`worker/sql/claim.sql`) wrote its audit rows in an INSERT CTE, the settlement
--    (`store/sql/settle.sql`) its audit rows and ledger entries. Here each is a function: one
--    statement of SELECT and UPDATE CTEs moves the rows and collects them in an array, then a
--    function of its own writes the new rows (`write_claim_rows`, `write_settlement_rows`). On plain
--    PostgreSQL those write from the arrays. Under Citus an INSERT from arrays alone is built on the
--    coordinator and copied to the shard, with two-phase commit, so `store/sql/citus.sql` replaces
--    them with versions that read the moved payments back, which Citus runs whole on the tenant's
--    shard (tried on Citus 13.2). Reading back costs about 0.1 ms a call on one PostgreSQL
--    (BENCHMARKS.md), which is why plain PostgreSQL keeps the arrays. On plain PostgreSQL a call is
--    still one round trip.

ALTER TABLE payments ADD COLUMN event_count integer NOT NULL DEFAULT 1;
ALTER TABLE payment_events ADD COLUMN seq integer NOT NULL DEFAULT 1;

-- Until now `event_id` ordered each payment's history (one PostgreSQL draws it from one sequence).
UPDATE payment_events e
SET seq = n.seq
FROM (SELECT tenant_id, payment_id, event_id,
             row_number() OVER (PARTITION BY tenant_id, payment_id ORDER BY event_id)::integer AS seq
      FROM payment_events) n
WHERE e.tenant_id = n.tenant_id AND e.payment_id = n.payment_id AND e.event_id = n.event_id AND n.seq <> 1;

UPDATE payments p
SET event_count = n.events
FROM (SELECT tenant_id, payment_id, count(*)::integer AS events FROM payment_events GROUP BY tenant_id, payment_id) n
WHERE p.tenant_id = n.tenant_id AND p.payment_id = n.payment_id AND n.events <> 1;

ALTER TABLE payment_events DROP CONSTRAINT payment_events_pkey;
ALTER TABLE payment_events ADD PRIMARY KEY (tenant_id, payment_id, seq);
ALTER TABLE payment_events DROP COLUMN event_id;

-- One claimed send, as `claim_sends` returns it: the payment, its new lease, and the place of the
-- claim's audit row in the payment's history.
CREATE TYPE claimed_send AS (
    tenant_id      uuid,
    payment_id     uuid,
    amount         bigint,
    currency       text,
    customer_id    text,
    metadata       jsonb,
    payment_method text,
    send_attempts  integer,
    first_sent_at  timestamptz,
    accepted_at    timestamptz,
    may_be_charged boolean,
    fencing_token  bigint,
    locked_until   timestamptz,
    attempts       integer,
    traceparent    text,
    tracestate     text,
    event_seq      integer
);

-- The audit rows of a claim: one per claimed send, from `claimed`. `ids` are the claimed payments'
-- ids, for the Citus version in `store/sql/citus.sql`, which reads the payments back instead.
CREATE FUNCTION write_claim_rows(p_tenant_id uuid, p_actor text, claimed claimed_send[], ids uuid[])
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO payment_events (tenant_id, payment_id, seq, from_status, to_status, actor, reason, detail)
    SELECT p_tenant_id, c.payment_id, c.event_seq, 'pending', 'processing', p_actor,
           'claimed for sending to the provider',
           jsonb_build_object('attempt', c.attempts, 'send_attempts', c.send_attempts,
                              'fencing_token', c.fencing_token)
    FROM unnest(claimed) c;
END
$$;

-- The worker's claim from one tenant: takes up to `p_batch` of the tenant's due outbox rows that no
-- one holds, oldest first, leases them to `p_worker` under fresh fencing tokens, moves their payments
-- pending → processing (counting the attempt and remembering the first send) and writes an audit row
-- each. `worker/sql/claim.sql` calls it and says why each step is as it is.
CREATE FUNCTION claim_sends(
    p_tenant_id uuid,
    p_batch bigint,
    p_worker text,
    p_lease_secs double precision,
    p_actor text
) RETURNS SETOF claimed_send
LANGUAGE plpgsql
AS $$
DECLARE
    claimed claimed_send[];
    ids uuid[];
BEGIN
    WITH due AS (
        SELECT o.tenant_id, o.payment_id
        FROM outbox o
        JOIN payments p USING (tenant_id, payment_id)
        WHERE o.tenant_id = p_tenant_id AND o.locked_until IS NULL AND o.available_at <= now()
          AND p.status = 'pending'
        ORDER BY o.available_at
        LIMIT p_batch
        FOR UPDATE OF o SKIP LOCKED
    ), moved AS (
        UPDATE payments p
        SET status = 'processing',
            send_attempts = p.send_attempts + 1,
            first_sent_at = LEAST(p.first_sent_at, now()),
            event_count = p.event_count + 1,
            updated_at = now()
        FROM due
        WHERE p.tenant_id = p_tenant_id AND p.payment_id = due.payment_id AND p.status = 'pending'
        RETURNING p.tenant_id, p.payment_id, p.amount, p.currency, p.customer_id, p.metadata,
                  p.payment_method, p.send_attempts, p.first_sent_at, p.created_at, p.may_be_charged,
                  p.event_count
    ), leased AS (
        UPDATE outbox o
        SET locked_by = p_worker,
            locked_until = now() + make_interval(secs => p_lease_secs),
            fencing_token = 4611686018427387904 + m.send_attempts,
            attempts = o.attempts + 1
        FROM moved m
        WHERE o.tenant_id = p_tenant_id AND o.payment_id = m.payment_id
        RETURNING o.payment_id, o.fencing_token, o.locked_until, o.attempts, o.traceparent, o.tracestate
    )
    SELECT array_agg(ROW(m.tenant_id, m.payment_id, m.amount, m.currency, m.customer_id, m.metadata,
                         m.payment_method, m.send_attempts, m.first_sent_at, m.created_at, m.may_be_charged,
                         l.fencing_token, l.locked_until, l.attempts, l.traceparent, l.tracestate,
                         m.event_count)::claimed_send),
           array_agg(m.payment_id)
    INTO claimed, ids
    FROM moved m JOIN leased l USING (payment_id);

    PERFORM write_claim_rows(p_tenant_id, p_actor, claimed, ids);

    RETURN QUERY SELECT * FROM unnest(claimed);
END
$$;

-- The audit rows and ledger entries of a settlement: one audit row per moved payment and one ledger
-- entry per succeeded one, from `moved` and the caller's arrays. `ids` are the moved payments' ids,
-- for the Citus version in `store/sql/citus.sql`, which reads the payments back instead.
CREATE FUNCTION write_settlement_rows(
    p_tenant_id uuid,
    moved payments[],
    ids uuid[],
    p_payment_ids uuid[],
    p_from_statuses payment_status[],
    p_actors text[],
    p_reasons text[],
    p_details jsonb[],
    p_charge_ids text[],
    p_ledger_amounts bigint[],
    p_ledger_currencies text[],
    p_charged_at timestamptz[]
) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO payment_events (tenant_id, payment_id, seq, from_status, to_status, actor, reason, detail)
    SELECT p_tenant_id, m.payment_id, m.event_count, c.from_status, m.status, c.actor, c.reason, c.detail
    FROM unnest(moved) m
    JOIN unnest(p_payment_ids, p_from_statuses, p_actors, p_reasons, p_details)
        AS c(payment_id, from_status, actor, reason, detail) ON c.payment_id = m.payment_id;

    INSERT INTO ledger_entries (tenant_id, payment_id, provider_charge_id, amount, currency, charged_at)
    SELECT p_tenant_id, m.payment_id, c.charge_id, c.amount, c.currency, c.charged_at
    FROM unnest(moved) m
    JOIN unnest(p_payment_ids, p_charge_ids, p_ledger_amounts, p_ledger_currencies, p_charged_at)
        AS c(payment_id, charge_id, amount, currency, charged_at) ON c.payment_id = m.payment_id
    WHERE m.status = 'succeeded';
END
$$;

-- Terminal status changes for payments of one tenant, the i-th element of every array describing the
-- i-th change: the compare-and-set on each payment, its audit row and, for a success, its ledger
-- entry. Returns every payment that moved, as it now is. `store/sql/settle.sql` calls it and says more.
CREATE FUNCTION settle_payments(
    p_tenant_id uuid,
    p_payment_ids uuid[],
    p_to_statuses payment_status[],
    p_from_statuses payment_status[],
    p_charge_ids text[],
    p_failure_codes text[],
    p_failure_messages text[],
    p_actors text[],
    p_reasons text[],
    p_details jsonb[],
    p_ledger_amounts bigint[],
    p_ledger_currencies text[],
    p_charged_at timestamptz[]
) RETURNS SETOF payments
LANGUAGE plpgsql
AS $$
DECLARE
    moved payments[];
    ids uuid[];
BEGIN
    WITH changed AS (
        UPDATE payments p
        SET status = c.to_status, updated_at = now(),
            provider_charge_id = COALESCE(c.charge_id, p.provider_charge_id),
            failure_code = c.failure_code, failure_message = c.failure_message,
            event_count = p.event_count + 1
        FROM unnest(p_payment_ids, p_to_statuses, p_from_statuses, p_charge_ids, p_failure_codes,
                    p_failure_messages) AS c(payment_id, to_status, from_status, charge_id, failure_code,
                                             failure_message)
        WHERE p.tenant_id = p_tenant_id AND p.payment_id = c.payment_id AND p.status = c.from_status
        RETURNING p.*
    )
    SELECT array_agg(ROW(changed.*)::payments), array_agg(changed.payment_id) INTO moved, ids FROM changed;

    PERFORM write_settlement_rows(p_tenant_id, moved, ids, p_payment_ids, p_from_statuses, p_actors, p_reasons,
                                  p_details, p_charge_ids, p_ledger_amounts, p_ledger_currencies, p_charged_at);

    RETURN QUERY SELECT * FROM unnest(moved);
END
$$;
