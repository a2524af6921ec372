-- Payments, their audit trail, the idempotency keys that created them, the outbox that feeds the
-- worker, and the ledger of money actually charged.
--
-- The state machine these rows follow is `oncepay_shared::status`; every status change is a guarded
-- `UPDATE ... WHERE status = <expected>` that also appends a `payment_events` row.

CREATE TYPE payment_status AS ENUM (
    'pending',
    'processing',
    'succeeded',
    'failed',
    'unknown',
    'dead_lettered'
);

-- No foreign key to `tenants`: every accepted request share-locks its tenant's row through such a
-- key, and thousands of concurrent share-lockers of one row turn into MultiXact churn. A payment is
-- only ever written for a tenant that authenticated a moment before, and tenants are never deleted.
CREATE TABLE payments (
    tenant_id          uuid           NOT NULL,
    payment_id         uuid           NOT NULL,
    status             payment_status NOT NULL DEFAULT 'pending',
    amount             bigint         NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000),
    currency           text           NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    customer_id        text           NOT NULL CHECK (char_length(customer_id) BETWEEN 1 AND 255),
    description        text           CHECK (char_length(description) <= 1000),
    metadata           jsonb          NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    provider_charge_id text           CHECK (provider_charge_id <> ''),
    failure_code       text           CHECK (failure_code <> ''),
    failure_message    text,
    -- How many times a worker has claimed this payment to send it to the provider.
    send_attempts      integer        NOT NULL DEFAULT 0 CHECK (send_attempts >= 0),
    -- When a worker first claimed it for sending: the provider's key window cannot have started
    -- earlier, so windows measured from here err on the safe side.
    first_sent_at      timestamptz,
    created_at         timestamptz    NOT NULL DEFAULT now(),
    updated_at         timestamptz    NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, payment_id),
    CONSTRAINT succeeded_has_charge CHECK (status <> 'succeeded' OR provider_charge_id IS NOT NULL),
    CONSTRAINT failure_iff_failed   CHECK ((status = 'failed') = (failure_code IS NOT NULL)),
    CONSTRAINT failure_message_with_code CHECK ((failure_code IS NULL) = (failure_message IS NULL)),
    CONSTRAINT claimed_before_sent CHECK (
        status NOT IN ('processing', 'unknown', 'succeeded', 'dead_lettered') OR send_attempts > 0),
    CONSTRAINT first_sent_with_attempts CHECK ((send_attempts = 0) = (first_sent_at IS NULL)),
    CONSTRAINT updated_after_created CHECK (updated_at >= created_at)
);

-- The audit trail: one row per status change, including the creation (from_status NULL).
CREATE TABLE payment_events (
    tenant_id   uuid           NOT NULL,
    payment_id  uuid           NOT NULL,
    event_id    bigint         GENERATED ALWAYS AS IDENTITY,
    from_status payment_status,
    to_status   payment_status NOT NULL,
    -- Who moved it: `api`, `worker:<id>`, `sweeper`, `reconciler:<id>`, `webhook`, `operator:<name>`.
    actor       text           NOT NULL CHECK (actor <> ''),
    reason      text           NOT NULL CHECK (reason <> ''),
    detail      jsonb,
    created_at  timestamptz    NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, payment_id, event_id),
    FOREIGN KEY (tenant_id, payment_id) REFERENCES payments (tenant_id, payment_id),
    CHECK (from_status IS DISTINCT FROM to_status)
);

-- One row per (tenant, Idempotency-Key). Written in the same statement as its payment; when the
-- payment becomes terminal, the same transaction stores the terminal response here so that a replay
-- is a single primary-key read.
CREATE TABLE idempotency_keys (
    tenant_id       uuid        NOT NULL,
    idempotency_key text        NOT NULL CHECK (idempotency_key ~ '^[!-~]{1,255}$'),
    -- SHA-256 of the RFC 8785 canonical JSON of {method, path, body}.
    fingerprint     bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    payment_id      uuid        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- Retention: the reaper may delete the key after this, once its payment is terminal.
    expires_at      timestamptz NOT NULL,
    response_status smallint    CHECK (response_status BETWEEN 200 AND 299),
    response_body   jsonb,
    PRIMARY KEY (tenant_id, idempotency_key),
    UNIQUE (tenant_id, payment_id),
    FOREIGN KEY (tenant_id, payment_id) REFERENCES payments (tenant_id, payment_id),
    CHECK ((response_status IS NULL) = (response_body IS NULL)),
    CHECK (expires_at > created_at)
);

-- The reaper's scan. Maintenance indexes like this one serve cross-tenant sweeps, so they do not
-- lead with tenant_id; under a distributed engine each shard keeps its own (SCALING.md).
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

-- Fencing tokens come from one sequence so that a token is never reused, even after an outbox row is
-- deleted and a new one is written for the same payment.
CREATE SEQUENCE outbox_fencing_token_seq;

-- Work for the worker: one row per payment that must be sent to the provider. The row is deleted when
-- the send reaches an outcome (terminal or unknown) and rewritten if the payment is sent again.
CREATE TABLE outbox (
    tenant_id     uuid        NOT NULL,
    payment_id    uuid        NOT NULL,
    -- Not claimable before this instant (backoff between "not sent" retries).
    available_at  timestamptz NOT NULL DEFAULT now(),
    -- The lease of the worker that holds the row, and the token it must present to record a result.
    locked_by     text,
    locked_until  timestamptz,
    fencing_token bigint,
    -- W3C trace context of the request that created the payment, so every later span joins its trace.
    traceparent   text        CHECK (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'),
    tracestate    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, payment_id),
    FOREIGN KEY (tenant_id, payment_id) REFERENCES payments (tenant_id, payment_id),
    CHECK ((locked_by IS NULL) = (locked_until IS NULL)),
    CHECK (locked_until IS NULL OR fencing_token IS NOT NULL)
);

-- The worker's claim scan and the sweeper's expired-lease scan (cross-tenant, see above).
CREATE INDEX outbox_due ON outbox (available_at) WHERE locked_until IS NULL;
CREATE INDEX outbox_leases ON outbox (locked_until) WHERE locked_until IS NOT NULL;

-- The outbox is a queue: rows are inserted, updated once or twice and deleted within seconds. With the
-- default scale factor autovacuum waits for 20 % of the table to be dead, by which time the claim scan
-- wades through dead index entries; vacuum it on a fixed, small threshold instead, without throttling.
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 5000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);

-- Money actually charged: exactly one row per succeeded payment, with the provider's amount.
CREATE TABLE ledger_entries (
    tenant_id          uuid        NOT NULL,
    payment_id         uuid        NOT NULL,
    provider_charge_id text        NOT NULL CHECK (provider_charge_id <> ''),
    amount             bigint      NOT NULL CHECK (amount > 0),
    currency           text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    -- The provider's creation time of the charge: the nightly reconciliation windows on it.
    charged_at         timestamptz NOT NULL,
    recorded_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, payment_id),
    FOREIGN KEY (tenant_id, payment_id) REFERENCES payments (tenant_id, payment_id)
);

CREATE INDEX ledger_entries_charged_at ON ledger_entries (charged_at);
