-- What the api's broker consumers last saw of RabbitMQ's queues (issue 48), for the console's
-- overview: one row per queue, `payments` (the intake queue) and `dead_letters`, written by
-- whichever api process sampled last (`broker.sample_interval_ms`). `oldest_failed_at` is when the
-- message at the head of the dead-letter queue was refused (its `oncepay-failed-at` header, else the
-- time in RabbitMQ's `x-death`); NULL when the queue is empty or the time is not known. The table
-- describes the installation as a whole: on Citus it stays a local table of the coordinator.
CREATE TABLE broker_queue_samples (
    queue            text        PRIMARY KEY CHECK (queue IN ('payments', 'dead_letters')),
    messages         bigint      NOT NULL CHECK (messages >= 0),
    oldest_failed_at timestamptz,
    sampled_at       timestamptz NOT NULL
);

GRANT SELECT, INSERT, UPDATE ON broker_queue_samples TO oncepay_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON broker_queue_samples TO oncepay_reconciler;
