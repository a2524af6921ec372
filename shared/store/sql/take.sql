-- Ends sends of one tenant: deletes each outbox row, but only while the worker's fencing token for
-- it is still on it, and returns the payments whose rows it deleted. A payment missing from the
-- result lost its lease (the sweeper released or dropped it): nothing may be recorded for it. The
-- i-th element of every array belongs to the i-th send. Names its tenant, so under Citus it runs on
-- that tenant's shard alone (SCALING.md). Locks rows before their payments, like the claim and the
-- sweeper.
--
-- $1 tenant id, $2 payment ids, $3 fencing tokens.
DELETE FROM outbox o
USING unnest($2::uuid[], $3::bigint[]) AS t(payment_id, fencing_token)
WHERE o.tenant_id = $1 AND o.payment_id = t.payment_id AND o.fencing_token = t.fencing_token
RETURNING o.payment_id
