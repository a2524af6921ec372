//! What operators see of customer data. A payment's own page shows it whole to operators and above,
//! and that read is recorded in the audit trail (`payment.read`); viewers see it masked there, and
//! every list masks it for everyone, so that customer data is only ever shown by a recorded read.
//!
//! Masked, a reference to the customer or their payment method keeps its first three characters
//! (`cus…`), enough to tell references apart; what was written about them (descriptions, metadata,
//! addresses, card details) is left out. The provider's own facts (ids, amounts, currencies,
//! statuses, times, keys) are never customer data and stay as they are.

use serde_json::Value;

/// Members of a provider's object, or of oncepay's own, that name the customer or their payment
/// method.
const REFERENCES: [&str; 4] = ["customer", "customer_id", "payment_method", "provider_customer"];

/// Members that hold what someone wrote about the customer, or the customer's own details.
const DETAILS: [&str; 6] =
    ["description", "metadata", "billing_details", "payment_method_details", "receipt_email", "shipping"];

/// Members that hold the customer's details when they are an object (a card, Stripe's `source`), and
/// something else when they are not (the evidence's own `source` says where it came from).
const DETAIL_OBJECTS: [&str; 2] = ["source", "card"];

/// What stands in place of a detail that is left out.
const LEFT_OUT: &str = "(masked)";

/// A reference, masked: its first three characters and an ellipsis.
pub fn reference(text: &str) -> String {
    let shown: String = text.chars().take(3).collect();
    format!("{shown}…")
}

/// `value` (evidence, a status change's detail) with every reference masked and every detail left
/// out, at any depth.
pub fn evidence(value: &Value) -> Value {
    match value {
        Value::Object(members) => Value::Object(
            members
                .iter()
                .map(|(name, member)| {
                    let name_is = |names: &[&str]| names.contains(&name.as_str());
                    let masked = match member {
                        Value::Null => Value::Null,
                        Value::String(text) if name_is(&REFERENCES) => Value::String(reference(text)),
                        _ if name_is(&DETAILS) => Value::String(LEFT_OUT.to_owned()),
                        // A reference the provider expanded into an object, as Stripe's `customer` can be.
                        Value::Object(_) if name_is(&REFERENCES) || name_is(&DETAIL_OBJECTS) => {
                            Value::String(LEFT_OUT.to_owned())
                        }
                        other => evidence(other),
                    };
                    (name.clone(), masked)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(evidence).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn references_keep_three_characters_and_details_are_left_out_at_any_depth() {
        let charge = json!({
            "id": "ch_1", "status": "succeeded", "amount": 1999, "currency": "EUR", "created": 1_700_000_000,
            "idempotency_key": "oncepay-1", "customer": "cus_secret", "payment_method": "pm_card_visa",
            "metadata": {"order": "o-1"}, "description": "a red bicycle", "receipt_email": null,
            "billing_details": {"name": "Ada", "address": {"city": "London"}},
        });
        let evidence_in = json!([{"source": "webhook", "charge": charge, "refunds": [{"id": "re_1", "metadata": {}}]}]);

        let masked = evidence(&evidence_in);

        let charge = &masked[0]["charge"];
        assert_eq!(charge["customer"], "cus…");
        assert_eq!(charge["payment_method"], "pm_…");
        assert_eq!(charge["metadata"], LEFT_OUT);
        assert_eq!(charge["description"], LEFT_OUT);
        assert_eq!(charge["billing_details"], LEFT_OUT);
        assert_eq!(charge["receipt_email"], Value::Null, "nothing to hide");
        for fact in ["id", "status", "amount", "currency", "created", "idempotency_key"] {
            assert_eq!(charge[fact], evidence_in[0]["charge"][fact], "{fact}");
        }
        assert_eq!(masked[0]["refunds"][0], json!({"id": "re_1", "metadata": LEFT_OUT}));
        assert_eq!(masked[0]["source"], "webhook", "the evidence's own `source` is a word, not a card");
    }

    #[test]
    fn an_expanded_customer_or_a_card_is_left_out_whole() {
        let masked =
            evidence(&json!({"customer": {"id": "cus_1", "email": "ada@example.com"}, "card": {"last4": "4242"}}));
        assert_eq!(masked, json!({"customer": LEFT_OUT, "card": LEFT_OUT}));
    }
}
