-- Intake in one round trip: `intake(...)` replays a known key or accepts a new one.
--
-- Before this, the api sent the replay read (`shared/sql/replay.sql`) and, for a new key, the accept
-- statement after it: two round trips for every fresh accept. Sending the accept first instead would
-- have made every replay pay the accept statement's setup (four tables opened and locked for
-- insertion) on top of the read, about twice a bare read's cost in PostgreSQL. In a function, a
-- replay costs the read and a function call, an accept the read and the accept: one round trip either
-- way (BENCHMARKS.md, "Intake in one round trip").
--
-- 1. The replay read: a known key returns its row (`created` false): the fingerprint for the caller
--    to compare, the payment, the key's expiry and the stored terminal response, if any. Nothing is
--    written; the caller decides between a replay and a 422.
-- 2. Otherwise the accept: key, payment (`pending`), outbox row and first audit row in one statement,
--    atomically, and when p_notify is true the workers' wake-up at commit (a NOTIFY serialises
--    commits, see `shared/sql/accept.sql`; the api passes false and notifies after commit). Returns
--    the new payment's timestamps and the key's expiry (`created` true).
-- 3. If a concurrent request inserted the same key between 1 and 2, the insert waits for it (up to
--    the session's lock_timeout, then SQLSTATE 55P03), writes nothing once it commits, and the key is
--    read again; under READ COMMITTED every statement here takes a new snapshot, so that read sees it.
--    (If the other transaction rolled back instead, the insert goes ahead.)
--
-- The function is VOLATILE (it writes) and runs in the caller's transaction: the api calls it
-- outside one, so it commits on its own. Under Citus it is distributed by p_tenant_id, colocated with
-- `payments`, and runs on the tenant's node (SCALING.md).
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
    p_notify boolean
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
                INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, description, metadata)
                SELECT tenant_id, payment_id, p_amount, p_currency, p_customer_id, p_description, p_metadata
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
