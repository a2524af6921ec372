-- Operators sign in with the organisation's OpenID provider (README, "Operators"): an operator is
-- linked to the identity the provider names by its `sub`, and a sign-in waits here between the
-- redirect to the provider and the way back, for at most ten minutes, and is used at most once.
ALTER TABLE operators ADD COLUMN oidc_subject text UNIQUE CHECK (oidc_subject <> '');

-- The sign-ins on their way: the SHA-256 of the `state` sent to the provider, with the nonce and
-- the PKCE verifier that belong to it. Taking one deletes it.
CREATE TABLE oidc_sign_ins (
    state_sha256  bytea       PRIMARY KEY CHECK (length(state_sha256) = 32),
    nonce         text        NOT NULL,
    code_verifier text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
