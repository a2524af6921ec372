-- Operators sign in with a local password (README, "Operators"), for installations without an
-- identity provider, and then work from a browser with a session cookie.
--
-- `password_hash` is an argon2id PHC string; NULL means the operator has no local password. A
-- session is kept by the SHA-256 of its cookie's random value, so a copy of this table opens no
-- session. A session ends when it has been idle too long, at its absolute expiry, or when it is
-- ended (signing out, or signing out everywhere). Refused sign-ins are counted from the audit trail
-- for the rate limit; the index below serves that count.
ALTER TABLE operators ADD COLUMN password_hash text CHECK (password_hash LIKE '$argon2id$%');

CREATE TABLE operator_sessions (
    session_sha256 bytea       PRIMARY KEY CHECK (length(session_sha256) = 32),
    operator_id    uuid        NOT NULL REFERENCES operators (operator_id),
    signed_in_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    source         text,
    ended_at       timestamptz,
    CHECK (expires_at > signed_in_at)
);

CREATE INDEX operator_sessions_open ON operator_sessions (operator_id) WHERE ended_at IS NULL;

CREATE INDEX operator_audit_refused_sign_ins ON operator_audit (operator_name, at)
    WHERE action = 'session.sign_in' AND outcome = 'refused';
