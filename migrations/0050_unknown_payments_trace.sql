-- The trace of an `unknown` payment, so the reconciler's resolution joins the payment's trace.
--
-- The outbox row carries the W3C trace context of the request that created the payment, and the
-- worker continues it; but the row is deleted when the payment becomes `unknown`. Whoever moves the
-- payment there (the worker's recording span, or the sweeper copying the outbox row's context) writes
-- the context here instead, and the poller or the webhook that settles the payment continues it, so
-- the request, the provider call and the resolution are one trace. NULL: no trace to continue.
ALTER TABLE unknown_payments
    ADD COLUMN traceparent text CHECK (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'),
    ADD COLUMN tracestate  text;
