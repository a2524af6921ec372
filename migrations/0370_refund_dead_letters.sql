-- A provider's report that contradicts a final refund (failed after it succeeded, succeeded after
-- it failed) is a dead letter for an operator, as a payment's conflict is (`dead_letters`): the
-- refund keeps its final status, every contradicting report is kept as evidence, and an operator
-- closes the entry as acknowledged, with who and why, once the money is put right at the provider.
--
-- A refund automation gave up on has no row here: its status (`dead_lettered`) is its entry, and its
-- history holds the evidence. So every row is a `conflict` on a refund that is `succeeded` or
-- `failed`, which never moves again (`oncepay_domain::status::next`); the kind and the one
-- resolution are named all the same, so that another kind needs a new CHECK, not a new table.
CREATE TABLE refund_dead_letters (
    tenant_id       uuid        NOT NULL,
    dead_letter_id  bigint      GENERATED ALWAYS AS IDENTITY,
    refund_id       uuid        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('conflict')),
    reason          text        NOT NULL CHECK (reason <> ''),
    evidence        jsonb       NOT NULL CHECK (jsonb_typeof(evidence) = 'array' AND jsonb_array_length(evidence) > 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    resolved_by     text        CHECK (resolved_by <> ''),
    resolution      text        CHECK (resolution IN ('acknowledged')),
    resolution_note text        CHECK (resolution_note <> ''),
    PRIMARY KEY (tenant_id, dead_letter_id),
    FOREIGN KEY (tenant_id, refund_id) REFERENCES refunds (tenant_id, refund_id),
    CONSTRAINT resolved_with_resolution CHECK ((resolved_at IS NULL) = (resolution IS NULL)),
    CONSTRAINT resolved_by_someone CHECK ((resolved_at IS NULL) = (resolved_by IS NULL)),
    CONSTRAINT resolved_with_a_reason CHECK ((resolved_at IS NULL) = (resolution_note IS NULL)),
    CONSTRAINT resolved_after_created CHECK (resolved_at IS NULL OR resolved_at >= created_at)
);

-- At most one open entry per refund: a later contradiction adds its evidence to it.
CREATE UNIQUE INDEX refund_dead_letters_open ON refund_dead_letters (tenant_id, refund_id) WHERE resolved_at IS NULL;
-- The open entries, oldest first, of every tenant: the operators' list and the backlog gauge.
CREATE INDEX refund_dead_letters_open_by_age ON refund_dead_letters (created_at, dead_letter_id)
    WHERE resolved_at IS NULL;
