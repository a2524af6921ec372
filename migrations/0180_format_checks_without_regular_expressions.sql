-- The CHECKs on the format of keys, currencies, payment methods and trace contexts no longer use
-- regular expressions. They refuse exactly what they refused before, for less CPU per row.
--
-- PostgreSQL evaluates a CHECK for every row written, and a regular expression match costs far more
-- than the string functions that say the same thing here: `^[!-~]{1,255}$` most of all, since its
-- bounded repetition makes the matcher build many states for every key it checks. Intake writes a
-- key, a payment and an outbox row per request, so these checks were a large part of what a grouped
-- accept costs PostgreSQL per payment (BENCHMARKS.md, issue 20).
--
-- Each format is now a length and a character set: `btrim(value, set) = ''` holds when every
-- character of the value is in the set (btrim strips them from both ends, so any other character
-- stops it). A character outside ASCII is in no set, so the byte lengths below are character
-- lengths. NULL passes, as it did. `store/tests/format_checks.rs` tries both forms on the same
-- values, allowed and refused.
--
-- The new constraints are added NOT VALID: every existing row already passed the one it replaces,
-- which refused the same values, so validating would prove nothing and would read each table under
-- the ACCESS EXCLUSIVE lock this ALTER takes, holding up intake meanwhile. New and updated rows are
-- checked all the same.
ALTER TABLE idempotency_keys
    DROP CONSTRAINT idempotency_keys_idempotency_key_check,
    ADD CONSTRAINT idempotency_keys_idempotency_key_check CHECK (
        octet_length(idempotency_key) BETWEEN 1 AND 255
        AND btrim(idempotency_key,
                  '!"#$%&''()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\]^_`abcdefghijklmnopqrstuvwxyz{|}~') = ''
    ) NOT VALID;

ALTER TABLE payments
    DROP CONSTRAINT payments_currency_check,
    ADD CONSTRAINT payments_currency_check CHECK (
        octet_length(currency) = 3 AND btrim(currency, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ') = ''
    ) NOT VALID,
    DROP CONSTRAINT payment_method_is_a_reference,
    ADD CONSTRAINT payment_method_is_a_reference CHECK (
        octet_length(payment_method) BETWEEN 1 AND 255
        AND btrim(payment_method, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_') = ''
    ) NOT VALID;

ALTER TABLE ledger_entries
    DROP CONSTRAINT ledger_entries_currency_check,
    ADD CONSTRAINT ledger_entries_currency_check CHECK (
        octet_length(currency) = 3 AND btrim(currency, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ') = ''
    ) NOT VALID;

-- A W3C traceparent, `00-<32 hex>-<16 hex>-<2 hex>`: 55 characters, three dashes, at 3, 36 and 53,
-- and lower-case hexadecimal digits everywhere else.
ALTER TABLE outbox
    DROP CONSTRAINT outbox_traceparent_check,
    ADD CONSTRAINT outbox_traceparent_check CHECK (
        octet_length(traceparent) = 55
        AND octet_length(replace(traceparent, '-', '')) = 52
        AND substr(traceparent, 3, 1) = '-' AND substr(traceparent, 36, 1) = '-' AND substr(traceparent, 53, 1) = '-'
        AND btrim(replace(traceparent, '-', ''), '0123456789abcdef') = ''
    ) NOT VALID;

ALTER TABLE unknown_payments
    DROP CONSTRAINT unknown_payments_traceparent_check,
    ADD CONSTRAINT unknown_payments_traceparent_check CHECK (
        octet_length(traceparent) = 55
        AND octet_length(replace(traceparent, '-', '')) = 52
        AND substr(traceparent, 3, 1) = '-' AND substr(traceparent, 36, 1) = '-' AND substr(traceparent, 53, 1) = '-'
        AND btrim(replace(traceparent, '-', ''), '0123456789abcdef') = ''
    ) NOT VALID;
