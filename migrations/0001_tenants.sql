-- Tenants and their API keys.
--
-- A tenant is one customer of oncepay. Every other table carries `tenant_id` as the leading column of
-- its primary key, so the schema can later be distributed by tenant (see SCALING.md); `tenants` itself
-- is small and read-mostly, and would be a reference table there.

CREATE TABLE tenants (
    tenant_id             uuid        PRIMARY KEY,
    -- A short operator-facing handle, e.g. `acme`.
    name                  text        NOT NULL UNIQUE
                                      CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    -- Requests per second this tenant may make to one api process; NULL means the api's default.
    rate_limit_per_second integer     CHECK (rate_limit_per_second > 0),
    created_at            timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored only as the SHA-256 of their secret part. The token a client presents names
-- the tenant and the key id, so authentication is a primary-key read followed by a constant-time
-- comparison of hashes; the secret itself is never stored and never logged.
CREATE TABLE api_keys (
    tenant_id     uuid        NOT NULL REFERENCES tenants (tenant_id),
    key_id        text        NOT NULL CHECK (key_id ~ '^[0-9a-f]{16}$'),
    secret_sha256 bytea       NOT NULL CHECK (octet_length(secret_sha256) = 32),
    label         text        CHECK (char_length(label) <= 200),
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz,
    PRIMARY KEY (tenant_id, key_id),
    CHECK (revoked_at IS NULL OR revoked_at >= created_at)
);
