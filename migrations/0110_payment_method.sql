-- A payment can name the payment method the provider is to charge (`payment_method` in the request,
-- e.g. Stripe's `pm_card_visa`), stored as given and sent with every attempt. NULL: none was given.
--
-- The CHECK repeats `oncepay_domain::payment_method::PaymentMethod::parse`. It is added NOT VALID:
-- every existing row holds NULL, which it allows, so validating would prove nothing and would read
-- the whole table under the ACCESS EXCLUSIVE lock this ALTER takes, holding up intake meanwhile.
-- New and updated rows are checked all the same.
ALTER TABLE payments ADD COLUMN payment_method text;
ALTER TABLE payments
    ADD CONSTRAINT payment_method_is_a_reference CHECK (payment_method ~ '^[A-Za-z0-9_]{1,255}$') NOT VALID;

-- `intake` takes the method as a new last parameter; otherwise it is the function of
-- `0060_intake_function.sql`, unchanged (its comment explains each step). The old signature is
-- dropped and the new one created. The method comes last and defaults to NULL so that an api built
-- before this migration, which calls `intake` with thirteen arguments (and refuses a body with a
-- `payment_method`, an unknown field to it), keeps accepting payments while the new api rolls out.
DROP FUNCTION intake(uuid, text, bytea, uuid, double precision, bigint, text, text, text, jsonb, text, text, boolean);

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

        RETURN QUERY
            WITH new_key AS (
                INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
                VALUES (p_tenant_id, p_key, p_fingerprint, p_payment_id,
                        now() + make_interval(secs => p_retention_secs))
                ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
                RETURNING tenant_id, payment_id, expires_at
            ), payment AS (
                INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, description, metadata,
                                      payment_method)
                SELECT tenant_id, payment_id, p_amount, p_currency, p_customer_id, p_description, p_metadata,
                       p_payment_method
                FROM new_key
                RETURNING tenant_id, payment_id, created_at, updated_at
            ), outbox_row AS (
                INSERT INTO outbox (tenant_id, payment_id, traceparent, tracestate)
                SELECT tenant_id, payment_id, p_traceparent, p_tracestate FROM payment
            ), audit AS (
                INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason)
                SELECT tenant_id, payment_id, NULL, 'pending', 'api', 'accepted' FROM payment
            )
            SELECT true, p_fingerprint, p.payment_id, p.created_at, p.updated_at, k.expires_at,
                   NULL::smallint, NULL::jsonb
            FROM payment p JOIN new_key k USING (tenant_id, payment_id);
        IF FOUND THEN
            IF p_notify THEN
                PERFORM pg_notify('oncepay_outbox', '');
            END IF;
            RETURN;
        END IF;
    END LOOP;
END
$intake$;
