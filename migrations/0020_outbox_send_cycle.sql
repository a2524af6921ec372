-- The worker's bookkeeping for one send cycle of a payment, on its outbox row.
--
-- An outbox row lives from the moment a payment is queued for sending until the send reaches an
-- outcome; a payment that is queued again later (the reconciler proved the provider has no charge, an
-- operator retried it) gets a new row, and so a new cycle. `payments.send_attempts` keeps the lifetime
-- count of claims; these columns describe the current cycle only.

ALTER TABLE outbox
    -- How many times a worker has claimed this row. The worker stops retrying a provider it cannot
    -- reach once this reaches its `max_attempts`.
    ADD COLUMN attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- How many times the sweeper took the row back from a worker whose lease had expired. Each such
    -- worker may have reached the provider before it died, so once this is non-zero the payment may
    -- already be charged: it may only be resent while the provider still remembers its key, and a run
    -- of "not sent" failures afterwards makes it `unknown`, never `failed`.
    ADD COLUMN lease_expirations integer NOT NULL DEFAULT 0 CHECK (lease_expirations >= 0),
    ADD CONSTRAINT leased_rows_were_claimed CHECK (locked_until IS NULL OR attempts > 0);
