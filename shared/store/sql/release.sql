-- Schedules a retry of a send that provably never reached the provider: frees the row (no lease, no
-- token) and makes it due after the backoff, but only while this worker's fencing token is still on
-- it. No row updated means the lease was taken over: the caller must then record nothing.
--
-- $1 tenant_id, $2 payment_id, $3 fencing token, $4 delay in seconds.
UPDATE outbox
SET locked_by = NULL, locked_until = NULL, fencing_token = NULL,
    available_at = now() + make_interval(secs => $4)
WHERE tenant_id = $1 AND payment_id = $2 AND fencing_token = $3
