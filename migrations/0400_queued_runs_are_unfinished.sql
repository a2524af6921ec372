-- A queued run has not finished either: only `completed` and `failed` runs have a `finished_at`.
-- A queued run's `started_at` is when it was asked for, until a reconciler starts it.
ALTER TABLE recon_runs
    DROP CONSTRAINT recon_runs_finished_unless_running,
    ADD CONSTRAINT recon_runs_finished_when_over
        CHECK ((status IN ('queued', 'running')) = (finished_at IS NULL));
