-- A delivery's successful attempt is kept in the delivery's own row, not in a row of
-- `merchant_delivery_attempts` (BENCHMARKS.md, "Events to merchants"). Most deliveries succeed at
-- their first attempt, and that attempt's row cost every delivery one more insert, index entry and
-- vacuum. The record that delivers sets these columns; a replay of a delivered delivery moves them
-- to `merchant_delivery_attempts` and clears them, so they are set exactly while the delivery is
-- `delivered` by an attempt recorded since this migration.
ALTER TABLE merchant_deliveries
    ADD COLUMN delivered_attempted_at timestamptz,
    ADD COLUMN delivered_by           text,
    ADD COLUMN delivered_status       integer,
    ADD COLUMN delivered_response     text;

-- Every attempt of every delivery, wherever it is kept: what the console and the checks read.
CREATE VIEW merchant_delivery_all_attempts AS
    SELECT tenant_id, endpoint_id, event_id, attempted_at, worker, status, response, error
    FROM merchant_delivery_attempts
    UNION ALL
    SELECT tenant_id, endpoint_id, event_id, delivered_attempted_at, delivered_by, delivered_status,
           delivered_response, NULL
    FROM merchant_deliveries
    WHERE delivered_attempted_at IS NOT NULL;

-- The console reads it. The api's replay moves a success to `merchant_delivery_attempts`.
GRANT SELECT ON merchant_delivery_all_attempts TO oncepay_reconciler;
GRANT INSERT ON merchant_delivery_attempts TO oncepay_api;
