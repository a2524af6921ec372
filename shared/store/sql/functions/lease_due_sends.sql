CREATE OR REPLACE FUNCTION public.lease_due_sends(p_tenant_id uuid, p_batch bigint, p_worker text, p_lease_secs double precision, OUT claimed claimed_send[], OUT ids uuid[])
 RETURNS record
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
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
$function$;
