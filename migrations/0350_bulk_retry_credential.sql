-- A bulk retry remembers who made the credential its operator confirmed it with (README,
-- "Operators", four eyes). The reconciler works the job later, as that operator; a resend it proposes
-- must carry the same maker as one the operator proposed by hand, or an admin who issued the
-- operator's token could approve it. NULL: a job written before this migration, or confirmed with a
-- credential the operator made themself.
ALTER TABLE bulk_retries ADD COLUMN credential_by uuid REFERENCES operators (operator_id);
