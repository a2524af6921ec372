CREATE OR REPLACE FUNCTION public.claim_refunds(p_tenant_id uuid, p_batch bigint, p_worker text, p_lease_secs double precision, p_actor text, p_horizon_secs double precision)
 RETURNS SETOF claimed_refund
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
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
               r.metadata, p.provider_charge_id, p.provider_account, o.traceparent, o.tracestate,
               r.created_at
        INTO c
        FROM payments p
        WHERE p.tenant_id = p_tenant_id AND p.payment_id = r.payment_id;
        RETURN NEXT c;
    END LOOP;
END
$function$;
