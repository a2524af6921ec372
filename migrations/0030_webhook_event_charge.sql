-- Keep the charge each webhook reported, as received, and find a payment's webhooks quickly.
--
-- A webhook that arrives while its payment is still being sent is only recorded (the worker holding
-- the payment will learn the same outcome). If the send then ends uncertain, the payment becomes
-- `unknown`, and by then the provider may no longer find the charge by its key (its key window has
-- passed, say); the signed charge recorded here settles it without asking. Operators also see it
-- when they resolve a dead letter.
ALTER TABLE webhook_events
    ADD COLUMN charge jsonb CHECK (charge IS NULL OR jsonb_typeof(charge) = 'object');

CREATE INDEX webhook_events_payment ON webhook_events (tenant_id, payment_id);
