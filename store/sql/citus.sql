-- Distributes the schema on Citus, by tenant (SCALING.md). `oncepay-reconciler migrate` runs this
-- after the migrations when the database has the `citus` extension, and again after every later
-- migration; on plain PostgreSQL it never runs. It only adds: a table already distributed is left
-- as it is, so a new table needs one more name below, and a new migration on a distributed table
-- is propagated to the nodes by Citus itself. It also replaces the two functions whose best form
-- differs on Citus (at the end): a migration that changes them must change them here too.
--
-- `tenants` and `api_keys` are small and read on every request: copied to every node. `payments`
-- anchors the colocation group, and every table with a foreign key to it lives beside it, so one
-- tenant's rows are on one node. `recon_runs` and `recon_discrepancies` describe the whole provider
-- account: they stay local tables of the coordinator.
--
-- `citus.propagate_set_commands = local` makes Citus send a transaction's `SET LOCAL` on to the
-- nodes it uses: `intake` repeats the api's `lock_timeout` that way, so that a worker node waiting
-- for a key's writer gives up in time (migrations/0140).
DO $citus$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['tenants', 'api_keys'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = name::regclass) THEN
            PERFORM create_reference_table(name);
        END IF;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'payments'::regclass) THEN
        PERFORM create_distributed_table('payments', 'tenant_id');
    END IF;
    FOREACH name IN ARRAY ARRAY['payment_events', 'idempotency_keys', 'outbox', 'ledger_entries',
                                'unknown_payments', 'dead_letters', 'webhook_events'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = name::regclass) THEN
            PERFORM create_distributed_table(name, 'tenant_id', colocate_with => 'payments');
        END IF;
    END LOOP;
    EXECUTE format('ALTER DATABASE %I SET citus.propagate_set_commands = %L', current_database(), 'local');
END
$citus$;

-- The rows a claim and a settlement add, written on the tenant's shard. The versions of
-- migrations/0130 write from arrays, which Citus builds on the coordinator and copies to the shard
-- with two-phase commit. These read the moved payments back instead (filtered on the tenant, from
-- tables of one colocation group), which Citus runs whole on the shard. Same arguments, same rows.
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

CREATE OR REPLACE FUNCTION write_settlement_rows(
    p_tenant_id uuid,
    moved payments[],
    ids uuid[],
    p_payment_ids uuid[],
    p_from_statuses payment_status[],
    p_actors text[],
    p_reasons text[],
    p_details jsonb[],
    p_charge_ids text[],
    p_ledger_amounts bigint[],
    p_ledger_currencies text[],
    p_charged_at timestamptz[]
) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO payment_events (tenant_id, payment_id, seq, from_status, to_status, actor, reason, detail)
    SELECT p.tenant_id, p.payment_id, p.event_count, c.from_status, p.status, c.actor, c.reason, c.detail
    FROM payments p
    JOIN unnest(p_payment_ids, p_from_statuses, p_actors, p_reasons, p_details)
        AS c(payment_id, from_status, actor, reason, detail) ON c.payment_id = p.payment_id
    WHERE p.tenant_id = p_tenant_id AND p.payment_id = ANY(ids);

    INSERT INTO ledger_entries (tenant_id, payment_id, provider_charge_id, amount, currency, charged_at)
    SELECT p.tenant_id, p.payment_id, c.charge_id, c.amount, c.currency, c.charged_at
    FROM payments p
    JOIN unnest(p_payment_ids, p_charge_ids, p_ledger_amounts, p_ledger_currencies, p_charged_at)
        AS c(payment_id, charge_id, amount, currency, charged_at) ON c.payment_id = p.payment_id
    WHERE p.tenant_id = p_tenant_id AND p.payment_id = ANY(ids) AND p.status = 'succeeded';
END
$$;
