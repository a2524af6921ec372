-- A reconciliation run's `status` and `trigger` become enum types, as a payment's status is, so that
-- the database refuses a name no build knows and the code reads each column as its Rust enum.
--
-- The CHECKs and the partial index that compare them with text are dropped and made again over the
-- new types. A reconciler of the version before binds both as text, which the new columns refuse:
-- until it is replaced it cannot start a reconciliation run (README, "Upgrading").
CREATE TYPE recon_run_status AS ENUM ('running', 'completed', 'failed');
CREATE TYPE recon_run_trigger AS ENUM ('schedule', 'operator');

DROP INDEX recon_runs_one_per_window;

ALTER TABLE recon_runs
    DROP CONSTRAINT recon_runs_status_check,
    DROP CONSTRAINT recon_runs_trigger_check,
    DROP CONSTRAINT recon_runs_check1,
    ALTER COLUMN status TYPE recon_run_status USING status::recon_run_status,
    ALTER COLUMN trigger TYPE recon_run_trigger USING trigger::recon_run_trigger,
    ADD CONSTRAINT recon_runs_finished_unless_running CHECK ((status = 'running') = (finished_at IS NULL));

CREATE UNIQUE INDEX recon_runs_one_per_window ON recon_runs (window_start, window_end) WHERE status <> 'failed';
