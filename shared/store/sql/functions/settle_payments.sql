CREATE OR REPLACE FUNCTION public.settle_payments(p_tenant_id uuid, p_payment_ids uuid[], p_to_statuses payment_status[], p_from_statuses payment_status[], p_charge_ids text[], p_failure_codes text[], p_failure_messages text[], p_actors text[], p_reasons text[], p_details jsonb[], p_ledger_amounts bigint[], p_ledger_currencies text[], p_charged_at timestamp with time zone[])
 RETURNS SETOF payments
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
BEGIN
    RETURN QUERY
    WITH change AS (
        SELECT *
        FROM unnest(p_payment_ids, p_to_statuses, p_from_statuses, p_charge_ids, p_failure_codes,
                    p_failure_messages, p_actors, p_reasons, p_details, p_ledger_amounts, p_ledger_currencies,
                    p_charged_at)
            AS c(payment_id, to_status, from_status, charge_id, failure_code, failure_message, actor, reason,
                 detail, ledger_amount, ledger_currency, charged_at)
    ), moved AS (
        UPDATE payments p
        SET status = c.to_status, updated_at = now(),
            provider_charge_id = COALESCE(c.charge_id, p.provider_charge_id),
            failure_code = c.failure_code, failure_message = c.failure_message,
            event_count = p.event_count + 1
        FROM change c
        WHERE p.tenant_id = p_tenant_id AND p.payment_id = c.payment_id AND p.status = c.from_status
        RETURNING p.*
    ), audit AS (
        INSERT INTO payment_events (tenant_id, payment_id, seq, from_status, to_status, actor, reason, detail)
        SELECT m.tenant_id, m.payment_id, m.event_count, c.from_status, m.status, c.actor, c.reason, c.detail
        FROM moved m JOIN change c USING (payment_id)
    ), ledger AS (
        INSERT INTO ledger_entries (tenant_id, payment_id, provider_charge_id, amount, currency, charged_at)
        SELECT m.tenant_id, m.payment_id, c.charge_id, c.ledger_amount, c.ledger_currency, c.charged_at
        FROM moved m JOIN change c USING (payment_id)
        WHERE m.status = 'succeeded'
    )
    SELECT * FROM moved;
END
$function$;
