CREATE OR REPLACE FUNCTION public.claim_sends(p_tenant_id uuid, p_batch bigint, p_worker text, p_lease_secs double precision, p_actor text)
 RETURNS SETOF claimed_send
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    claimed claimed_send[];
    ids uuid[];
BEGIN
    SELECT l.claimed, l.ids INTO claimed, ids FROM lease_due_sends(p_tenant_id, p_batch, p_worker, p_lease_secs) l;

    PERFORM write_claim_rows(p_tenant_id, p_actor, claimed, ids);

    RETURN QUERY SELECT * FROM unnest(claimed);
END
$function$;
