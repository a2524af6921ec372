-- Under Citus, a request whose key another transaction is writing waits `intake.key_lock_wait_ms` and
-- gets 409, as on one PostgreSQL. Before this, it waited until the statement timeout and got 503.
--
-- The api sets `lock_timeout` on its connections. Under Citus the key's INSERT runs on a worker
-- node, over a connection the coordinator opened, and a session setting does not travel with it: the
-- worker node waited without limit. Citus sends a `SET LOCAL` on to the nodes a transaction uses
-- when `citus.propagate_set_commands` is `local`, which `store/sql/citus.sql` sets for the database.
-- So `intake` now repeats the session's `lock_timeout` as a `SET LOCAL` when that setting is on. On
-- plain PostgreSQL the setting does not exist and nothing changes.
--
-- The `SET LOCAL` runs in a function of its own, called from `intake`: Citus sends a `SET LOCAL`
-- on only when it sees it inside a function call, and a utility statement run directly by a function
-- called from the top-level query is not seen as one (tried on Citus 13.2: from `intake` itself,
-- nothing was sent).
--
-- Otherwise `intake` is the function of `0120_intake_plain_statements.sql`, with the same signature
-- and results.
CREATE FUNCTION lock_wait_to_nodes() RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    EXECUTE format('SET LOCAL lock_timeout = %L', current_setting('lock_timeout'));
END
$$;

CREATE OR REPLACE FUNCTION intake(
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
    p_payment_method text DEFAULT NULL
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
    -- The key's INSERT waits at most this long for another transaction writing the same key.
    IF current_setting('citus.propagate_set_commands', true) = 'local' THEN
        PERFORM lock_wait_to_nodes();
    END IF;
    -- Twice at most: the second read is step 3.
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
                                  payment_method)
            VALUES (p_tenant_id, p_payment_id, p_amount, p_currency, p_customer_id, p_description, p_metadata,
                    p_payment_method)
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
