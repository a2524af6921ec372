-- The worker's claim of event deliveries (issue 49) walks each endpoint's pending deliveries in the
-- order it takes them, and stops at its limit: without this index it read and sorted every pending
-- delivery of the endpoint on every claim.
CREATE INDEX merchant_deliveries_next ON merchant_deliveries (tenant_id, endpoint_id, next_attempt_at, event_order)
    WHERE state = 'pending';
-- It also counts each endpoint's deliveries in flight: only leased ones, a few per endpoint.
CREATE INDEX merchant_deliveries_leased ON merchant_deliveries (tenant_id, endpoint_id)
    WHERE state = 'pending' AND locked_until IS NOT NULL;
-- Every claim now goes by endpoint: the index of due deliveries across endpoints has no reader.
DROP INDEX merchant_deliveries_due;
