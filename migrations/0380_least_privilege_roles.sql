-- Each process connects as a role of its own that may do only what that process does (README,
-- "Database roles"). The role that runs the migrations owns every table; no process role owns
-- anything, so none can alter a table, disable its triggers or grant itself more.
--
--   oncepay_api         takes payments and refunds: reads tenants and their keys, writes the
--                       intake rows, and reserves a refund's amount on its payment. No operator
--                       table, no provider outcome.
--   oncepay_worker      sends: claims outbox rows, records the provider's answers and settles.
--                       No operator table.
--   oncepay_reconciler  settles what is left, reaps, reconciles, and serves the operators. The
--                       operators' audit trail is INSERT and SELECT only: not even this role
--                       changes or removes a row (and the table's triggers refuse it to its owner).
--
-- The roles may sign in but have no password: a deployment gives each one (`ALTER ROLE … PASSWORD`)
-- or lets a login role of its own inherit it (`GRANT oncepay_api TO …`). Roles belong to the whole
-- PostgreSQL cluster, so a role that already exists (another database of the cluster made it) is
-- kept as it is. Two databases migrating at once may both find it missing: the second waits for
-- the first and is then told it exists, which is taken as done.
DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['oncepay_api', 'oncepay_worker', 'oncepay_reconciler'] LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %I LOGIN', role_name);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END LOOP;
END
$$;

-- Nobody but the tables' owner creates anything in the schema (PostgreSQL 15 already has it so).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO oncepay_api, oncepay_worker, oncepay_reconciler;

-- `/readyz` compares the applied migrations with the binary's.
GRANT SELECT ON _sqlx_migrations TO oncepay_api, oncepay_worker, oncepay_reconciler;

-- The api: intake and reads. Of a payment it changes only the refund reservation (a refund's
-- intake locks the payment and adds to it).
GRANT SELECT ON tenants, api_keys TO oncepay_api;
GRANT SELECT, INSERT, UPDATE ON idempotency_keys TO oncepay_api;
GRANT SELECT, INSERT ON payments, payment_events, outbox TO oncepay_api;
GRANT UPDATE (refunds_reserved) ON payments TO oncepay_api;
GRANT SELECT, INSERT ON refunds, refund_keys, refund_events, refund_outbox TO oncepay_api;

-- The worker: the send protocol for payments and refunds, and the recording of what came back.
GRANT SELECT ON tenants TO oncepay_worker;
GRANT SELECT, UPDATE ON payments, idempotency_keys, refunds, refund_keys TO oncepay_worker;
GRANT SELECT, INSERT ON payment_events, ledger_entries, refund_events, refund_ledger_entries TO oncepay_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox, refund_outbox TO oncepay_worker;
GRANT SELECT, INSERT, UPDATE ON unknown_payments TO oncepay_worker;

-- The reconciler: every table but the audit trail, which it only appends to and reads.
GRANT SELECT, INSERT, UPDATE, DELETE ON
    tenants, api_keys, idempotency_keys, payments, payment_events, outbox, ledger_entries,
    unknown_payments, dead_letters, webhook_events,
    refunds, refund_keys, refund_events, refund_outbox, refund_ledger_entries, refund_dead_letters,
    recon_runs, recon_discrepancies, recon_unfinished_charges, recon_unfinished_refunds,
    operators, operator_sessions, operator_tokens, oidc_sign_ins, operator_enrollments, sign_in_limits,
    proposals, bulk_retries, bulk_retry_items
    TO oncepay_reconciler;
GRANT SELECT, INSERT ON operator_audit TO oncepay_reconciler;
