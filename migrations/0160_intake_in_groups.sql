-- Accepting a group of one tenant's payment requests in one statement (issue 20): `intake_group`,
-- which `store/sql/accept_group.sql` calls for the requests that reach the api together.
--
-- It does for many requests what `intake` does for one, the i-th element of every array describing
-- the i-th request. The keys must be distinct (the api writes a second request with the same key
-- after the first, as it would if they came one after the other). A new key is written with its
-- payment (`pending`), its outbox row and its first audit row; a key that exists comes back as
-- stored, with nothing written. Each result row names its request by its place in the arrays, from 1.
--
-- The new keys are inserted in key order, so two groups that share keys take their locks in the
-- same order. A key that another transaction is writing makes the statement wait for it, at most
-- `lock_timeout`, and then fail whole; so does a row the database refuses. The api then accepts each
-- request on its own with `intake`, so that only that request fails.
--
-- On plain PostgreSQL the rows are written in one statement of INSERT CTEs from the arrays, planned
-- once per connection. Under Citus, where INSERT CTEs leave the shard, `store/sql/citus.sql` replaces
-- this function with one that writes each request with plain INSERTs, in the same transaction.
--
-- The second statement reads the keys that were not written: those stored before, and those another
-- transaction committed while this one waited (its snapshot is newer than the first statement's).
-- A key this call wrote names the payment this call proposed, so it is not read again.
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
    p_tracestates text[]
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
    v_created bigint;
BEGIN
    RETURN QUERY
        WITH request AS (
            SELECT *
            FROM unnest(p_keys, p_fingerprints, p_payment_ids, p_amounts, p_currencies, p_customer_ids,
                        p_descriptions, p_metadata, p_payment_methods, p_traceparents, p_tracestates)
                WITH ORDINALITY
                AS r(key, fingerprint, payment_id, amount, currency, customer_id, description, metadata,
                     payment_method, traceparent, tracestate, item)
        ), new_key AS (
            INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
            SELECT p_tenant_id, r.key, r.fingerprint, r.payment_id, now() + make_interval(secs => p_retention_secs)
            FROM request r
            ORDER BY r.key
            ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
            RETURNING payment_id, expires_at
        ), payment AS (
            INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, description, metadata,
                                  payment_method)
            SELECT p_tenant_id, r.payment_id, r.amount, r.currency, r.customer_id, r.description, r.metadata,
                   r.payment_method
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
        FROM payment p JOIN new_key k USING (payment_id) JOIN request r USING (payment_id);
    GET DIAGNOSTICS v_created = ROW_COUNT;
    IF v_created = cardinality(p_keys) THEN
        RETURN;
    END IF;

    RETURN QUERY
        SELECT array_position(p_keys, k.idempotency_key), false, k.fingerprint, k.payment_id, NULL::timestamptz,
               NULL::timestamptz, k.expires_at, k.response_status, k.response_body
        FROM idempotency_keys k
        WHERE k.tenant_id = p_tenant_id AND k.idempotency_key = ANY (p_keys) AND k.payment_id <> ALL (p_payment_ids);
END
$intake_group$;
