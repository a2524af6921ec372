-- On one PostgreSQL, the settlement is one statement again, planned once per connection.
--
-- Migration 0130 split `settle_payments` in two so that Citus keeps it on one shard: an UPDATE that
-- collects the moved payments in an array, then `write_settlement_rows`, which writes their audit
-- rows and ledger entries. On one PostgreSQL that made a one-payment settlement cost about 0.17 ms
-- more than the single statement before it (0.46 against 0.29 ms, a micro-benchmark of 400
-- settlements each, BENCHMARKS.md). Told to keep its reusable plan instead of planning for each
-- call's arrays, the split function took about 0.39 ms; the single statement in a function that
-- keeps its plan, 0.32–0.33 ms.
--
-- So here the settlement is one statement with its INSERTs as CTEs, as before 0130, in a function
-- that always reuses its plan (`plan_cache_mode = force_generic_plan`). The reusable plan looks up
-- each payment by its primary key, whatever the number of payments. Under Citus, where INSERT CTEs
-- leave the shard, `store/sql/citus.sql` replaces this function with one that keeps the two steps.
-- The arguments and the result are those of 0130.
DROP FUNCTION write_settlement_rows(uuid, payments[], uuid[], uuid[], payment_status[], text[], text[], jsonb[],
                                    text[], bigint[], text[], timestamptz[]);

CREATE OR REPLACE FUNCTION settle_payments(
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
SET plan_cache_mode = force_generic_plan
AS $$
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
$$;
