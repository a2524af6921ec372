-- Operators become accounts (README, "Operators"): each has a role and may be limited to some
-- tenants, works through the reconciler's operations API with personal tokens, and proposes what
-- moves money for a second operator to approve. Everything they do is written to an audit trail
-- that nobody edits.
--
-- These tables describe the installation, not one tenant's payments: on Citus they stay local
-- tables of the coordinator, as the reconciliation's do (shared/store/sql/citus.sql).

-- What an operator may do. Each role may do everything the roles before it may.
CREATE TYPE operator_role AS ENUM ('viewer', 'operator', 'approver', 'admin');

CREATE TABLE operators (
    operator_id uuid          PRIMARY KEY,
    -- How the operator is named in the audit trail and in `payment_events.actor` (`operator:<name>`).
    name        text          NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 63),
    role        operator_role NOT NULL,
    -- The tenants the operator may see and act on; NULL means every tenant.
    tenant_ids  uuid[]        CHECK (cardinality(tenant_ids) > 0),
    created_at  timestamptz   NOT NULL DEFAULT now(),
    created_by  text          NOT NULL CHECK (created_by <> ''),
    disabled_at timestamptz
);

-- Personal tokens: `oot_` and the base64url of the token id and a random secret. Only the secret's
-- SHA-256 is kept; the token is shown once.
CREATE TABLE operator_tokens (
    token_id      uuid        PRIMARY KEY,
    operator_id   uuid        NOT NULL REFERENCES operators (operator_id),
    secret_sha256 bytea       NOT NULL CHECK (length(secret_sha256) = 32),
    label         text        NOT NULL CHECK (label <> ''),
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    revoked_at    timestamptz,
    CHECK (expires_at > created_at)
);

CREATE INDEX operator_tokens_of ON operator_tokens (operator_id);

-- A decision that moves money, waiting for a second operator. `action` is what will be done, as
-- proposed; `seen_*` is the payment as the proposer saw it, checked again when it is approved.
CREATE TYPE proposal_status AS ENUM ('pending', 'approved', 'rejected', 'withdrawn', 'expired');

CREATE TABLE proposals (
    proposal_id         uuid            PRIMARY KEY,
    tenant_id           uuid            NOT NULL,
    payment_id          uuid            NOT NULL,
    action              jsonb           NOT NULL CHECK (jsonb_typeof(action) = 'object'),
    reason              text            NOT NULL CHECK (reason <> ''),
    seen_status         payment_status  NOT NULL,
    seen_event_count    integer         NOT NULL,
    seen_dead_letter_id bigint          NOT NULL,
    seen_evidence_count integer         NOT NULL,
    proposed_by         uuid            NOT NULL REFERENCES operators (operator_id),
    proposed_at         timestamptz     NOT NULL DEFAULT now(),
    expires_at          timestamptz     NOT NULL,
    status              proposal_status NOT NULL DEFAULT 'pending',
    decided_by          uuid            REFERENCES operators (operator_id),
    decided_at          timestamptz,
    decision_note       text,
    CHECK ((status = 'pending') = (decided_at IS NULL)),
    CHECK (expires_at > proposed_at)
);

-- At most one proposal waits for a payment: a second operator decides on one thing at a time.
CREATE UNIQUE INDEX proposals_one_pending ON proposals (payment_id) WHERE status = 'pending';
CREATE INDEX proposals_by_payment ON proposals (payment_id, proposed_at);

-- Every operator action, read of customer data, proposal, approval and refusal, written in the
-- transaction of the action itself (a refusal in one of its own). Append-only: the triggers below
-- refuse every UPDATE, DELETE and TRUNCATE.
CREATE TABLE operator_audit (
    audit_id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    operator_id   uuid        REFERENCES operators (operator_id),
    operator_name text        NOT NULL CHECK (operator_name <> ''),
    -- Where the request came from (the peer's address), when it came over HTTP.
    source        text,
    action        text        NOT NULL CHECK (action <> ''),
    outcome       text        NOT NULL CHECK (outcome IN ('done', 'proposed', 'refused')),
    tenant_id     uuid,
    payment_id    uuid,
    proposal_id   uuid,
    reason        text,
    before        jsonb,
    after         jsonb,
    detail        jsonb
);

CREATE INDEX operator_audit_by_payment ON operator_audit (payment_id, audit_id) WHERE payment_id IS NOT NULL;
CREATE INDEX operator_audit_by_operator ON operator_audit (operator_name, audit_id);

CREATE FUNCTION operator_audit_is_append_only() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'the operator audit trail is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER operator_audit_no_update_or_delete BEFORE UPDATE OR DELETE ON operator_audit
    FOR EACH ROW EXECUTE FUNCTION operator_audit_is_append_only();
CREATE TRIGGER operator_audit_no_truncate BEFORE TRUNCATE ON operator_audit
    FOR EACH STATEMENT EXECUTE FUNCTION operator_audit_is_append_only();
