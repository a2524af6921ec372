-- The claim's select of due rows stays on the outbox, whatever plan its connection keeps, and its
-- lease names the keys of the rows it leases.
--
-- `claim_sends` keeps one plan per connection (migration 0170), made at the connection's first
-- claim. Made while the outbox was empty, after it had been analysed with rows in it, that plan
-- could read every row of a backlog on every claim, in two places:
-- - the due rows' select joined the payments, and could be driven from the tenant's payments
--   (`shared/store/tests/store.rs`: 2,005 outbox rows read to claim 5 of 2,000). The status check
--   is now a subquery per row, which PostgreSQL never turns into a scan of the payments, so the
--   select walks the outbox's due index and stops at the batch;
-- - the lease's UPDATE found the outbox rows through its join with the payments just moved, and
--   could read the tenant's whole outbox by `tenant_id` once for each of them: in the events
--   benchmark, 5 to 25 ms a claim (BENCHMARKS.md, "The worker's rate held"). It now also names the
--   rows' keys, `payment_id = ANY (due)`. That does not bind the plan: in the benchmark after this
--   change, the plan applied it as a filter over the tenant's rows, which it then read once per
--   claim instead of once per payment claimed. Planning the claim for each call, as on Citus, would
--   remove the scan; it is not measured yet.
-- Such a plan lasts until the next `ANALYZE` of the outbox. Same arguments, same rows, same result.
-- Citus plans the claim for each call (`shared/store/sql/citus.sql`, run again after this migration).
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
    due uuid[];
    claimed claimed_send[];
    ids uuid[];
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
        -- `ANY (due)` as well as the join: the rows' keys, for the plan to look them up by.
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

    PERFORM write_claim_rows(p_tenant_id, p_actor, claimed, ids);

    RETURN QUERY SELECT * FROM unnest(claimed);
END
$$;
