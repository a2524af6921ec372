-- An operator's `recon run` no longer reconciles inside their request: it queues a run, and the
-- next reconciler to look takes it (reconciler/README.md, "Ledger reconciliation"). The operators'
-- API then needs nothing of the reconciliation but this table.
--
-- A queued run holds its window as a running one does (the partial unique index already counts
-- every status but `failed`), so the nightly job skips a window an operator queued. PostgreSQL
-- refuses to use a new enum value in the transaction that adds it: the constraint that names it is
-- changed by the next migration.
ALTER TYPE recon_run_status ADD VALUE IF NOT EXISTS 'queued' BEFORE 'running';
