-- The claim plans its reads of the outbox on every call; the rest of it keeps its reusable plans.
--
-- The outbox is a queue: empty one minute, a backlog of thousands the next. `claim_sends` kept one
-- plan per connection (migration 0170), made at the connection's first claim from the sizes the
-- outbox had then. A worker that started while the outbox was empty kept a plan for an empty
-- table, and read the tenant's whole backlog on every claim after it, until the next `ANALYZE` or
-- `VACUUM` of the outbox made PostgreSQL plan again:
-- - after the outbox drained and was vacuumed, both the due rows' select and the lease scanned the
--   whole outbox (`shared/store/tests/store.rs`: 4,000 rows read to claim 5 of 2,000);
-- - in the events benchmark, where each window's worker starts on an emptied outbox, a claim took
--   10 ms on average and the claims were PostgreSQL's largest cost (BENCHMARKS.md, "Plans made on
--   an empty outbox"). Migration 0530 changed the statements' form, which does not bind a plan.
--
-- `lease_due_sends` now holds those two statements, planned with the sizes of the moment
-- (`force_custom_plan`), as Citus already planned the whole claim. The rows the claim writes after
-- the lease (`write_claim_rows`) touch no queue and keep the reusable plans of 0170. Measured with
-- pgbench on one connection and a backlog of 600,000, three rounds in turn: a claim of 1 took
-- 0.36-0.44 ms with one plan per connection, 0.72-0.82 ms planned whole on every call, and
-- 0.60-0.70 ms split so; a claim of 50 took 2.7-3.5, 3.9-4.2 and 3.4-4.4 ms.
--
-- Same arguments, same rows, same result as before. Citus copies `lease_due_sends` to every node
-- (`shared/store/sql/citus.sql`, run again after this migration).
CREATE FUNCTION lease_due_sends(
    p_tenant_id uuid,
    p_batch bigint,
    p_worker text,
    p_lease_secs double precision,
    OUT claimed claimed_send[],
    OUT ids uuid[]
)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    due uuid[];
BEGIN
    SELECT array_agg(d.payment_id) INTO due
    FROM (
        SELECT o.payment_id
        FROM outbox o
        WHERE o.tenant_id = p_tenant_id AND o.locked_until IS NULL AND o.available_at <= now()
          -- A subquery per row, not a join: PostgreSQL never turns it into a scan of the payments.
          AND (SELECT p.status FROM payments p WHERE p.tenant_id = o.tenant_id AND p.payment_id = o.payment_id)
              = 'pending'
        ORDER BY o.available_at
        LIMIT p_batch
        FOR UPDATE OF o SKIP LOCKED
    ) d;

    WITH moved AS (
        UPDATE payments p
        SET status = 'processing',
            send_attempts = p.send_attempts + 1,
            first_sent_at = LEAST(p.first_sent_at, now()),
            event_count = p.event_count + 1,
            updated_at = now()
        WHERE p.tenant_id = p_tenant_id AND p.payment_id = ANY (due) AND p.status = 'pending'
        RETURNING p.tenant_id, p.payment_id, p.amount, p.currency, p.customer_id, p.metadata,
                  p.payment_method, p.send_attempts, p.first_sent_at, p.created_at, p.may_be_charged,
                  p.event_count, p.provider_customer, p.provider_account
    ), leased AS (
        UPDATE outbox o
        SET locked_by = p_worker,
            locked_until = now() + make_interval(secs => p_lease_secs),
            fencing_token = 4611686018427387904 + m.send_attempts,
            attempts = o.attempts + 1
        FROM moved m
        WHERE o.tenant_id = p_tenant_id AND o.payment_id = ANY (due) AND o.payment_id = m.payment_id
        RETURNING o.payment_id, o.fencing_token, o.locked_until, o.attempts, o.traceparent, o.tracestate
    )
    SELECT array_agg(ROW(m.tenant_id, m.payment_id, m.amount, m.currency, m.customer_id, m.metadata,
                         m.payment_method, m.send_attempts, m.first_sent_at, m.created_at, m.may_be_charged,
                         l.fencing_token, l.locked_until, l.attempts, l.traceparent, l.tracestate,
                         m.event_count, m.provider_customer, m.provider_account)::claimed_send),
           array_agg(m.payment_id)
    INTO claimed, ids
    FROM moved m JOIN leased l USING (payment_id);
END
$$;

CREATE OR REPLACE FUNCTION claim_sends(
    p_tenant_id uuid,
    p_batch bigint,
    p_worker text,
    p_lease_secs double precision,
    p_actor text
) RETURNS SETOF claimed_send
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    claimed claimed_send[];
    ids uuid[];
BEGIN
    SELECT l.claimed, l.ids INTO claimed, ids FROM lease_due_sends(p_tenant_id, p_batch, p_worker, p_lease_secs) l;

    PERFORM write_claim_rows(p_tenant_id, p_actor, claimed, ids);

    RETURN QUERY SELECT * FROM unnest(claimed);
END
$$;
