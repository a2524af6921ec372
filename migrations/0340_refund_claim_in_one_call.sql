-- The worker's refund claim as a function of the tenant (issue 37), as the payments' claim is
-- (`claim_sends`, 0130). The claim was one statement of data-modifying CTEs. Citus cannot send that
-- statement to one node whole: it runs each CTE on its own and copies their results to every node,
-- so each claim was a transaction on two nodes, committed with two-phase commit. Here each step is a
-- plain statement of the tenant's, and on Citus the call is delegated to the tenant's node
-- (`shared/store/sql/citus.sql`). `refunds/sending.rs` calls it.
--
-- The claim takes up to `p_batch` of the tenant's due refund outbox rows that no one holds, oldest
-- first; moves each refund pending → processing (counting the send, keeping the first send's time);
-- leases its row to `p_worker` under the send's count as fencing token; writes its audit row; and
-- returns what the send needs, the payment's charge and account among it. `in_key_window` is whether
-- the first send is younger than `p_horizon_secs`.

CREATE TYPE claimed_refund AS (
    tenant_id      uuid,
    refund_id      uuid,
    payment_id     uuid,
    fencing_token  bigint,
    attempts       integer,
    may_have_moved boolean,
    in_key_window  boolean,
    amount         bigint,
    currency       text,
    reason         text,
    metadata       jsonb,
    charge_id      text,
    account        text,
    traceparent    text,
    tracestate     text
);

CREATE FUNCTION claim_refunds(
    p_tenant_id uuid,
    p_batch bigint,
    p_worker text,
    p_lease_secs double precision,
    p_actor text,
    p_horizon_secs double precision
) RETURNS SETOF claimed_refund
LANGUAGE plpgsql
-- Each statement is planned with the tenant known. On Citus a reusable plan keeps the tenant a
-- parameter, and Citus cannot send a `FOR UPDATE` with an unknown tenant to one shard.
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    dues uuid[];
    due uuid;
    r refunds;
    o refund_outbox;
    c claimed_refund;
BEGIN
    SELECT array_agg(d.refund_id ORDER BY d.available_at) INTO dues
    FROM (
        SELECT q.refund_id, q.available_at
        FROM refund_outbox q
        JOIN refunds f USING (tenant_id, refund_id)
        WHERE q.tenant_id = p_tenant_id AND q.locked_until IS NULL AND q.available_at <= now()
          AND f.status = 'pending'
        ORDER BY q.available_at
        LIMIT p_batch
        FOR UPDATE OF q SKIP LOCKED
    ) d;
    FOREACH due IN ARRAY coalesce(dues, '{}') LOOP
        -- LEAST keeps the first send's time and ignores a NULL (Citus refuses now() in a COALESCE).
        UPDATE refunds
        SET status = 'processing', send_attempts = send_attempts + 1,
            first_sent_at = LEAST(first_sent_at, now()), event_count = event_count + 1, updated_at = now()
        WHERE tenant_id = p_tenant_id AND refund_id = due AND status = 'pending'
        RETURNING * INTO r;
        CONTINUE WHEN NOT FOUND;

        UPDATE refund_outbox
        SET locked_by = p_worker, locked_until = now() + make_interval(secs => p_lease_secs),
            fencing_token = r.send_attempts, attempts = attempts + 1
        WHERE tenant_id = p_tenant_id AND refund_id = due
        RETURNING * INTO o;

        INSERT INTO refund_events (tenant_id, refund_id, seq, from_status, to_status, actor, reason, detail)
        VALUES (p_tenant_id, due, r.event_count, 'pending', 'processing', p_actor,
                'claimed for sending to the provider',
                jsonb_build_object('attempt', o.attempts, 'send_attempts', r.send_attempts,
                                   'fencing_token', o.fencing_token));

        SELECT p_tenant_id, due, r.payment_id, o.fencing_token, o.attempts, r.may_have_moved,
               r.first_sent_at > now() - make_interval(secs => p_horizon_secs), r.amount, r.currency, r.reason,
               r.metadata, p.provider_charge_id, p.provider_account, o.traceparent, o.tracestate
        INTO c
        FROM payments p
        WHERE p.tenant_id = p_tenant_id AND p.payment_id = r.payment_id;
        RETURN NEXT c;
    END LOOP;
END
$$;
