-- `intake` writes a new key's rows with one plain INSERT each instead of one statement of
-- data-modifying CTEs, so that it runs on Citus.
--
-- Citus never plans a statement with INSERT CTEs on one shard: it runs each CTE as a statement of
-- its own, and the key's foreign key to its payment then fails (23503), since the key is written
-- first (tried on Citus 13.2; SCALING.md). Plain INSERTs, each naming the tenant, are each planned
-- on the tenant's shard, and the transaction stays on one node. The key is still written first: it
-- is what decides between a new payment and a concurrent duplicate (ON CONFLICT DO NOTHING), and
-- writing the payment first would leave a payment to undo when the key is taken. So the key's
-- foreign key to its payment is now checked at commit (DEFERRABLE INITIALLY DEFERRED), when the
-- payment is there; a transaction that writes a key without its payment still fails, at commit.
--
-- Otherwise `intake` is the function of `0110_payment_method.sql` (`0060_intake_function.sql`
-- explains each step), with the same signature and results, except that its own wake-up, when
-- asked for, names the tenant as the api's notifier does.
ALTER TABLE idempotency_keys
    ALTER CONSTRAINT idempotency_keys_tenant_id_payment_id_fkey DEFERRABLE INITIALLY DEFERRED;

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
