-- Intake for a group of one tenant's requests with distinct keys, in one round trip and one commit,
-- through the `intake_group` function (`migrations/0160_intake_in_groups.sql`, as 0190 and 0200
-- redefine it): the i-th element of
-- every array describes the i-th request, and each row names its request by that place (`item`,
-- from 1). A known key returns its row with `created` false and writes nothing; a new key is written
-- with its payment, its outbox row and its first audit row, and returns `created` true. A request
-- whose key vanished meanwhile (reaped) has no row.
--
-- As for accept.sql, the workers are woken after the commit by one coalesced NOTIFY.
--
-- $1 tenant_id, $2 idempotency keys, $3 fingerprints, $4 payment ids for new payments, $5 key
-- retention in seconds, $6 amounts, $7 currencies, $8 customer ids, $9 descriptions, $10 metadata,
-- $11 payment methods, $12 traceparents, $13 tracestates, $14 provider customers, $15 provider accounts,
-- $16 the lock wait in milliseconds (NULL: the session's; migration 0330).
SELECT item AS "item!", created AS "created!", fingerprint AS "fingerprint!",
       payment_id AS "payment_id!: PaymentId", created_at, updated_at, expires_at AS "expires_at!",
       response_status, response_body AS "response_body: Json<Box<RawValue>>"
FROM intake_group($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
