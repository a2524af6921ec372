-- The reaper deletes merchants' events past their retention, oldest first (issue 49): it finds them
-- by age, one tenant at a time.
CREATE INDEX merchant_events_by_age ON merchant_events (tenant_id, created_at);
