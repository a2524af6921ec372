-- The tenants with outbox rows that no one holds and that are due: whom the worker's rotation
-- should claim from when no wake-up has named them (at start, after a wake-up that named no one,
-- and at every poll tick). Read-only and without locks: under Citus it reads every shard, which
-- SCALING.md allows for this scan alone.
SELECT DISTINCT tenant_id AS "tenant_id: TenantId"
FROM outbox
WHERE locked_until IS NULL AND available_at <= now()
