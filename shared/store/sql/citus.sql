-- Distributes the schema on Citus, by tenant (SCALING.md). `oncepay-reconciler migrate` runs this
-- after the migrations when the database has the `citus` extension, and again after every later
-- migration; on plain PostgreSQL it never runs. It only adds: a table already distributed is left
-- as it is, so a new table needs one more name below, and a new migration on a distributed table
-- is propagated to the nodes by Citus itself (`migrate` sends it one statement at a time, which
-- Citus needs: `db::migrate_one_statement_at_a_time`). It also replaces the three functions whose
-- best form differs on Citus, and plans the claim for each call (at the end): a migration that
-- changes them must change them here too.
--
-- `tenants`, `api_keys` and `broker_users` are small and read on every request or message: copied
-- to every node. `payments` anchors the colocation group, and every table with a foreign key to it
-- lives beside it, so one tenant's rows are on one node. The events to merchants live there too
-- (`merchant_…`, in the order of their foreign keys): an event is written in the transaction of
-- its change, which then commits on the tenant's node alone. `recon_runs`, `recon_discrepancies`,
-- `recon_unfinished_charges` and `recon_unfinished_refunds` describe the provider's accounts as a
-- whole, `broker_queue_samples` the broker's queues, and `operators`, `operator_tokens`,
-- `proposals`, `operator_audit`, `bulk_retries` and `bulk_retry_items` the installation's
-- operators: they stay local tables of the coordinator.
--
-- `citus.propagate_set_commands = local` makes Citus send a transaction's `SET LOCAL` on to the
-- nodes it uses: `intake` repeats the api's `lock_timeout` that way, so that a worker node waiting
-- for a key's writer gives up in time (migrations/0140).
DO $citus$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['tenants', 'api_keys', 'broker_users'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = name::regclass) THEN
            PERFORM create_reference_table(name);
        END IF;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass) THEN
        PERFORM create_distributed_table('payments', 'tenant_id');
    END IF;
    FOREACH name IN ARRAY ARRAY['payment_events', 'idempotency_keys', 'outbox', 'ledger_entries',
                                'unknown_payments', 'dead_letters', 'webhook_events', 'refunds', 'refund_events',
                                'refund_keys', 'refund_outbox', 'refund_ledger_entries', 'refund_dead_letters',
                                'merchant_endpoints', 'merchant_events', 'merchant_deliveries',
                                'merchant_delivery_attempts'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = name::regclass) THEN
            PERFORM create_distributed_table(name, 'tenant_id', colocate_with => 'payments');
        END IF;
    END LOOP;
    EXECUTE format('ALTER DATABASE %I SET citus.propagate_set_commands = %L', current_database(), 'local');
END
$citus$;

-- The audit rows a claim adds, written on the tenant's shard. The version of migrations/0130 writes
-- from an array, which Citus builds on the coordinator and copies to the shard with two-phase
-- commit. This one reads the claimed payments back instead (filtered on the tenant, from tables of
-- one colocation group), which Citus runs whole on the shard. Same arguments, same rows.
CREATE OR REPLACE FUNCTION write_claim_rows(p_tenant_id uuid, p_actor text, claimed claimed_send[], ids uuid[])
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO payment_events (tenant_id, payment_id, seq, from_status, to_status, actor, reason, detail)
    SELECT p.tenant_id, p.payment_id, p.event_count, 'pending', 'processing', p_actor,
           'claimed for sending to the provider',
           jsonb_build_object('attempt', o.attempts, 'send_attempts', p.send_attempts,
                              'fencing_token', o.fencing_token)
    FROM payments p
    JOIN outbox o ON o.tenant_id = p.tenant_id AND o.payment_id = p.payment_id
    WHERE p.tenant_id = p_tenant_id AND o.tenant_id = p_tenant_id AND p.payment_id = ANY(ids);
END
$$;

