-- What the console's endpoints page counts without a scan (BENCHMARKS.md, "The console"): an
-- endpoint's dead-lettered deliveries, which an endpoint's replay also walks. Its pending ones use
-- `merchant_deliveries_in_order`.
CREATE INDEX merchant_deliveries_dead_lettered ON merchant_deliveries (tenant_id, endpoint_id)
    WHERE state = 'dead_lettered';
