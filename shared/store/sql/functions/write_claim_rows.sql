CREATE OR REPLACE FUNCTION public.write_claim_rows(p_tenant_id uuid, p_actor text, claimed claimed_send[], ids uuid[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO payment_events (tenant_id, payment_id, seq, from_status, to_status, actor, reason, detail)
    SELECT p_tenant_id, c.payment_id, c.event_seq, 'pending', 'processing', p_actor,
           'claimed for sending to the provider',
           jsonb_build_object('attempt', c.attempts, 'send_attempts', c.send_attempts,
                              'fencing_token', c.fencing_token)
    FROM unnest(claimed) c;
END
$function$;
