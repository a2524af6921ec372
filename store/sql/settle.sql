-- Terminal status changes for one or more payments of one tenant, the i-th element of every array
-- describing the i-th change: the compare-and-set on each payment, its audit row and, for a success,
-- its ledger entry, in one statement. Returns every payment that moved, as it now is (its stored
-- response is written from that row by `store_response.sql`). A payment that was no longer in its
-- expected status is missing from the result: another actor moved it first, and nothing was written
-- for it. Names its tenant, so under Citus it runs on that tenant's shard alone (SCALING.md).
--
-- Waking long polls is the caller's business: the reconciler and operators `NOTIFY` in the same
-- transaction, the worker announces its payments after commit (a NOTIFY serialises commits, see
-- accept.sql).
--
-- $1 tenant id, $2 payment ids, $3 new statuses, $4 expected statuses, $5 provider charge ids,
-- $6 failure codes, $7 failure messages, $8 actors, $9 reasons, $10 audit details,
-- $11 ledger amounts, $12 ledger currencies, $13 when the provider charged.
WITH input AS (
    SELECT *
    FROM unnest($2::uuid[], $3::text[]::payment_status[], $4::text[]::payment_status[], $5::text[],
                $6::text[], $7::text[], $8::text[], $9::text[], $10::jsonb[], $11::bigint[], $12::text[],
                $13::timestamptz[])
        AS i(payment_id, to_status, from_status, charge_id, failure_code, failure_message, actor, reason,
             detail, ledger_amount, ledger_currency, charged_at)
), moved AS (
    UPDATE payments p
    SET status = i.to_status, updated_at = now(),
        provider_charge_id = COALESCE(i.charge_id, p.provider_charge_id),
        failure_code = i.failure_code, failure_message = i.failure_message
    FROM input i
    WHERE p.tenant_id = $1 AND p.payment_id = i.payment_id AND p.status = i.from_status
    RETURNING p.*, i.from_status, i.actor, i.reason, i.detail, i.charge_id AS ledger_charge_id, i.ledger_amount,
              i.ledger_currency, i.charged_at
), audit AS (
    INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason, detail)
    SELECT tenant_id, payment_id, from_status, status, actor, reason, detail FROM moved
), ledger AS (
    INSERT INTO ledger_entries (tenant_id, payment_id, provider_charge_id, amount, currency, charged_at)
    SELECT tenant_id, payment_id, ledger_charge_id, ledger_amount, ledger_currency, charged_at
    FROM moved WHERE status = 'succeeded'
)
-- The quoted aliases tell sqlx's query macros the Rust types, as in payment.sql.
SELECT tenant_id AS "tenant_id!: TenantId",
       payment_id AS "payment_id!: PaymentId",
       status AS "status!: PaymentStatus",
       amount AS "amount!: Amount",
       currency AS "currency!: Currency",
       customer_id AS "customer_id!",
       description,
       metadata AS "metadata!: Json<BTreeMap<String, String>>",
       payment_method AS "payment_method: PaymentMethod",
       provider_charge_id,
       failure_code,
       failure_message,
       send_attempts AS "send_attempts!",
       first_sent_at,
       created_at AS "created_at!",
       updated_at AS "updated_at!"
FROM moved
