-- What each inconclusive lookup of an `unknown` refund found, as for payments
-- (`unknown_payments.evidence`): kept since the refund last became `unknown`, and carried into the
-- audit row that dead-letters it, so an operator sees every lookup, not only the last.
ALTER TABLE refunds ADD COLUMN lookup_evidence jsonb NOT NULL DEFAULT '[]'
    CHECK (jsonb_typeof(lookup_evidence) = 'array');
