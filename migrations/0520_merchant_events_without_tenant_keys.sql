-- The events to merchants lose their foreign keys to `tenants`, as `payments` never had one
-- (migrations/0002): every event is written in the transaction of a payment's change, and each
-- such key share-locked the tenant's row, one row for all of a tenant's concurrent changes. Events
-- and endpoints are only ever written for a tenant that exists, and tenants are never deleted.
--
-- On Citus the keys also decided where the tables live: tied to the reference table `tenants`,
-- Citus kept them on the coordinator, and each change with an event committed on two nodes. Without the keys, `migrate` distributes them beside `payments`
-- (`shared/store/sql/citus.sql`). A Citus cluster migrated before this keeps the keys, and the
-- tables stay where they are: Citus cannot move a table with an identity column off the
-- coordinator (SCALING.md, "Tables").
DO $$
BEGIN
    -- Nested: PL/pgSQL plans a condition when it first reaches it, and without Citus there is no
    -- `pg_dist_partition` to plan it against.
    IF to_regclass('pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'merchant_events'::regclass) THEN
            RETURN;
        END IF;
    END IF;
    ALTER TABLE merchant_endpoints DROP CONSTRAINT merchant_endpoints_tenant_id_fkey;
    ALTER TABLE merchant_events DROP CONSTRAINT merchant_events_tenant_id_fkey;
END
$$;
