-- Refunds: money given back to the customer from a succeeded payment, with the same guarantees as a
-- charge (CONTRACT.md, "Refunds"). A refund moves through the payment states (`payment_status`),
-- keeps its own audit trail, idempotency keys, outbox rows and ledger entries, and every one of its
-- tables leads with `tenant_id` and lives beside its payment under Citus (`shared/store/sql/citus.sql`).

-- What the payment has promised back: the sum of its refunds that are not `failed` (`refunds_reserved`,
-- raised when a refund is accepted, lowered when one fails) and of those that `succeeded`
-- (`refunded`). The accept raises `refunds_reserved` with a guarded UPDATE of the payment's row, so
-- concurrent refunds of one payment queue on that row and the second sees what the first reserved:
-- the CHECK below is the promise that refunds never add up to more than the charge.
ALTER TABLE payments
    ADD COLUMN refunds_reserved bigint NOT NULL DEFAULT 0,
    ADD COLUMN refunded         bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT refunds_within_charge CHECK (0 <= refunded AND refunded <= refunds_reserved AND refunds_reserved <= amount),
    ADD CONSTRAINT refunds_only_of_succeeded CHECK (refunds_reserved = 0 OR status = 'succeeded');

CREATE TABLE refunds (
    tenant_id          uuid           NOT NULL,
    refund_id          uuid           NOT NULL,
    payment_id         uuid           NOT NULL,
    status             payment_status NOT NULL DEFAULT 'pending',
    amount             bigint         NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000),
    currency           text           NOT NULL CHECK (char_length(currency) = 3 AND currency = upper(currency)),
    reason             text           CHECK (reason IN ('duplicate', 'fraudulent', 'requested_by_customer')),
    metadata           jsonb          NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    provider_refund_id text           CHECK (provider_refund_id <> ''),
    failure_code       text           CHECK (failure_code <> ''),
    failure_message    text,
    -- How many times a worker has claimed it, and when first: the provider's key window cannot have
    -- started earlier.
    send_attempts      integer        NOT NULL DEFAULT 0 CHECK (send_attempts >= 0),
    first_sent_at      timestamptz,
    -- Whether any send may have reached the provider (CONTRACT.md, "The reconciler"): kept for good.
    may_have_moved     boolean        NOT NULL DEFAULT false,
    -- Who asked: `api` (the merchant) or `operator:<name>`.
    requested_by       text           NOT NULL CHECK (requested_by <> ''),
    -- The reconciler's lookups of an `unknown` refund: how many so far, and when the next is due.
    lookups            integer        NOT NULL DEFAULT 0 CHECK (lookups >= 0),
    next_lookup_at     timestamptz,
    -- How many audit rows it has; each audit row records its place.
    event_count        integer        NOT NULL DEFAULT 1,
    created_at         timestamptz    NOT NULL DEFAULT now(),
    updated_at         timestamptz    NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, refund_id),
    FOREIGN KEY (tenant_id, payment_id) REFERENCES payments (tenant_id, payment_id),
    CONSTRAINT succeeded_has_refund CHECK (status <> 'succeeded' OR provider_refund_id IS NOT NULL),
    CONSTRAINT failure_iff_failed CHECK ((status = 'failed') = (failure_code IS NOT NULL)),
    CONSTRAINT failure_message_with_code CHECK ((failure_code IS NULL) = (failure_message IS NULL)),
    CONSTRAINT claimed_before_sent CHECK (
        status NOT IN ('processing', 'unknown', 'succeeded', 'dead_lettered') OR send_attempts > 0),
    CONSTRAINT first_sent_with_attempts CHECK ((send_attempts = 0) = (first_sent_at IS NULL)),
    CONSTRAINT updated_after_created CHECK (updated_at >= created_at)
);

-- A payment's refunds, oldest first: `GET /v1/payments/{id}/refunds`.
CREATE INDEX refunds_of_payment ON refunds (tenant_id, payment_id, created_at);
-- The reconciler's scan for refunds left `unknown`, cross-tenant like its other maintenance scans.
CREATE INDEX refunds_unknown ON refunds (next_lookup_at) WHERE status = 'unknown';

