-- Operators set their own local passwords (README, "Operators", enrollment), and sign-ins are
-- limited by counters of constant cost rather than by counting audit rows.
--
-- An enrollment code is made by an admin for one operator, shown once, and kept here only as its
-- SHA-256. It expires, and using it deletes it, so it works at most once. An operator has at most
-- one code waiting: a fresh one replaces the last.
CREATE TABLE operator_enrollments (
    operator_id uuid        PRIMARY KEY REFERENCES operators (operator_id),
    code_sha256 bytea       NOT NULL CHECK (length(code_sha256) = 32),
    issued_by   uuid        NOT NULL REFERENCES operators (operator_id),
    issued_at   timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    CHECK (expires_at > issued_at)
);

-- Sign-in attempts of one name, or from one source address (an IPv6 address by its /64), in the
-- current window: `refusals` counts the name's refused sign-ins; for a source it counts attempts,
-- taken before the check and given back on success. A row whose window has passed counts as none,
-- and is deleted when a new row is written, so the table holds only the names and sources of the
-- last window. `locked_noted` says the lock was written to the audit trail once this window.
CREATE TABLE sign_in_limits (
    subject      text        PRIMARY KEY CHECK (subject LIKE 'name:%' OR subject LIKE 'source:%'),
    window_start timestamptz NOT NULL DEFAULT now(),
    refusals     integer     NOT NULL DEFAULT 0 CHECK (refusals >= 0),
    locked_noted boolean     NOT NULL DEFAULT false
);

CREATE INDEX sign_in_limits_by_age ON sign_in_limits (window_start);

-- Refused sign-ins are no longer counted from the audit trail.
DROP INDEX operator_audit_refused_sign_ins;
