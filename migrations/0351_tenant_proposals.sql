-- What a merchant's API key can do is move money: it charges the tenant's customers and refunds
-- them. So creating a tenant with its first key, issuing another key, and pointing a tenant at a
-- provider account are four-eyes decisions (README, "Operators"), proposed by one admin and carried
-- out only when a second operator approves. A key is made only after the approval, when its proposer
-- collects it, and is shown that once: no secret is ever stored, and the approver never sees it.
--
-- One provider account (a Stripe connected account) belongs to at most one tenant, so one
-- merchant's key can never act inside another merchant's account. NULLs do not collide: any number
-- of tenants may have none. An installation where two tenants share an account stops this migration
-- until an operator disconnects one of them.
ALTER TABLE tenants ADD CONSTRAINT tenants_provider_account_once UNIQUE (provider_account);

-- A proposal on a tenant has no payment. What it stands on is the tenant's provider account as the
-- proposer saw it (`seen_provider_account`; NULL: none), checked again when it is approved; a new
-- tenant stands on nothing, and its name and account are checked when it is made.
ALTER TABLE proposals
    ALTER COLUMN payment_id DROP NOT NULL,
    ALTER COLUMN seen_status DROP NOT NULL,
    ALTER COLUMN seen_event_count DROP NOT NULL,
    ADD COLUMN seen_provider_account text,
    -- The key an approved `key_issue` or `tenant_create` made, and when its proposer collected it.
    ADD COLUMN key_id text CHECK (octet_length(key_id) = 16 AND btrim(key_id, '0123456789abcdef') = ''),
    ADD COLUMN key_collected_at timestamptz,
    ADD CONSTRAINT proposals_key_collected_whole CHECK ((key_id IS NULL) = (key_collected_at IS NULL)),
    ADD CONSTRAINT proposals_key_only_once_approved CHECK (
        key_id IS NULL OR (status = 'approved' AND action->>'kind' IN ('key_issue', 'tenant_create'))),
    DROP CONSTRAINT proposals_stand_on_what_they_act_on,
    ADD CONSTRAINT proposals_stand_on_what_they_act_on CHECK (
        CASE
            WHEN action->>'kind' IN ('tenant_create', 'tenant_connect', 'key_issue') THEN
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

-- At most one proposal waits for a tenant, as for a payment.
CREATE UNIQUE INDEX proposals_one_pending_per_tenant ON proposals (tenant_id)
    WHERE status = 'pending' AND payment_id IS NULL;
