-- Whether a send of the payment may have reached the provider, kept on the payment itself.
--
-- Until now this was known only per outbox row (`outbox.lease_expirations`), and a payment queued
-- again after an uncertain send (a poll that found no charge, an operator's retry) started with a
-- fresh row that had forgotten it. Then a claim past the provider's key window sent again, and a run
-- of "not sent" failures ended in `failed` with "no charge was made". Once set the flag stays set;
-- only an operator who retries past the key window clears it, and the audit trail records that.
ALTER TABLE payments ADD COLUMN may_be_charged boolean NOT NULL DEFAULT false;

-- Every payment that was ever `unknown`, or taken back from a worker whose lease expired.
UPDATE payments p SET may_be_charged = true
WHERE EXISTS (
    SELECT 1 FROM payment_events e
    WHERE e.tenant_id = p.tenant_id AND e.payment_id = p.payment_id
      AND (e.to_status = 'unknown' OR (e.from_status = 'processing' AND e.to_status = 'pending'
                                       AND e.actor LIKE 'sweeper%'))
);

ALTER TABLE payments
    ADD CONSTRAINT charged_only_after_a_send CHECK (NOT may_be_charged OR send_attempts > 0),
    -- `unknown` means the outcome of a send is uncertain, and `dead_lettered` is only reached from it.
    ADD CONSTRAINT uncertain_may_be_charged CHECK (status NOT IN ('unknown', 'dead_lettered') OR may_be_charged),
    -- "The provider could not be reached, no charge was made" is only true of a payment no send of
    -- which may have reached the provider.
    ADD CONSTRAINT unreachable_means_never_reached CHECK (NOT (may_be_charged AND failure_code = 'provider_unreachable'));
