-- Where uncertain outcomes become certain: the reconciler's polling queue, the dead-letter table that
-- operators work, the webhook inbox, and the nightly ledger reconciliation's runs and findings.

-- One row per payment in `unknown`, written in the same transaction that moves the payment there and
-- deleted in the one that moves it out.
CREATE TABLE unknown_payments (
    tenant_id     uuid        NOT NULL,
    payment_id    uuid        NOT NULL,
    -- Why the outcome is uncertain (timeout, reset after sending, 5xx, expired lease ...).
    reason        text        NOT NULL CHECK (reason <> ''),
    since         timestamptz NOT NULL DEFAULT now(),
    poll_attempts integer     NOT NULL DEFAULT 0 CHECK (poll_attempts >= 0),
    next_poll_at  timestamptz NOT NULL DEFAULT now(),
    -- Everything learned so far (poll answers, webhooks), oldest first.
    evidence      jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(evidence) = 'array'),
    PRIMARY KEY (tenant_id, payment_id),
    FOREIGN KEY (tenant_id, payment_id) REFERENCES payments (tenant_id, payment_id)
);

CREATE INDEX unknown_payments_due ON unknown_payments (next_poll_at);

-- Payments that automation could not settle, for operators. `kind` tells them apart:
--   unresolved: the payment itself is `dead_lettered` (attempts or age exhausted);
--   conflict:   the payment is terminal but later evidence contradicts it; the state is kept
--               (a terminal state never moves back) and an operator decides what to do.
CREATE TABLE dead_letters (
    tenant_id       uuid        NOT NULL,
    dead_letter_id  bigint      GENERATED ALWAYS AS IDENTITY,
    payment_id      uuid        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('unresolved', 'conflict')),
    reason          text        NOT NULL CHECK (reason <> ''),
    evidence        jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(evidence) = 'array'),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    resolved_by     text,
    resolution      text        CHECK (resolution IN ('succeeded', 'failed', 'retried', 'acknowledged')),
    resolution_note text,
    PRIMARY KEY (tenant_id, dead_letter_id),
    FOREIGN KEY (tenant_id, payment_id) REFERENCES payments (tenant_id, payment_id),
    CHECK ((resolved_at IS NULL) = (resolution IS NULL)),
    CHECK ((resolved_at IS NULL) = (resolved_by IS NULL)),
    CHECK (resolved_at IS NULL OR resolution_note IS NOT NULL)
);

-- At most one open entry per payment.
CREATE UNIQUE INDEX dead_letters_open ON dead_letters (tenant_id, payment_id) WHERE resolved_at IS NULL;

-- Webhook deliveries already applied, so that a redelivered `webhook-id` changes nothing.
CREATE TABLE webhook_events (
    tenant_id          uuid        NOT NULL,
    webhook_id         text        NOT NULL CHECK (webhook_id <> ''),
    event_type         text        NOT NULL,
    payment_id         uuid        NOT NULL,
    provider_charge_id text,
    -- What applying it did: applied, already_terminal, conflict, not_unknown ...
    outcome            text        NOT NULL,
    received_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, webhook_id)
);

CREATE INDEX webhook_events_received_at ON webhook_events (received_at);

-- Nightly (or on-demand) comparisons of our ledger with the provider's charges over a window.
-- These describe the whole provider account, not one tenant: they are operator tables, and under a
-- distributed engine they live on the coordinator (SCALING.md).
CREATE TABLE recon_runs (
    run_id           uuid        PRIMARY KEY,
    window_start     timestamptz NOT NULL,
    window_end       timestamptz NOT NULL,
    trigger          text        NOT NULL CHECK (trigger IN ('schedule', 'operator')),
    status           text        NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
    started_at       timestamptz NOT NULL DEFAULT now(),
    -- A running run proves it is alive by moving this forward; a stale one may be taken over.
    heartbeat_at     timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    provider_charges integer     CHECK (provider_charges >= 0),
    ledger_entries   integer     CHECK (ledger_entries >= 0),
    discrepancies    integer     CHECK (discrepancies >= 0),
    error            text,
    CHECK (window_end > window_start),
    CHECK ((status = 'running') = (finished_at IS NULL))
);

-- One live or successful run per window: several reconcilers may race to start it, one wins.
CREATE UNIQUE INDEX recon_runs_one_per_window ON recon_runs (window_start, window_end)
    WHERE status <> 'failed';

CREATE TABLE recon_discrepancies (
    run_id             uuid   NOT NULL REFERENCES recon_runs (run_id),
    discrepancy_id     bigint GENERATED ALWAYS AS IDENTITY,
    class              text   NOT NULL CHECK (class IN (
                                  'missing_in_ledger',
                                  'missing_at_provider',
                                  'amount_or_currency_mismatch',
                                  'duplicate_charge')),
    tenant_id          uuid,
    payment_id         uuid,
    provider_charge_id text,
    -- What our side says and what the provider says, as JSON objects.
    ours               jsonb,
    theirs             jsonb,
    detail             text   NOT NULL,
    PRIMARY KEY (run_id, discrepancy_id)
);
