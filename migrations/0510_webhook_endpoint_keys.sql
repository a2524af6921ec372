-- An optional `Idempotency-Key` on `POST /v1/webhook-endpoints` (docs/events.md): the endpoint a
-- key made keeps the key and the fingerprint of the request until the key's retention runs out. A
-- retry with the same key and body answers the same endpoint; the key with another body gets 422.
-- After the retention the key is forgotten, and the endpoint stays.
ALTER TABLE merchant_endpoints
    ADD COLUMN idempotency_key     text,
    ADD COLUMN request_fingerprint bytea,
    ADD COLUMN key_expires_at      timestamptz,
    ADD CONSTRAINT merchant_endpoints_key_whole
        CHECK ((idempotency_key IS NULL) = (request_fingerprint IS NULL)
               AND (idempotency_key IS NULL) = (key_expires_at IS NULL));
CREATE UNIQUE INDEX merchant_endpoints_by_key ON merchant_endpoints (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
