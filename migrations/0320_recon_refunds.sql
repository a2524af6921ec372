-- The nightly reconciliation compared charges only: a refund that gave money back without a ledger
-- entry, an entry whose refund the provider does not hold, other money on the two sides, and refunds
-- that no oncepay refund asked for went unreported (issue 36).
--
-- Now each run also lists the provider's refunds created in its window and compares them with
-- `refund_ledger_entries`, recording what it finds under classes of their own, so that operators and
-- the discrepancy metric tell a refund's money from a charge's. A discrepancy about a refund names
-- the oncepay refund and the provider's refund; `provider_charge_id` then holds the refunded charge.
-- A refund the provider has not finished is kept in `recon_unfinished_refunds` and read again by
-- every later run until it is final, as `recon_unfinished_charges` does for charges.
--
-- Every change only adds: a reconciler of the version before still records its runs, leaving the new
-- columns NULL. Like the other reconciliation tables, the new one describes the provider's accounts,
-- not one tenant: under Citus it stays a local table of the coordinator (SCALING.md).
ALTER TABLE recon_runs
    ADD COLUMN provider_refunds      integer CHECK (provider_refunds >= 0),
    ADD COLUMN refund_ledger_entries integer CHECK (refund_ledger_entries >= 0);

ALTER TABLE recon_discrepancies
    ADD COLUMN refund_id          uuid,
    ADD COLUMN provider_refund_id text CHECK (provider_refund_id <> ''),
    DROP CONSTRAINT recon_discrepancies_class_check,
    ADD CONSTRAINT recon_discrepancies_class_check CHECK (class IN (
        'missing_in_ledger',
        'missing_at_provider',
        'amount_or_currency_mismatch',
        'duplicate_charge',
        'unfinished',
        'refund_missing_in_ledger',
        'refund_missing_at_provider',
        'refund_amount_or_currency_mismatch',
        'duplicate_refund',
        'unrequested_refund',
        'refund_unfinished'));

CREATE TABLE recon_unfinished_refunds (
    provider_refund_id text        PRIMARY KEY CHECK (provider_refund_id <> ''),
    -- The account that holds it: NULL is oncepay's own.
    provider_account   text        CHECK (provider_account <> ''),
    -- The refund, payment and tenant its metadata (or its idempotency key) names, as far as it names them.
    tenant_id          uuid,
    payment_id         uuid,
    refund_id          uuid,
    -- What the provider showed the last time it was read: the charge it refunds, the money, the key
    -- it was made under (where the provider reports keys), and when it was created.
    provider_charge_id text        NOT NULL,
    amount             bigint      NOT NULL,
    currency           text        NOT NULL,
    idempotency_key    text,
    created            timestamptz NOT NULL,
    first_run_id       uuid        NOT NULL REFERENCES recon_runs (run_id),
    last_run_id        uuid        NOT NULL REFERENCES recon_runs (run_id),
    -- The run that read it final, and closed it.
    settled_run_id     uuid        REFERENCES recon_runs (run_id)
);

-- The rows every run reads again.
CREATE INDEX recon_unfinished_refunds_open ON recon_unfinished_refunds (created) WHERE settled_run_id IS NULL;
