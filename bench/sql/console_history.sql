-- Payments $2..=$3 of the console benchmark's history of $4 payments, each with its key and audit
-- rows, and its ledger entry and webhook, or its dead letter and an operator's read of it;
-- `load_batch` in bench/src/console.rs says how each is placed and how it ends. Returns how many
-- payments it wrote.
--
-- $1 tenant ids, $2 first payment, $3 last payment, $4 payments in all, $5 days of history,
-- $6 one payment in this many is dead-lettered, $7 days of webhooks.
WITH ids AS (
    SELECT i, tenant_id, created_at, dead,
           created_at + CASE WHEN dead THEN make_interval(secs => (3600 + i % 7200)::float8)
                             ELSE interval '500 milliseconds' END AS finished_at,
           (lpad(to_hex((extract(epoch FROM created_at) * 1000)::bigint), 12, '0') || '7'
            || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid AS payment_id
    FROM generate_series($2::bigint, $3::bigint) AS i, md5(i::text) AS h,
         LATERAL (
             SELECT ($1::uuid[])[1 + (i % cardinality($1::uuid[]))::integer] AS tenant_id,
                    now() - make_interval(days => $5::integer + 1)
                    + make_interval(secs => (i * $5::integer * 86400.0 / $4::bigint)::float8) AS created_at,
                    i % $6::bigint = 0 AS dead
         ) AS placed
), paid AS (
    INSERT INTO payments (tenant_id, payment_id, status, amount, currency, customer_id, metadata,
                          provider_charge_id, send_attempts, first_sent_at, may_be_charged, event_count,
                          created_at, updated_at)
    SELECT tenant_id, payment_id,
           (CASE WHEN dead THEN 'dead_lettered' ELSE 'succeeded' END)::payment_status,
           100 + i % 100000, 'EUR', 'cus_' || i / 10, jsonb_build_object('order', 'order-' || i),
           CASE WHEN dead THEN NULL ELSE 'ch_' || substr(md5(payment_id::text), 1, 24) END,
           1, created_at + interval '10 milliseconds', dead, CASE WHEN dead THEN 4 ELSE 3 END,
           created_at, finished_at
    FROM ids
    RETURNING tenant_id, payment_id, status, amount, currency, provider_charge_id, updated_at
), keyed AS (
    INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, created_at,
                                  expires_at, response_status, response_body)
    SELECT tenant_id, 'order-' || i, sha256(convert_to('order-' || i, 'UTF8')), payment_id, created_at,
           now() + interval '30 days',
           CASE WHEN dead THEN NULL ELSE 200 END,
           CASE WHEN dead THEN NULL
                ELSE jsonb_build_object('id', payment_id, 'status', 'succeeded') END
    FROM ids
), audit AS (
    INSERT INTO payment_events (tenant_id, payment_id, seq, from_status, to_status, actor, reason,
                                created_at)
    SELECT ids.tenant_id, ids.payment_id, e.seq, e.from_status::payment_status,
           e.to_status::payment_status, e.actor, e.reason,
           COALESCE(ids.created_at + e.after, ids.finished_at)
    FROM ids
    JOIN (VALUES
        (1, NULL, 'pending', 'api', 'accepted', interval '0', NULL::boolean),
        (2, 'pending', 'processing', 'worker:bench', 'claimed for sending to the provider',
         interval '10 milliseconds', NULL),
        (3, 'processing', 'succeeded', 'worker:bench', 'the provider charged the payment', NULL, false),
        (3, 'processing', 'unknown', 'worker:bench', 'no response from the provider in time',
         interval '10 seconds', true),
        (4, 'unknown', 'dead_lettered', 'reconciler:poller',
         'no conclusive response from the provider after 30 lookups', NULL, true)
    ) AS e (seq, from_status, to_status, actor, reason, after, dead)
        ON e.dead IS NULL OR e.dead = ids.dead
), booked AS (
    INSERT INTO ledger_entries (tenant_id, payment_id, provider_charge_id, amount, currency, charged_at,
                                recorded_at)
    SELECT tenant_id, payment_id, provider_charge_id, amount, currency,
           updated_at - interval '100 milliseconds', updated_at
    FROM paid WHERE status = 'succeeded'
), notified AS (
    INSERT INTO webhook_events (tenant_id, webhook_id, event_type, payment_id, provider_charge_id, outcome,
                                received_at)
    SELECT tenant_id, 'msg_' || payment_id, 'charge.succeeded', payment_id, provider_charge_id,
           'already_terminal', updated_at + interval '1 second'
    FROM paid WHERE status = 'succeeded' AND updated_at > now() - make_interval(days => $7::integer)
), lettered AS (
    INSERT INTO dead_letters (tenant_id, payment_id, kind, reason, attempts, created_at)
    SELECT tenant_id, payment_id, 'unresolved',
           'no conclusive response from the provider after 30 lookups', 30, finished_at
    FROM ids WHERE dead
    ORDER BY finished_at
), looked_at AS (
    INSERT INTO operator_audit (at, operator_name, source, action, outcome, tenant_id, payment_id, detail)
    SELECT finished_at + interval '1 hour', 'operator-' || i % 5, '127.0.0.1', 'payment.read', 'done',
           tenant_id, payment_id, '{"customer_data": "shown", "via": "console"}'
    FROM ids WHERE dead
    ORDER BY finished_at
)
SELECT count(*) AS "loaded!" FROM paid
