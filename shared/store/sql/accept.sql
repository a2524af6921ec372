-- Intake: replays a known (tenant, idempotency key) or accepts a new one, in one round trip, through
-- the `intake` function (`migrations/0060_intake_function.sql`; `0110_payment_method.sql` adds the
-- payment method, `0200_provider_accounts.sql` the provider's customer and account). A known key returns its row with `created` false and writes nothing; a new key is
-- written with its payment, the payment's outbox row and its first audit row, atomically, and returns
-- `created` true.
--
-- $13 asks for the workers' wake-up inside the transaction. It is optional because a NOTIFY
-- serialises commits: PostgreSQL holds a cluster-wide lock from just before a notifying transaction
-- commits until its commit record is flushed, so accepts that notify cannot share a WAL flush (group
-- commit) and each waits for its own fsync. The api passes false and sends one coalesced NOTIFY for
-- many accepts after they commit (BENCHMARKS.md).
--
-- $1 tenant_id, $2 idempotency key, $3 fingerprint, $4 payment_id for a new payment, $5 key retention
-- in seconds, $6 amount, $7 currency, $8 customer_id, $9 description, $10 metadata, $11 traceparent,
-- $12 tracestate, $13 whether to notify the workers at commit, $14 payment method, $15 provider
-- customer, $16 provider account, $17 the lock wait in milliseconds (NULL: the session's; migration
-- 0330).
SELECT created AS "created!", fingerprint AS "fingerprint!", payment_id AS "payment_id!: PaymentId",
       created_at, updated_at, expires_at AS "expires_at!", response_status,
       response_body AS "response_body: Json<Box<RawValue>>"
FROM intake($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