-- The settlement on Citus: the settlement of migrations/0150 writes its audit rows and ledger entries
-- in INSERT CTEs, which Citus never runs on the shard alone. Here the UPDATE comes first, and then
-- each moved payment's audit row and (for a success) ledger entry is a plain INSERT of the tenant's.
-- The call is delegated to the tenant's node inside the caller's transaction (`force_delegation`,
-- below), where Citus accepts only statements that name the tenant it was given: an INSERT … SELECT
-- is refused there, an INSERT … VALUES with the tenant is not. It has no `plan_cache_mode` of its
-- own. Same arguments, same rows, same result.
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
AS $$
DECLARE
    moved payments[];
    m payments;
    i integer;
BEGIN
    WITH changed AS (
        UPDATE payments p
        SET status = c.to_status, updated_at = now(),
            provider_charge_id = COALESCE(c.charge_id, p.provider_charge_id),
            failure_code = c.failure_code, failure_message = c.failure_message,
            event_count = p.event_count + 1
        FROM unnest(p_payment_ids, p_to_statuses, p_from_statuses, p_charge_ids, p_failure_codes,
                    p_failure_messages) AS c(payment_id, to_status, from_status, charge_id, failure_code,
                                             failure_message)
        WHERE p.tenant_id = p_tenant_id AND p.payment_id = c.payment_id AND p.status = c.from_status
        RETURNING p.*
    )
    SELECT array_agg(ROW(changed.*)::payments) INTO moved FROM changed;
    IF moved IS NULL THEN
        RETURN;
    END IF;

    FOREACH m IN ARRAY moved LOOP
        i := array_position(p_payment_ids, m.payment_id);
        INSERT INTO payment_events (tenant_id, payment_id, seq, from_status, to_status, actor, reason, detail)
        VALUES (p_tenant_id, m.payment_id, m.event_count, p_from_statuses[i], m.status, p_actors[i], p_reasons[i],
                p_details[i]);
        IF m.status = 'succeeded' THEN
            INSERT INTO ledger_entries (tenant_id, payment_id, provider_charge_id, amount, currency, charged_at)
            VALUES (p_tenant_id, m.payment_id, p_charge_ids[i], p_ledger_amounts[i], p_ledger_currencies[i],
                    p_charged_at[i]);
        END IF;
    END LOOP;

    RETURN QUERY SELECT * FROM unnest(moved);
END
$$;

-- Intake of a group on Citus: the version of migrations/0200 writes the group from its arrays in
-- INSERT CTEs, which Citus never runs on the shard alone. Here each new key is written with plain
-- INSERTs, as `intake` writes one, all in the caller's transaction on the tenant's node: the group
-- still commits once. Same arguments, same rows.
CREATE OR REPLACE FUNCTION intake_group(
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
AS $intake_group$
#variable_conflict use_column
DECLARE
    v_expires_at timestamptz;
    v_created_at timestamptz;
    v_updated_at timestamptz;
    v_created integer := 0;
    i integer;
BEGIN
    -- The key's INSERT waits at most this long for another transaction writing the same key.
    IF p_lock_wait_ms IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_wait_ms || 'ms', true);
    ELSIF current_setting('citus.propagate_set_commands', true) = 'local' THEN
        PERFORM lock_wait_to_nodes();
    END IF;
    -- In key order, so that two groups that share keys take their locks in the same order.
    FOR i IN SELECT k.i FROM unnest(p_keys) WITH ORDINALITY AS k(key, i) ORDER BY k.key LOOP
        INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
        VALUES (p_tenant_id, p_keys[i], p_fingerprints[i], p_payment_ids[i],
                now() + make_interval(secs => p_retention_secs))
        ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
        RETURNING expires_at INTO v_expires_at;
        CONTINUE WHEN NOT FOUND;
        INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, description, metadata,
                              payment_method, provider_customer, provider_account)
        VALUES (p_tenant_id, p_payment_ids[i], p_amounts[i], p_currencies[i], p_customer_ids[i], p_descriptions[i],
                p_metadata[i], p_payment_methods[i], p_provider_customers[i], p_provider_accounts[i])
        RETURNING created_at, updated_at INTO v_created_at, v_updated_at;
        INSERT INTO outbox (tenant_id, payment_id, traceparent, tracestate)
        VALUES (p_tenant_id, p_payment_ids[i], p_traceparents[i], p_tracestates[i]);
        INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason)
        VALUES (p_tenant_id, p_payment_ids[i], NULL, 'pending', 'api', 'accepted');
        item := i;
        created := true;
        fingerprint := p_fingerprints[i];
        payment_id := p_payment_ids[i];
        created_at := v_created_at;
        updated_at := v_updated_at;
        expires_at := v_expires_at;
        response_status := NULL;
        response_body := NULL;
        RETURN NEXT;
        v_created := v_created + 1;
    END LOOP;
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

