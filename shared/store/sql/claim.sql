-- The worker's claim from one tenant (`claim_sends`, migrations/0130 as 0200 redefines it): takes up
-- to $1 of the tenant's due outbox rows that no one holds, oldest first, leases them to this worker
-- under fresh fencing tokens, moves their payments pending → processing (counting the attempt and
-- remembering the first send) and writes an audit row each, in one call.
--
-- A claim's fencing token is 2^62 plus the payment's claim count (`send_attempts`, which every
-- claim raises under the payment's row lock), so it grows with every claim of the payment. A fence
-- only compares a token with the current one of its own payment, so a count per payment is all it
-- needs, and it needs no sequence shared by every payment (under Citus, a tenant's UPDATE cannot
-- draw one). The 2^62 keeps it from ever equalling a token that shared sequence gave before, which a
-- worker of the version before may still hold during an upgrade: the sequence would need 2^62
-- claims to get there. The first send's time is kept with LEAST, which ignores a NULL (Citus refuses
-- now() in a COALESCE).
--
-- It names one tenant, so under Citus each of its statements runs on that tenant's shard alone
-- (SCALING.md); the worker takes turns over the tenants with due rows (`worker/src/rotation.rs`), so
-- one tenant's backlog cannot delay the others' payments. SKIP LOCKED lets any number of workers
-- claim at once without waiting on each other or ever taking the same row. Only rows whose payment is
-- `pending` are taken (the UPDATE repeats the guard, so a payment that moved after the snapshot is
-- left out and its row stays unleased). Rows are locked before their payments, as everywhere else the
-- outbox is written.
--
-- $1 batch size, $2 worker id (locked_by), $3 lease in seconds, $4 actor (`worker:<id>`),
-- $5 resend horizon in seconds (the provider's key window minus the safety margin), $6 tenant id.
-- The quoted aliases tell sqlx's query macros the Rust types and that nothing here is NULL.
SELECT tenant_id AS "tenant_id!: TenantId", payment_id AS "payment_id!: PaymentId",
       amount AS "amount!: Amount", currency AS "currency!: Currency", customer_id AS "customer_id!",
       metadata AS "metadata!: Json<BTreeMap<String, String>>",
       payment_method AS "payment_method: PaymentMethod",
       provider_customer AS "provider_customer: ProviderCustomer",
       provider_account AS "provider_account: ProviderAccount", send_attempts AS "send_attempts!",
       accepted_at AS "accepted_at!", may_be_charged AS "may_be_charged!",
       fencing_token AS "fencing_token!", locked_until AS "locked_until!", attempts AS "attempts!",
       traceparent, tracestate,
       -- Read here, outside the function's UPDATE: Citus refuses now() in a distributed RETURNING.
       now() - first_sent_at < make_interval(secs => $5) AS "in_key_window!"
FROM claim_sends($6, $1, $2, $3, $4)
