//! Refunds: the body of `POST /v1/payments/{id}/refunds`, checked field by field, and the refund
//! resource clients see.
//!
//! A refund moves through states of its own ([`RefundStatus`] and [`crate::refund_status::next`]):
//! `pending → processing → succeeded | failed`, `unknown` when the provider's answer is uncertain,
//! `dead_lettered` when automation gives up.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;

use crate::ids::{PaymentId, RefundId};
use crate::money::Amount;
use crate::payment::Failure;
use crate::payment_request::{FieldError, note, optional, parse_amount, parse_metadata, type_name};
use crate::refund_status::RefundStatus;

/// Why the merchant gives the money back, in the words Stripe accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefundReason {
    /// The customer was charged twice for one thing.
    Duplicate,
    /// The charge was fraudulent.
    Fraudulent,
    /// The customer asked for the money back.
    RequestedByCustomer,
}

impl RefundReason {
    /// Every reason, in declaration order.
    pub const ALL: [Self; 3] = [Self::Duplicate, Self::Fraudulent, Self::RequestedByCustomer];

    /// The name on the wire, in PostgreSQL and at the provider.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::RequestedByCustomer => "requested_by_customer",
        }
    }

    /// The reason named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|reason| reason.as_str() == name)
    }
}

/// A validated refund request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundRequest {
    /// How much to give back, in the payment's minor units; `None` gives back all that is left.
    pub amount: Option<Amount>,
    /// Why, if the merchant says.
    pub reason: Option<RefundReason>,
    /// The merchant's own key/value pairs, returned as given.
    pub metadata: BTreeMap<String, String>,
}

const KNOWN_FIELDS: [&str; 3] = ["amount", "reason", "metadata"];

impl RefundRequest {
    /// Validates a parsed JSON body, reporting every invalid field at once. Unknown fields are
    /// errors, as for payments.
    pub fn from_json(body: &Value) -> Result<Self, Vec<FieldError>> {
        let Some(object) = body.as_object() else {
            return Err(vec![FieldError::new("(body)", "must be a JSON object")]);
        };
        let mut errors: Vec<FieldError> = object
            .keys()
            .filter(|k| !KNOWN_FIELDS.contains(&k.as_str()))
            .map(|k| FieldError::new(k.as_str(), "is not a known field"))
            .collect();
        let amount = optional(object, "amount")
            .map(|v| note(parse_amount(v), "amount", &mut errors).map(Some))
            .unwrap_or(Some(None));
        let reason = optional(object, "reason")
            .map(|v| note(parse_reason(v), "reason", &mut errors).map(Some))
            .unwrap_or(Some(None));
        let metadata = optional(object, "metadata")
            .map(|v| parse_metadata(v, &mut errors))
            .unwrap_or_else(|| Some(BTreeMap::new()));
        match (amount, reason, metadata) {
            (Some(amount), Some(reason), Some(metadata)) if errors.is_empty() => Ok(Self { amount, reason, metadata }),
            _ => Err(errors),
        }
    }
}

fn parse_reason(value: &Value) -> Result<RefundReason, String> {
    let expected = || {
        let names: Vec<&str> = RefundReason::ALL.iter().map(|reason| reason.as_str()).collect();
        format!("must be one of {}", names.join(", "))
    };
    match value {
        Value::String(name) => RefundReason::parse(name).ok_or_else(expected),
        other => Err(format!("{}, got {}", expected(), type_name(other))),
    }
}

/// The public form of a refund: the body of every refund response, and of the terminal response
/// stored on its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RefundResource {
    /// The refund's id.
    pub id: RefundId,
    /// The payment it gives money back from.
    pub payment_id: PaymentId,
    /// Where it stands; `succeeded` and `failed` are final.
    pub status: RefundStatus,
    /// Minor units given back (or to be), in the payment's currency.
    pub amount: i64,
    /// ISO 4217 code: the payment's.
    #[schema(example = "EUR")]
    pub currency: String,
    /// Why, if the merchant said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<RefundReason>,
    /// As requested (empty if none were given).
    pub metadata: BTreeMap<String, String>,
    /// When oncepay accepted the refund (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When its status last changed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// The provider's refund id, once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_refund_id: Option<String>,
    /// Why it failed, when `status` is `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_empty_body_refunds_everything_that_is_left() {
        let request = RefundRequest::from_json(&json!({})).unwrap();
        assert_eq!(request, RefundRequest { amount: None, reason: None, metadata: BTreeMap::new() });
        assert_eq!(RefundRequest::from_json(&json!({"amount": null, "reason": null})).unwrap(), request);
    }

    #[test]
    fn a_full_body_is_read_as_given() {
        let request = RefundRequest::from_json(
            &json!({"amount": 250, "reason": "requested_by_customer", "metadata": {"ticket": "T-1"}}),
        )
        .unwrap();
        assert_eq!(request.amount.map(|a| a.minor_units()), Some(250));
        assert_eq!(request.reason, Some(RefundReason::RequestedByCustomer));
        assert_eq!(request.metadata.get("ticket").map(String::as_str), Some("T-1"));
    }

    #[test]
    fn every_wrong_field_is_named() {
        let errors = RefundRequest::from_json(
            &json!({"amount": 0, "reason": "changed_my_mind", "metadata": {"k": 1}, "currency": "EUR"}),
        )
        .unwrap_err();
        let mut fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        fields.sort_unstable();
        assert_eq!(fields, ["amount", "currency", "metadata.k", "reason"], "{errors:?}");
        let reason = errors.iter().find(|e| e.field == "reason").unwrap();
        assert!(reason.message.contains("requested_by_customer"), "{}", reason.message);
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused() {
        for body in [json!([]), json!("refund"), json!(12)] {
            assert_eq!(RefundRequest::from_json(&body).unwrap_err()[0].field, "(body)");
        }
    }

    #[test]
    fn reasons_read_back_from_their_names() {
        for reason in RefundReason::ALL {
            assert_eq!(RefundReason::parse(reason.as_str()), Some(reason));
            assert_eq!(serde_json::to_value(reason).unwrap(), json!(reason.as_str()));
        }
        assert_eq!(RefundReason::parse("Duplicate"), None);
    }
}
