//! A refund intent: one refund the merchant wants of one payment, bound to one idempotency key.
//!
//! As for a [`PaymentIntent`](crate::PaymentIntent), the key, the payment and the serialised body
//! are fixed when the intent is built and an intent has no setters, so every send of it carries the
//! same key and bytes: the server can only ever see it as one refund. Only the key is checked here;
//! the server alone validates the body.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::intent::IdempotencyKey;
use crate::resource::{PaymentId, RefundReason};

/// One refund to make, with the key that makes sending it any number of times safe.
///
/// Built with [`RefundIntent::builder`]. Cloning keeps the key: a clone is the same intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundIntent {
    key: IdempotencyKey,
    payment_id: PaymentId,
    amount: Option<i64>,
    reason: Option<RefundReason>,
    metadata: BTreeMap<String, String>,
    body: String,
}

impl RefundIntent {
    /// Starts an intent to give money back from the succeeded payment `payment_id`: all that is
    /// left of it, unless [`amount`](RefundIntentBuilder::amount) says how much.
    pub fn builder(payment_id: PaymentId) -> RefundIntentBuilder {
        RefundIntentBuilder { payment_id, amount: None, reason: None, metadata: BTreeMap::new() }
    }

    /// The idempotency key every send of this intent carries.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The payment to give money back from.
    pub fn payment_id(&self) -> &PaymentId {
        &self.payment_id
    }

    /// Minor units to give back; `None` for all that is left.
    pub fn amount(&self) -> Option<i64> {
        self.amount
    }

    /// Why, if given.
    pub fn reason(&self) -> Option<RefundReason> {
        self.reason
    }

    /// The merchant's key/value pairs.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The JSON body, identical on every send.
    pub(crate) fn body(&self) -> &str {
        &self.body
    }
}

/// Collects a refund intent's optional fields; [`build`](Self::build) fixes its key.
#[derive(Debug, Clone)]
pub struct RefundIntentBuilder {
    payment_id: PaymentId,
    amount: Option<i64>,
    reason: Option<RefundReason>,
    metadata: BTreeMap<String, String>,
}

impl RefundIntentBuilder {
    /// How much to give back, in minor units of the payment's currency (at most what is left).
    pub fn amount(mut self, amount: i64) -> Self {
        self.amount = Some(amount);
        self
    }

    /// Why the money is given back.
    pub fn reason(mut self, reason: RefundReason) -> Self {
        self.reason = Some(reason);
        self
    }

    /// Adds one metadata pair (a later value for the same key replaces the earlier one).
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// The intent, under a new random key.
    pub fn build(self) -> RefundIntent {
        self.build_with_key(IdempotencyKey::generate())
    }

    /// The intent, under a key the caller kept from an earlier attempt. Sending it for another
    /// payment, or with another amount, reason or metadata than that attempt, gets
    /// `422 idempotency-key-reused`.
    pub fn build_with_key(self, key: IdempotencyKey) -> RefundIntent {
        let mut body = Map::new();
        if let Some(amount) = self.amount {
            body.insert("amount".into(), json!(amount));
        }
        if let Some(reason) = self.reason {
            body.insert("reason".into(), json!(reason));
        }
        if !self.metadata.is_empty() {
            body.insert("metadata".into(), json!(self.metadata));
        }
        RefundIntent {
            key,
            payment_id: self.payment_id,
            amount: self.amount,
            reason: self.reason,
            metadata: self.metadata,
            body: Value::Object(body).to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payment() -> PaymentId {
        "0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e7f".parse().unwrap()
    }

    #[test]
    fn the_body_has_only_the_fields_given_and_an_empty_one_refunds_everything_left() {
        let everything = RefundIntent::builder(payment()).build();
        let part = RefundIntent::builder(payment())
            .amount(500)
            .reason(RefundReason::RequestedByCustomer)
            .metadata("ticket", "T-1")
            .build();

        let everything: Value = serde_json::from_str(everything.body()).unwrap();
        let part: Value = serde_json::from_str(part.body()).unwrap();

        assert_eq!(everything, json!({}));
        assert_eq!(part, json!({"amount": 500, "reason": "requested_by_customer", "metadata": {"ticket": "T-1"}}));
    }

    #[test]
    fn a_clone_is_the_same_intent_and_a_rebuild_is_a_new_one() {
        let builder = RefundIntent::builder(payment()).amount(1);
        let intent = builder.clone().build();

        assert_eq!(intent.clone().key(), intent.key());
        assert_eq!(intent.clone().body(), intent.body());
        assert_ne!(builder.build().key(), intent.key());
    }

    #[test]
    fn a_supplied_key_is_used_as_is() {
        let key = IdempotencyKey::new("refund-A-17").unwrap();

        let intent = RefundIntent::builder(payment()).build_with_key(key.clone());

        assert_eq!(intent.key(), &key);
        assert_eq!(intent.payment_id(), &payment());
    }
}
