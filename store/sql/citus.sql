-- Distributes the schema on Citus, by tenant (SCALING.md). `oncepay-reconciler migrate` runs this
-- after the migrations when the database has the `citus` extension, and again after every later
-- migration; on plain PostgreSQL it never runs. It only adds: a table already distributed is left
-- as it is, so a new table needs one more name below, and a new migration on a distributed table
-- is propagated to the nodes by Citus itself.
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
