CREATE OR REPLACE FUNCTION public.intake(p_tenant_id uuid, p_key text, p_fingerprint bytea, p_payment_id uuid, p_retention_secs double precision, p_amount bigint, p_currency text, p_customer_id text, p_description text, p_metadata jsonb, p_traceparent text, p_tracestate text, p_notify boolean, p_payment_method text DEFAULT NULL::text, p_provider_customer text DEFAULT NULL::text, p_provider_account text DEFAULT NULL::text, p_lock_wait_ms integer DEFAULT NULL::integer)
 RETURNS TABLE(created boolean, fingerprint bytea, payment_id uuid, created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone, response_status smallint, response_body jsonb)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_expires_at timestamptz;
    v_created_at timestamptz;
    v_updated_at timestamptz;
BEGIN
    IF p_lock_wait_ms IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_wait_ms || 'ms', true);
    ELSIF current_setting('citus.propagate_set_commands', true) = 'local' THEN
        PERFORM lock_wait_to_nodes();
    END IF;
    FOR attempt IN 1..2 LOOP
        RETURN QUERY
            SELECT false, k.fingerprint, k.payment_id, NULL::timestamptz, NULL::timestamptz, k.expires_at,
                   k.response_status, k.response_body
            FROM idempotency_keys k
            WHERE k.tenant_id = p_tenant_id AND k.idempotency_key = p_key;
        IF FOUND OR attempt = 2 THEN
            RETURN;
        END IF;

        INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
        VALUES (p_tenant_id, p_key, p_fingerprint, p_payment_id, now() + make_interval(secs => p_retention_secs))
        ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
        RETURNING expires_at INTO v_expires_at;
        IF FOUND THEN
            INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, description, metadata,
                                  payment_method, provider_customer, provider_account)
            VALUES (p_tenant_id, p_payment_id, p_amount, p_currency, p_customer_id, p_description, p_metadata,
                    p_payment_method, p_provider_customer, p_provider_account)
            RETURNING created_at, updated_at INTO v_created_at, v_updated_at;
            INSERT INTO outbox (tenant_id, payment_id, traceparent, tracestate)
            VALUES (p_tenant_id, p_payment_id, p_traceparent, p_tracestate);
            INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason)
            VALUES (p_tenant_id, p_payment_id, NULL, 'pending', 'api', 'accepted');
            IF p_notify THEN
                PERFORM pg_notify('oncepay_outbox', p_tenant_id::text);
            END IF;
            RETURN QUERY
                SELECT true, p_fingerprint, p_payment_id, v_created_at, v_updated_at, v_expires_at,
                       NULL::smallint, NULL::jsonb;
            RETURN;
        END IF;
    END LOOP;
END
$function$;