-- The claim on Citus is planned for each call. Migration 0170 keeps one reusable plan per connection
-- for its statements (`plan_cache_mode = force_generic_plan`); in such a plan the tenant is still a
-- parameter, and Citus cannot send a `FOR UPDATE` with an unknown tenant to one shard ("could not
-- create distributed plan"). Planned with the tenant known, each statement goes to the tenant's
-- shard, as before 0170.
ALTER FUNCTION claim_sends(uuid, bigint, text, double precision, text) SET plan_cache_mode = force_custom_plan;

-- The calls of an accept, a claim and a settlement are handed whole to the node that holds the
-- tenant's shards (issue 37). Without this, the coordinator runs the function and sends each of its
-- statements to that node, one round trip each: four for an accept. A function distributed by its
-- tenant argument, colocated with `payments`, is delegated instead: the coordinator finds the
-- tenant's node from the argument and sends it the call, which runs there against its local shards,
-- in one round trip. Delegation needs the call as `SELECT … FROM f(…)` (or `SELECT f(…)`) with the
-- tenant a constant once the statement's parameters are bound, which is how oncepay calls them.
--
-- `intake`, `intake_group`, `claim_sends` and `claim_refunds` are called on their own, outside a
-- transaction block, which is when Citus delegates. The settlement runs inside the worker's
-- transaction, between the outbox's DELETE and the responses' UPDATE, so `settle_payments` is forced
-- (`force_delegation`): Citus then delegates it inside a transaction too, provided everything the
-- call does stays with the tenant it was given, as it does. The lock wait of an accept travels as an
-- argument (migration 0330), since the node runs the call in a session of the coordinator's, not the
-- api's.
--
-- `lease_due_sends`, `write_claim_rows` and `lock_wait_to_nodes` are called from inside those
-- functions, so they must exist on every node too: distributed without an argument, they are only
-- copied there.
DO $delegate$
DECLARE
    call record;
BEGIN
    FOR call IN
        SELECT * FROM (VALUES
            ('intake(uuid, text, bytea, uuid, double precision, bigint, text, text, text, jsonb, text, text, '
             'boolean, text, text, text, integer)', 'p_tenant_id', false),
            ('intake_group(uuid, text[], bytea[], uuid[], double precision, bigint[], text[], text[], text[], '
             'jsonb[], text[], text[], text[], text[], text[], integer)', 'p_tenant_id', false),
            ('claim_sends(uuid, bigint, text, double precision, text)', 'p_tenant_id', false),
            ('claim_refunds(uuid, bigint, text, double precision, text, double precision)', 'p_tenant_id', false),
            ('settle_payments(uuid, uuid[], payment_status[], payment_status[], text[], text[], text[], text[], '
             'text[], jsonb[], bigint[], text[], timestamptz[])', 'p_tenant_id', true),
            ('lease_due_sends(uuid, bigint, text, double precision)', NULL, false),
            ('write_claim_rows(uuid, text, claimed_send[], uuid[])', NULL, false),
            ('lock_wait_to_nodes()', NULL, false)
        ) AS f(signature, argument, forced)
    LOOP
        CONTINUE WHEN EXISTS (
            SELECT FROM pg_dist_object
            WHERE classid = 'pg_proc'::regclass AND objid = call.signature::regprocedure
              AND (call.argument IS NULL OR distribution_argument_index IS NOT NULL)
        );
        IF call.argument IS NULL THEN
            PERFORM create_distributed_function(call.signature::regprocedure);
        ELSIF call.forced THEN
            PERFORM create_distributed_function(call.signature::regprocedure, call.argument,
                                                colocate_with := 'payments', force_delegation := true);
        ELSE
            PERFORM create_distributed_function(call.signature::regprocedure, call.argument,
                                                colocate_with := 'payments');
        END IF;
    END LOOP;
END
$delegate$;
