-- Who made each credential an operator acts with (README, "Operators", four eyes). Whoever issues
-- a token or sets a password can act with it, so an approval is refused when the approver's
-- credential was made by the proposer, or the proposer's by the approver: one person would
-- otherwise stand behind both sides of a decision. A token or password an operator made for
-- themselves, and a sign-in at the OpenID provider, are their own.
ALTER TABLE operator_tokens ADD COLUMN issued_by uuid REFERENCES operators (operator_id);
ALTER TABLE operators ADD COLUMN password_set_by uuid REFERENCES operators (operator_id);
ALTER TABLE operator_sessions ADD COLUMN credential_by uuid REFERENCES operators (operator_id);
ALTER TABLE proposals ADD COLUMN proposer_credential_by uuid REFERENCES operators (operator_id);
