-- The reaper deletes merchants' events past their retention, oldest first (issue 49): it finds the
-- tenants of the oldest across the table, then deletes each tenant's, as it does webhook ids.
CREATE INDEX merchant_events_created_at ON merchant_events (created_at);
