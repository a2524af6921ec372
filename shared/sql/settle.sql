-- A terminal status change: the compare-and-set on the payment, its audit row, the ledger entry for a
-- success, and, when $14 is true, the wake-up for long polls, in one statement. No row returned means
-- the payment was no longer in $4: another actor moved it first, and nothing was written.
--
-- The wake-up is optional for the reason given in accept.sql: a NOTIFY serialises commits. The worker
-- passes false and announces the payment after its transaction commits (`oncepay_shared::notify`).
--
-- $1 tenant_id, $2 payment_id, $3 new status, $4 expected status, $5 provider charge id,
-- $6 failure code, $7 failure message, $8 actor, $9 reason, $10 audit detail,
-- $11 ledger amount, $12 ledger currency, $13 when the provider charged, $14 whether to notify.
WITH moved AS (
    UPDATE payments
    SET status = $3, updated_at = now(),
        provider_charge_id = COALESCE($5, provider_charge_id),
        failure_code = $6, failure_message = $7
    WHERE tenant_id = $1 AND payment_id = $2 AND status = $4
    RETURNING tenant_id, payment_id, status
), audit AS (
    INSERT INTO payment_events (tenant_id, payment_id, from_status, to_status, actor, reason, detail)
    SELECT tenant_id, payment_id, $4, $3, $8, $9, $10 FROM moved
), ledger AS (
    INSERT INTO ledger_entries (tenant_id, payment_id, provider_charge_id, amount, currency, charged_at)
    SELECT tenant_id, payment_id, $5, $11, $12, $13 FROM moved WHERE status = 'succeeded'
)
SELECT CASE WHEN $14 THEN pg_notify('oncepay_payment', payment_id::text) END AS "notified: ()" FROM moved
