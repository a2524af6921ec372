-- Proposals that stand on something other than a dead-lettered payment (README, "Operators", four
-- eyes): an operator's refund of a succeeded payment, and the resolution of a refund automation gave
-- up on (`dead_lettered`). Each kind keeps what its approval must check again, and nothing else:
-- - a dead-lettered payment (`retry`, `succeeded`, `failed`): its open dead letter and its evidence,
--   as before;
-- - a refund of the payment (`refund`): what the payment had promised back and given back, and how
--   many refunds it had, so that a refund accepted or failed since refuses the approval;
-- - a dead-lettered refund (`refund_succeeded`, `refund_failed`, `refund_retry`): the refund, and how
--   many rows its history had.
-- `seen_status` and `seen_event_count` stay the payment's, for every kind.
ALTER TABLE proposals
    ALTER COLUMN seen_dead_letter_id DROP NOT NULL,
    ALTER COLUMN seen_evidence_count DROP NOT NULL,
    ADD COLUMN seen_refunds_reserved   bigint,
    ADD COLUMN seen_refunded           bigint,
    ADD COLUMN seen_refund_count       integer,
    ADD COLUMN refund_id               uuid,
    ADD COLUMN seen_refund_event_count integer,
    ADD CONSTRAINT proposals_dead_letter_seen_whole
        CHECK ((seen_dead_letter_id IS NULL) = (seen_evidence_count IS NULL)),
    ADD CONSTRAINT proposals_refunds_seen_whole
        CHECK ((seen_refunds_reserved IS NULL) = (seen_refunded IS NULL)
               AND (seen_refunded IS NULL) = (seen_refund_count IS NULL)),
    ADD CONSTRAINT proposals_refund_seen_whole
        CHECK ((refund_id IS NULL) = (seen_refund_event_count IS NULL)),
    -- A proposal stands on exactly one thing, the one its action needs.
    ADD CONSTRAINT proposals_stand_on_what_they_act_on CHECK (
        num_nonnulls(seen_dead_letter_id, seen_refunds_reserved, refund_id) = 1
        AND CASE
            WHEN action->>'kind' = 'refund' THEN seen_refunds_reserved IS NOT NULL
            WHEN action->>'kind' IN ('refund_succeeded', 'refund_failed', 'refund_retry') THEN refund_id IS NOT NULL
            ELSE seen_dead_letter_id IS NOT NULL
        END);

-- The refunds automation gave up on, for the operators' list, oldest first.
CREATE INDEX refunds_dead_lettered ON refunds (updated_at, refund_id) WHERE status = 'dead_lettered';
