-- Stripe Connect: each tenant may be charged through a provider account of its own (a connected
-- account, `acct_…`), and each payment remembers the account it is charged to and the provider's
-- customer its payment method belongs to.
--
-- `tenants.provider_account` is set by an operator. In connect mode the api copies it onto each
-- payment it accepts, and refuses a tenant without one; in direct mode it leaves the payment's NULL.
-- NULL on a payment means the account of oncepay's own credentials. A payment keeps its account for
-- good: every send, resend and lookup for it goes to that account, whatever an operator later sets
-- on its tenant, because a provider keeps idempotency keys per account and a resend to another
-- account would be a new charge there.
--
-- `payments.provider_customer` is the provider's customer (Stripe's `cus_…`) that the payment
-- method belongs to, named by the merchant in a field of its own. Before, a `customer_id` starting
-- with `cus_` was sent to Stripe as its customer; now `customer_id` is only ever the merchant's
-- reference.
--
-- The CHECKs repeat `oncepay_domain::provider_ref`, in the form of migration 0180 (a length and a
-- character set, no regular expression). The payments' are added NOT VALID, as 0110 explains: every
-- existing row holds NULL.
ALTER TABLE tenants
    ADD COLUMN provider_account text CONSTRAINT tenants_provider_account_is_a_reference CHECK (
        octet_length(provider_account) BETWEEN 1 AND 255
        AND btrim(provider_account, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_') = ''
    );

ALTER TABLE payments
    ADD COLUMN provider_customer text,
    ADD COLUMN provider_account text,
    ADD CONSTRAINT provider_customer_is_a_reference CHECK (
        octet_length(provider_customer) BETWEEN 1 AND 255
        AND btrim(provider_customer, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_') = ''
    ) NOT VALID,
    ADD CONSTRAINT provider_account_is_a_reference CHECK (
        octet_length(provider_account) BETWEEN 1 AND 255
        AND btrim(provider_account, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_') = ''
    ) NOT VALID;

-- `intake` and `intake_group` take both as new last parameters, defaulting to NULL, so that an api
-- built before this migration keeps accepting payments while the new api rolls out (it names no
-- provider customer, and charges through oncepay's own account). Otherwise `intake` is the function
-- of 0140 and `intake_group` that of 0190, unchanged: their comments explain each step. A NULL array
-- gives every request NULL: `unnest` pads shorter arrays with NULLs.
DROP FUNCTION intake(uuid, text, bytea, uuid, double precision, bigint, text, text, text, jsonb, text, text, boolean,
                     text);

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
    p_provider_account text DEFAULT NULL
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
    IF current_setting('citus.propagate_set_commands', true) = 'local' THEN
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
                           jsonb[], text[], text[], text[]);

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
    p_provider_accounts text[] DEFAULT NULL
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

-- The worker's claim returns both, so a send needs no read of its own: they are added at the end of
-- `claimed_send`, and `claim_sends` is the function of 0170 with them in its RETURNING and its rows.
ALTER TYPE claimed_send ADD ATTRIBUTE provider_customer text, ADD ATTRIBUTE provider_account text;

CREATE OR REPLACE FUNCTION claim_sends(
    p_tenant_id uuid,
    p_batch bigint,
    p_worker text,
    p_lease_secs double precision,
    p_actor text
) RETURNS SETOF claimed_send
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    due uuid[];
    claimed claimed_send[];
    ids uuid[];
BEGIN
    SELECT array_agg(d.payment_id) INTO due
    FROM (
        SELECT o.payment_id
        FROM outbox o
        JOIN payments p USING (tenant_id, payment_id)
        WHERE o.tenant_id = p_tenant_id AND o.locked_until IS NULL AND o.available_at <= now()
          AND p.status = 'pending'
        ORDER BY o.available_at
        LIMIT p_batch
        FOR UPDATE OF o SKIP LOCKED
    ) d;

    WITH moved AS (
        UPDATE payments p
        SET status = 'processing',
            send_attempts = p.send_attempts + 1,
            first_sent_at = LEAST(p.first_sent_at, now()),
            event_count = p.event_count + 1,
            updated_at = now()
        WHERE p.tenant_id = p_tenant_id AND p.payment_id = ANY (due) AND p.status = 'pending'
        RETURNING p.tenant_id, p.payment_id, p.amount, p.currency, p.customer_id, p.metadata,
                  p.payment_method, p.send_attempts, p.first_sent_at, p.created_at, p.may_be_charged,
                  p.event_count, p.provider_customer, p.provider_account
    ), leased AS (
        UPDATE outbox o
        SET locked_by = p_worker,
            locked_until = now() + make_interval(secs => p_lease_secs),
            fencing_token = 4611686018427387904 + m.send_attempts,
            attempts = o.attempts + 1
        FROM moved m
        WHERE o.tenant_id = p_tenant_id AND o.payment_id = m.payment_id
        RETURNING o.payment_id, o.fencing_token, o.locked_until, o.attempts, o.traceparent, o.tracestate
    )
    SELECT array_agg(ROW(m.tenant_id, m.payment_id, m.amount, m.currency, m.customer_id, m.metadata,
                         m.payment_method, m.send_attempts, m.first_sent_at, m.created_at, m.may_be_charged,
                         l.fencing_token, l.locked_until, l.attempts, l.traceparent, l.tracestate,
                         m.event_count, m.provider_customer, m.provider_account)::claimed_send),
           array_agg(m.payment_id)
    INTO claimed, ids
    FROM moved m JOIN leased l USING (payment_id);

    PERFORM write_claim_rows(p_tenant_id, p_actor, claimed, ids);

    RETURN QUERY SELECT * FROM unnest(claimed);
END
$$;
