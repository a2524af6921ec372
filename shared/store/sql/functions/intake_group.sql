CREATE OR REPLACE FUNCTION public.intake_group(p_tenant_id uuid, p_keys text[], p_fingerprints bytea[], p_payment_ids uuid[], p_retention_secs double precision, p_amounts bigint[], p_currencies text[], p_customer_ids text[], p_descriptions text[], p_metadata jsonb[], p_payment_methods text[], p_traceparents text[], p_tracestates text[], p_provider_customers text[] DEFAULT NULL::text[], p_provider_accounts text[] DEFAULT NULL::text[], p_lock_wait_ms integer DEFAULT NULL::integer)
 RETURNS TABLE(item integer, created boolean, fingerprint bytea, payment_id uuid, created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, response_status smallint, response_body jsonb)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
    v_answered bigint;
BEGIN
    IF p_lock_wait_ms IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_wait_ms || 'ms', true);
    END IF;
    RETURN QUERY
        WITH request AS (
            SELECT *
            FROM unnest(p_keys, p_fingerprints, p_payment_ids, p_amounts, p_currencies, p_customer_ids,
                        p_descriptions, p_metadata, p_payment_methods, p_traceparents, p_tracestates,
                        p_provider_customers, p_provider_accounts)
                WITH ORDINALITY
                AS r(key, fingerprint, payment_id, amount, currency, customer_id, description, metadata,
                     payment_method, traceparent, tracestate, provider_customer, provider_account, item)
        ), stored AS (
            SELECT r.item, k.fingerprint, k.payment_id, k.expires_at, k.response_status, k.response_body
            FROM request r
            JOIN idempotency_keys k ON k.tenant_id = p_tenant_id AND k.idempotency_key = r.key
        ), new_key AS (
            INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
            SELECT p_tenant_id, r.key, r.fingerprint, r.payment_id, now() + make_interval(secs => p_retention_secs)
            FROM request r
            WHERE r.item NOT IN (SELECT s.item FROM stored s)
            ORDER BY r.key
            ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
            RETURNING payment_id, expires_at
        ), payment AS (
            INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, description, metadata,
                                  payment_method, provider_customer, provider_account)
            SELECT p_tenant_id, r.payment_id, r.amount, r.currency, r.customer_id, r.description, r.metadata,
                   r.payment_method, r.provider_customer, r.provider_account
            FROM new_key k JOIN request r USING (payment_id)
            RETURNING payment_id, created_at, updated_at
        ), outbox_row AS (
            INSERT INTO outbox (tenant_id, payment_id, traceparent, tracestate)
            SELECT p_tenant_id, r.payment_id, r.traceparent, r.tracestate
            FROM new_key k JOIN request r USING (payment_id)
        ), audit AS (
            INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason)
            SELECT p_tenant_id, k.payment_id, NULL, 'pending', 'api', 'accepted'
            FROM new_key k
        )
        SELECT r.item::integer, true, r.fingerprint, p.payment_id, p.created_at, p.updated_at, k.expires_at,
               NULL::smallint, NULL::jsonb
        FROM payment p JOIN new_key k USING (payment_id) JOIN request r USING (payment_id)
        UNION ALL
        SELECT s.item::integer, false, s.fingerprint, s.payment_id, NULL::timestamptz, NULL::timestamptz,
               s.expires_at, s.response_status, s.response_body
        FROM stored s;
    GET DIAGNOSTICS v_answered = ROW_COUNT;
    IF v_answered = cardinality(p_keys) THEN
        RETURN;
    END IF;

    RETURN QUERY
        SELECT array_position(p_keys, k.idempotency_key), false, k.fingerprint, k.payment_id, NULL::timestamptz,
               NULL::timestamptz, k.expires_at, k.response_status, k.response_body
        FROM idempotency_keys k
        WHERE k.tenant_id = p_tenant_id AND k.idempotency_key = ANY (p_keys) AND k.payment_id <> ALL (p_payment_ids);
END
$function$;
