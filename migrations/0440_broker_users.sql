-- Broker users: which tenant a RabbitMQ user publishes payments for (issue 48). RabbitMQ refuses a
-- message whose `user_id` property is not the user of the connection that published it, so a
-- message's `user_id` names its tenant as an API key does over HTTP. A broker user belongs to at
-- most one tenant (the primary key); a tenant may have several. Admins map them through the
-- operations API, audited; the api reads them.
CREATE TABLE broker_users (
    broker_user text        PRIMARY KEY CHECK (broker_user <> '' AND octet_length(broker_user) <= 255),
    tenant_id   uuid        NOT NULL REFERENCES tenants (tenant_id),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX broker_users_of_tenant ON broker_users (tenant_id);

GRANT SELECT ON broker_users TO oncepay_api;
GRANT SELECT, INSERT, UPDATE, DELETE ON broker_users TO oncepay_reconciler;

-- A broker user's message charges the tenant's customers as an API key's request does, so letting
-- one publish for a tenant is a four-eyes decision on the tenant, as issuing a key is (0351): a
-- `broker_user` proposal stands on the tenant, not on a payment.
ALTER TABLE proposals
    DROP CONSTRAINT proposals_stand_on_what_they_act_on,
    ADD CONSTRAINT proposals_stand_on_what_they_act_on CHECK (
        CASE
            WHEN action->>'kind' IN ('tenant_create', 'tenant_connect', 'key_issue', 'broker_user') THEN
                payment_id IS NULL AND seen_status IS NULL AND seen_event_count IS NULL
                AND num_nonnulls(seen_dead_letter_id, seen_refunds_reserved, refund_id) = 0
            ELSE
                payment_id IS NOT NULL AND seen_status IS NOT NULL AND seen_event_count IS NOT NULL
                AND seen_provider_account IS NULL
                AND num_nonnulls(seen_dead_letter_id, seen_refunds_reserved, refund_id) = 1
                AND CASE
                    WHEN action->>'kind' = 'refund' THEN seen_refunds_reserved IS NOT NULL
                    WHEN action->>'kind' IN ('refund_succeeded', 'refund_failed', 'refund_retry')
                        THEN refund_id IS NOT NULL
                    ELSE seen_dead_letter_id IS NOT NULL
                END
        END);
