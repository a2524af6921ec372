-- The nightly reconciliation kept no memory of charges the provider had not finished when their day
-- was reconciled (Stripe's intents still `processing`, or waiting for the customer): it left them out,
-- never read a finished window again, and so never reported such a charge that took money later,
-- a duplicate among them.
--
-- Now each run records such a charge here, and reports it as an `unfinished` discrepancy; every later
-- run reads each one still open again, by id, in the account that holds it, until it is final. Once
-- it is, that run compares it with the ledger like any charge of its own window, and closes its row.
--
-- Like `recon_runs`, this table describes the provider's accounts, not one tenant: under Citus it
-- stays a local table of the coordinator (SCALING.md).
CREATE TABLE recon_unfinished_charges (
    provider_charge_id text        PRIMARY KEY CHECK (provider_charge_id <> ''),
    -- The account that holds it: NULL is oncepay's own.
    provider_account   text        CHECK (provider_account <> ''),
    -- The payment its metadata names, if it names one.
    tenant_id          uuid,
    payment_id         uuid,
    -- Where the provider said it stands, the last time it was read, and what it asks for.
    status             text        NOT NULL CHECK (status <> ''),
    amount             bigint      NOT NULL,
    currency           text        NOT NULL,
    -- When the provider created it.
    created            timestamptz NOT NULL,
    first_run_id       uuid        NOT NULL REFERENCES recon_runs (run_id),
    last_run_id        uuid        NOT NULL REFERENCES recon_runs (run_id),
    -- The run that read it final, and closed it.
    settled_run_id     uuid        REFERENCES recon_runs (run_id)
);

-- The rows every run reads again.
CREATE INDEX recon_unfinished_charges_open ON recon_unfinished_charges (created) WHERE settled_run_id IS NULL;

ALTER TABLE recon_discrepancies
    DROP CONSTRAINT recon_discrepancies_class_check,
    ADD CONSTRAINT recon_discrepancies_class_check CHECK (class IN (
        'missing_in_ledger',
        'missing_at_provider',
        'amount_or_currency_mismatch',
        'duplicate_charge',
        'unfinished'));
