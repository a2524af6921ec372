-- A payment that may already have been charged, whose resend the provider refused without showing
-- the payment's own failed charge, becomes `unknown` instead of `failed`: the refusal alone does not
-- prove that the first send charged nothing. Its queue row keeps the refusal, so that the poller can
-- fail the payment with it once a consistent lookup finds no charge (what proves that no money
-- moved), instead of resending it to be refused again.
ALTER TABLE unknown_payments
    ADD COLUMN refused_code text CHECK (refused_code <> ''),
    ADD COLUMN refused_message text,
    ADD CONSTRAINT refusal_has_code_and_message CHECK ((refused_code IS NULL) = (refused_message IS NULL));
