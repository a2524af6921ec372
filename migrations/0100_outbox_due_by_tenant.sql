-- Claims take each tenant's oldest due rows in turn (worker/sql/claim.sql): index the due rows by
-- tenant, oldest first, in place of the index of all due rows by age, which nothing reads now.
CREATE INDEX outbox_due_by_tenant ON outbox (tenant_id, available_at) WHERE locked_until IS NULL;
DROP INDEX outbox_due;