-- A refund's audit trail: one row per status change, its creation included (from_status NULL).
CREATE TABLE refund_events (
    tenant_id   uuid           NOT NULL,
    refund_id   uuid           NOT NULL,
    seq         integer        NOT NULL CHECK (seq >= 1),
    from_status payment_status,
    to_status   payment_status NOT NULL,
    actor       text           NOT NULL CHECK (actor <> ''),
    reason      text           NOT NULL CHECK (reason <> ''),
    detail      jsonb,
    created_at  timestamptz    NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, refund_id, seq),
    FOREIGN KEY (tenant_id, refund_id) REFERENCES refunds (tenant_id, refund_id),
    CHECK (from_status IS DISTINCT FROM to_status)
);

-- One row per (tenant, Idempotency-Key) of `POST /v1/payments/{id}/refunds`, written with its refund;
-- the terminal response is stored here when the refund becomes terminal, so a replay is one read.
-- Refund keys are their own namespace: a key used to create a payment may be used for a refund.
CREATE TABLE refund_keys (
    tenant_id       uuid        NOT NULL,
    idempotency_key text        NOT NULL CHECK (octet_length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint     bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    refund_id       uuid        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    response_status smallint    CHECK (response_status BETWEEN 200 AND 299),
    response_body   jsonb,
    PRIMARY KEY (tenant_id, idempotency_key),
    UNIQUE (tenant_id, refund_id),
    FOREIGN KEY (tenant_id, refund_id) REFERENCES refunds (tenant_id, refund_id),
    CHECK ((response_status IS NULL) = (response_body IS NULL)),
    CHECK (expires_at > created_at)
);

CREATE INDEX refund_keys_expiry ON refund_keys (expires_at);

-- Work for the worker: one row per refund to send, as `outbox` holds one per payment, with the same
-- lease and fencing token; deleted when the send reaches an outcome.
CREATE TABLE refund_outbox (
    tenant_id     uuid        NOT NULL,
    refund_id     uuid        NOT NULL,
    available_at  timestamptz NOT NULL DEFAULT now(),
    locked_by     text,
    locked_until  timestamptz,
    fencing_token bigint,
    -- Claims in the current send cycle.
    attempts      integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    traceparent   text,
    tracestate    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, refund_id),
    FOREIGN KEY (tenant_id, refund_id) REFERENCES refunds (tenant_id, refund_id),
    CHECK ((locked_by IS NULL) = (locked_until IS NULL)),
    CHECK (locked_until IS NULL OR fencing_token IS NOT NULL)
);

CREATE INDEX refund_outbox_due ON refund_outbox (available_at) WHERE locked_until IS NULL;
CREATE INDEX refund_outbox_leases ON refund_outbox (locked_until) WHERE locked_until IS NOT NULL;

-- Money actually given back: exactly one row per succeeded refund, with the provider's amount.
CREATE TABLE refund_ledger_entries (
    tenant_id          uuid        NOT NULL,
    refund_id          uuid        NOT NULL,
    payment_id         uuid        NOT NULL,
    provider_refund_id text        NOT NULL CHECK (provider_refund_id <> ''),
    amount             bigint      NOT NULL CHECK (amount > 0),
    currency           text        NOT NULL CHECK (char_length(currency) = 3),
    -- The provider's creation time of the refund: the nightly reconciliation windows on it.
    refunded_at        timestamptz NOT NULL,
    recorded_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, refund_id),
    FOREIGN KEY (tenant_id, refund_id) REFERENCES refunds (tenant_id, refund_id),
    FOREIGN KEY (tenant_id, payment_id) REFERENCES payments (tenant_id, payment_id)
);

CREATE INDEX refund_ledger_entries_refunded_at ON refund_ledger_entries (refunded_at);
-- One provider refund is never booked to two refunds.
CREATE UNIQUE INDEX refund_ledger_entries_provider_refund ON refund_ledger_entries (tenant_id, provider_refund_id);
