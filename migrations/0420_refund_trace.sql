-- The trace of the request that asked for a refund, kept on the refund for its whole life, so that
-- its lookups, the webhook that settles it and a resend the reconciler decides continue that trace,
-- as a payment's do (0050). The refund's outbox row carries the same context, but it is deleted when
-- the refund becomes `unknown`. NULL: no trace to continue (the request sent none, or the refund was
-- accepted before this migration).
ALTER TABLE refunds
    ADD COLUMN traceparent text CHECK (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'),
    ADD COLUMN tracestate  text;
