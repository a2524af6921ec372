-- Ends a send: deletes the outbox row, but only while this worker's fencing token is still on it.
-- No row deleted means the lease was taken over (the sweeper released or dropped it): the caller
-- must then record nothing. Locks the row before the payment, like the claim and the sweeper.
--
-- $1 tenant_id, $2 payment_id, $3 fencing token.
DELETE FROM outbox
WHERE tenant_id = $1 AND payment_id = $2 AND fencing_token = $3
