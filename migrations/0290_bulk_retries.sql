-- Bulk retries: an operator resends a frozen selection of dead-lettered payments at once, from the
-- console. The selection is written here when the operator confirms it, and the reconciler works it
-- one payment at a time, each payment's resend and its recorded result in one transaction, so a
-- restart resumes where it stopped and never resends a payment twice. Operator tables: local to
-- the coordinator under Citus, like `proposals`.
CREATE TABLE bulk_retries (
    bulk_retry_id uuid        PRIMARY KEY,
    -- The operator it acts as: their role and tenants are checked again for every payment.
    operator_id   uuid        NOT NULL REFERENCES operators (operator_id),
    reason        text        NOT NULL CHECK (reason <> ''),
    -- The list filter the selection was made with, as the operator saw it.
    filter        jsonb       NOT NULL CHECK (jsonb_typeof(filter) = 'object'),
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    CHECK (finished_at IS NULL OR finished_at >= created_at)
);

-- One row per selected payment, in the order shown; `outcome` is written with the resend itself.
CREATE TABLE bulk_retry_items (
    bulk_retry_id uuid        NOT NULL REFERENCES bulk_retries (bulk_retry_id),
    position      integer     NOT NULL CHECK (position >= 0),
    tenant_id     uuid        NOT NULL,
    payment_id    uuid        NOT NULL,
    outcome       text        CHECK (outcome IN ('retried', 'proposed', 'refused')),
    detail        text,
    done_at       timestamptz,
    PRIMARY KEY (bulk_retry_id, position),
    UNIQUE (bulk_retry_id, payment_id),
    CHECK ((outcome IS NULL) = (done_at IS NULL)),
    CHECK ((outcome IS NULL) = (detail IS NULL))
);

-- The work left: the reconciler takes the oldest waiting payment of any unfinished bulk retry.
CREATE INDEX bulk_retry_items_waiting ON bulk_retry_items (bulk_retry_id, position) WHERE outcome IS NULL;
