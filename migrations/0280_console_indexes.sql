-- What the operator console reads, without a scan at any size (BENCHMARKS.md, "The console"):
-- a page of dead letters in age order, open ones or all, walked by keyset; a payment's own dead
-- letters and the operators' actions on it (not their reads, which grow with every view) for its
-- timeline; and a payment found by its customer reference. A payment found by its
-- id or Idempotency-Key uses the primary keys, one probe per tenant the operator may see; by its
-- provider reference, the ledger's unique (tenant_id, provider_charge_id).
CREATE INDEX dead_letters_open_by_age ON dead_letters (created_at, dead_letter_id) WHERE resolved_at IS NULL;
CREATE INDEX dead_letters_by_age ON dead_letters (created_at, dead_letter_id);
CREATE INDEX dead_letters_of_payment ON dead_letters (tenant_id, payment_id);
CREATE INDEX payments_by_customer ON payments (tenant_id, customer_id);
CREATE INDEX operator_audit_actions_by_payment ON operator_audit (payment_id, audit_id)
    WHERE payment_id IS NOT NULL AND action <> 'payment.read';
