-- Events to merchants (issue 49): every final or operator-visible change of a payment or a refund
-- writes an event in its own transaction, queued for each of the tenant's endpoints that asked for
-- its type; the worker delivers them as Standard Webhooks requests, at least once, in order per
-- payment (README, "Events to merchants").
--
--   merchant_endpoints           where a tenant wants its events, and the secrets that sign them.
--   merchant_events              one row per event: its type, its subject and its `data`.
--   merchant_deliveries          one row per event and endpoint: the delivery's state, its lease
--                                and fencing token (as the outbox's), and when it is next due.
--   merchant_delivery_attempts   every attempt of a delivery: when, the status or the error, and
--                                the first bytes of the response.
--
-- A delivery waits for every earlier delivery of its payment to the same endpoint: `event_order`
-- is the event's place in the order of all events, and a payment's events are written under the
-- payment's row lock (each change, refunds' included, updates the payment row first), so their
-- places follow their commits.

CREATE TABLE merchant_endpoints (
    tenant_id        uuid        NOT NULL REFERENCES tenants (tenant_id),
    endpoint_id      uuid        NOT NULL,
    url              text        NOT NULL,
    description      text        NOT NULL DEFAULT '',
    -- The types it receives; empty means every type.
    event_types      text[]      NOT NULL DEFAULT '{}',
    -- The secret the signatures are made with, `whsec_` and the base64 of at least 24 bytes (32
    -- characters). During a rotation the previous secret signs as well, until
    -- `previous_secret_until`.
    secret           text        NOT NULL CHECK (secret LIKE 'whsec\_%' AND length(secret) >= 38),
    previous_secret  text        CHECK (previous_secret LIKE 'whsec\_%' AND length(previous_secret) >= 38),
    previous_secret_until timestamptz,
    enabled          boolean     NOT NULL DEFAULT true,
    -- Why deliveries stopped, while `enabled` is false: `gone` (it answered 410), `failing` (it
    -- failed for `events.disable_after_secs`) or `merchant`.
    disabled_reason  text        CHECK (disabled_reason IN ('gone', 'failing', 'merchant')),
    disabled_at      timestamptz,
    -- Since when every attempt has failed; NULL after a success.
    failing_since    timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, endpoint_id),
    CHECK (enabled = (disabled_reason IS NULL))
);

CREATE TABLE merchant_events (
    tenant_id   uuid        NOT NULL REFERENCES tenants (tenant_id),
    event_id    uuid        NOT NULL,
    event_order bigint      GENERATED ALWAYS AS IDENTITY,
    type        text        NOT NULL,
    -- The payment it is about (a refund's payment for a refund's event); NULL for an endpoint's.
    payment_id  uuid,
    refund_id   uuid,
    -- The change's place in its resource's history (`payment_events.seq`, `refund_events.seq`).
    sequence    integer,
    data        jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, event_id)
);
CREATE INDEX merchant_events_by_payment ON merchant_events (tenant_id, payment_id, event_order);

CREATE TABLE merchant_deliveries (
    tenant_id       uuid        NOT NULL,
    endpoint_id     uuid        NOT NULL,
    event_id        uuid        NOT NULL,
    -- Copied from the event, for the order check.
    payment_id      uuid,
    event_order     bigint      NOT NULL,
    state           text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead_lettered')),
    -- Attempts since the delivery was queued or last replayed: its place in the retry schedule.
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    locked_by       text,
    locked_until    timestamptz,
    fencing_token   bigint      NOT NULL DEFAULT 0,
    delivered_at    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, endpoint_id, event_id),
    FOREIGN KEY (tenant_id, endpoint_id) REFERENCES merchant_endpoints ON DELETE CASCADE,
    FOREIGN KEY (tenant_id, event_id) REFERENCES merchant_events
);
CREATE INDEX merchant_deliveries_due ON merchant_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX merchant_deliveries_in_order ON merchant_deliveries (tenant_id, endpoint_id, payment_id, event_order)
    WHERE state = 'pending';
CREATE INDEX merchant_deliveries_by_event ON merchant_deliveries (tenant_id, event_id);

CREATE TABLE merchant_delivery_attempts (
    tenant_id    uuid        NOT NULL,
    endpoint_id  uuid        NOT NULL,
    event_id     uuid        NOT NULL,
    attempt_id   bigint      GENERATED ALWAYS AS IDENTITY,
    attempted_at timestamptz NOT NULL,
    worker       text        NOT NULL,
    -- The HTTP status the endpoint answered, or NULL when there was no answer (see `error`).
    status       integer,
    -- The first bytes of the response body, as text.
    response     text        NOT NULL DEFAULT '',
    error        text,
    PRIMARY KEY (tenant_id, endpoint_id, event_id, attempt_id),
    FOREIGN KEY (tenant_id, endpoint_id, event_id) REFERENCES merchant_deliveries ON DELETE CASCADE
);

-- The api: merchants manage their endpoints, read their events and deliveries, and replay them.
GRANT SELECT, INSERT, UPDATE, DELETE ON merchant_endpoints TO oncepay_api;
GRANT SELECT, INSERT ON merchant_events TO oncepay_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON merchant_deliveries TO oncepay_api;
GRANT SELECT, DELETE ON merchant_delivery_attempts TO oncepay_api;
-- The worker: writes the events of the changes it makes, and delivers.
GRANT SELECT, UPDATE ON merchant_endpoints TO oncepay_worker;
GRANT SELECT, INSERT ON merchant_events TO oncepay_worker;
GRANT SELECT, INSERT, UPDATE ON merchant_deliveries TO oncepay_worker;
GRANT SELECT, INSERT ON merchant_delivery_attempts TO oncepay_worker;
-- The reconciler: writes the events of the changes it and the operators make; operators see and
-- manage everything.
GRANT SELECT, INSERT, UPDATE, DELETE ON merchant_endpoints, merchant_events, merchant_deliveries,
    merchant_delivery_attempts TO oncepay_reconciler;
