-- The api's lock wait travels as an argument (issue 37). The api sets `lock_timeout` on its
-- connections, so that a request whose key another transaction is writing gets 409 after
-- `intake.key_lock_wait_ms`. Under Citus, `intake` and `intake_group` are now delegated to the node
-- that holds the tenant's shards (`shared/store/sql/citus.sql`): the whole call runs there, in a
-- session the coordinator opened, where neither the api's setting nor a `SET LOCAL` sent on by the
-- coordinator (migration 0140) applies. So both functions take the wait as a last parameter and set
-- it for their own transaction, wherever they run. On one PostgreSQL it is the value the session
-- already has.
--
-- The parameter defaults to NULL, so that an api built before this migration keeps accepting while
-- the new one rolls out: without it, `intake` sends the session's value on as 0140 does. Otherwise
-- `intake` and `intake_group` are the functions of 0200, unchanged.
DROP FUNCTION intake(uuid, text, bytea, uuid, double precision, bigint, text, text, text, jsonb, text, text, boolean,
                     text, text, text);

CREATE FUNCTION intake(
    p_tenant_id uuid,
    p_key text,
    p_fingerprint bytea,
    p_payment_id uuid,
    p_retention_secs double precision,
    p_amount bigint,
    p_currency text,
    p_customer_id text,
    p_description text,
    p_metadata jsonb,
    p_traceparent text,
    p_tracestate text,
    p_notify boolean,
    p_payment_method text DEFAULT NULL,
    p_provider_customer text DEFAULT NULL,
    p_provider_account text DEFAULT NULL,
    p_lock_wait_ms integer DEFAULT NULL
) RETURNS TABLE (
    created boolean,
    fingerprint bytea,
    payment_id uuid,
    created_at timestamptz,
    updated_at timestamptz,
    expires_at timestamptz,
    response_status smallint,
    response_body jsonb
) LANGUAGE plpgsql VOLATILE AS $intake$
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
$intake$;

DROP FUNCTION intake_group(uuid, text[], bytea[], uuid[], double precision, bigint[], text[], text[], text[],
                           jsonb[], text[], text[], text[], text[], text[]);

CREATE FUNCTION intake_group(
    p_tenant_id uuid,
    p_keys text[],
    p_fingerprints bytea[],
    p_payment_ids uuid[],
    p_retention_secs double precision,
    p_amounts bigint[],
    p_currencies text[],
    p_customer_ids text[],
    p_descriptions text[],
    p_metadata jsonb[],
    p_payment_methods text[],
    p_traceparents text[],
    p_tracestates text[],
    p_provider_customers text[] DEFAULT NULL,
    p_provider_accounts text[] DEFAULT NULL,
    p_lock_wait_ms integer DEFAULT NULL
) RETURNS TABLE (
    item integer,
    created boolean,
    fingerprint bytea,
    payment_id uuid,
    created_at timestamptz,
    updated_at timestamptz,
    expires_at timestamptz,
    response_status smallint,
    response_body jsonb
) LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $intake_group$
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
$intake_group$;
