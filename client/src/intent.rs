//! A payment intent: one payment the merchant wants, bound to one idempotency key.
//!
//! The key and the serialised body are fixed when the intent is built, and an intent has no
//! setters, so every send of it (every retry, every clone) carries the same key and bytes: the
//! server can only ever see it as one request. Only the key is checked here; the server alone
//! validates the body.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value, json};
use uuid::Uuid;

/// An `Idempotency-Key` value: 1 to 255 characters of visible ASCII, sent in its bare form.
///
/// Not a secret: it is the handle a caller keeps to retry a payment safely, so it may be shown.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a string cannot be an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidIdempotencyKey {
    /// No characters.
    #[error("an idempotency key must not be empty")]
    Empty,
    /// Longer than [`IdempotencyKey::MAX_LEN`].
    #[error("an idempotency key must be at most {max} characters, got {len}", max = IdempotencyKey::MAX_LEN)]
    TooLong {
        /// The length given.
        len: usize,
    },
    /// A space, a control character or anything outside ASCII.
    #[error("an idempotency key must be visible ASCII (no spaces); character {position} is not")]
    NotVisibleAscii {
        /// Zero-based position of the first offending character.
        position: usize,
    },
}

impl IdempotencyKey {
    /// The longest key the api accepts.
    pub const MAX_LEN: usize = 255;

    /// A new random key (a UUIDv4).
    pub fn generate() -> Self {
        Self(Uuid::new_v4().to_string())
    }

    /// A key the caller chose, e.g. the one printed by an earlier attempt.
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidIdempotencyKey> {
        let key = key.into();
        if key.is_empty() {
            return Err(InvalidIdempotencyKey::Empty);
        }
        if let Some(position) = key.chars().position(|c| !c.is_ascii_graphic()) {
            return Err(InvalidIdempotencyKey::NotVisibleAscii { position });
        }
        // All ASCII from here, so bytes and characters count the same.
        if key.len() > Self::MAX_LEN {
            return Err(InvalidIdempotencyKey::TooLong { len: key.len() });
        }
        Ok(Self(key))
    }

    /// The key as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for IdempotencyKey {
    type Err = InvalidIdempotencyKey;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// One payment to make, with the key that makes sending it any number of times safe.
///
/// Built with [`PaymentIntent::builder`]. Cloning keeps the key: a clone is the same intent. To
/// pay for something else, build a new intent, which gets a new key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentIntent {
    key: IdempotencyKey,
    amount: i64,
    currency: String,
    customer_id: String,
    description: Option<String>,
    metadata: BTreeMap<String, String>,
    payment_method: Option<String>,
    provider_customer: Option<String>,
    body: String,
}

impl PaymentIntent {
    /// Starts an intent to charge `amount` minor units of `currency` (ISO 4217, e.g. `EUR`) to the
    /// merchant's `customer_id`.
    pub fn builder(amount: i64, currency: impl Into<String>, customer_id: impl Into<String>) -> PaymentIntentBuilder {
        PaymentIntentBuilder {
            amount,
            currency: currency.into(),
            customer_id: customer_id.into(),
            description: None,
            metadata: BTreeMap::new(),
            payment_method: None,
            provider_customer: None,
        }
    }

    /// The idempotency key every send of this intent carries.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// Minor units to charge.
    pub fn amount(&self) -> i64 {
        self.amount
    }

    /// ISO 4217 currency code.
    pub fn currency(&self) -> &str {
        &self.currency
    }

    /// The merchant's customer reference.
    pub fn customer_id(&self) -> &str {
        &self.customer_id
    }

    /// The merchant's free text, if any.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    /// The merchant's key/value pairs.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The provider's reference of the payment method to charge, if any.
    pub fn payment_method(&self) -> Option<&str> {
        self.payment_method.as_deref()
    }

    /// The provider's customer the payment method belongs to, if any.
    pub fn provider_customer(&self) -> Option<&str> {
        self.provider_customer.as_deref()
    }

    /// The JSON body, identical on every send.
    pub(crate) fn body(&self) -> &str {
        &self.body
    }
}

/// Collects an intent's optional fields; [`build`](Self::build) fixes its key.
///
/// Nothing here checks the fields: the server does, so the client cannot disagree with it about
/// what is valid.
#[derive(Debug, Clone)]
pub struct PaymentIntentBuilder {
    amount: i64,
    currency: String,
    customer_id: String,
    description: Option<String>,
    metadata: BTreeMap<String, String>,
    payment_method: Option<String>,
    provider_customer: Option<String>,
}

impl PaymentIntentBuilder {
    /// Free text shown with the payment.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Adds one metadata pair (a later value for the same key replaces the earlier one).
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// The payment method the provider is to charge: its reference at the provider, e.g. Stripe's
    /// `pm_card_visa`, passed on unchanged (the api accepts ASCII letters, digits and `_`).
    pub fn payment_method(mut self, reference: impl Into<String>) -> Self {
        self.payment_method = Some(reference.into());
        self
    }

    /// The provider's customer that the payment method belongs to, e.g. Stripe's `cus_…`, for a
    /// payment method saved to a customer. Never the merchant's `customer_id`.
    pub fn provider_customer(mut self, reference: impl Into<String>) -> Self {
        self.provider_customer = Some(reference.into());
        self
    }

    /// The intent, under a new random key.
    pub fn build(self) -> PaymentIntent {
        self.build_with_key(IdempotencyKey::generate())
    }

    /// The intent, under a key the caller kept from an earlier attempt. Sending it with a
    /// different amount, currency, customer, description, metadata, payment method or provider
    /// customer than that attempt gets `422 idempotency-key-reused`.
    pub fn build_with_key(self, key: IdempotencyKey) -> PaymentIntent {
        let mut body = Map::new();
        body.insert("amount".into(), json!(self.amount));
        body.insert("currency".into(), json!(self.currency));
        body.insert("customer_id".into(), json!(self.customer_id));
        if let Some(description) = &self.description {
            body.insert("description".into(), json!(description));
        }
        if !self.metadata.is_empty() {
            body.insert("metadata".into(), json!(self.metadata));
        }
        if let Some(payment_method) = &self.payment_method {
            body.insert("payment_method".into(), json!(payment_method));
        }
        if let Some(provider_customer) = &self.provider_customer {
            body.insert("provider_customer".into(), json!(provider_customer));
        }
        PaymentIntent {
            key,
            amount: self.amount,
            currency: self.currency,
            customer_id: self.customer_id,
            description: self.description,
            metadata: self.metadata,
            payment_method: self.payment_method,
            provider_customer: self.provider_customer,
            body: Value::Object(body).to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_like_the_api_checks_them() {
        let long = "k".repeat(256);
        let cases: [(&str, Result<(), InvalidIdempotencyKey>); 6] = [
            ("abc-123", Ok(())),
            ("\"abc-123\"", Ok(())),
            ("", Err(InvalidIdempotencyKey::Empty)),
            ("a b", Err(InvalidIdempotencyKey::NotVisibleAscii { position: 1 })),
            ("ké", Err(InvalidIdempotencyKey::NotVisibleAscii { position: 1 })),
            (&long, Err(InvalidIdempotencyKey::TooLong { len: 256 })),
        ];
        for (input, expected) in cases {
            assert_eq!(IdempotencyKey::new(input).map(|_| ()), expected, "{input:?}");
        }
        assert!(IdempotencyKey::new("k".repeat(255)).is_ok());
    }

    #[test]
    fn a_generated_key_is_a_valid_uuid_v4_and_differs_each_time() {
        let (a, b) = (IdempotencyKey::generate(), IdempotencyKey::generate());

        assert_ne!(a, b);
        assert_eq!(Uuid::parse_str(a.as_str()).unwrap().get_version_num(), 4);
        assert!(IdempotencyKey::new(a.as_str()).is_ok());
    }

    #[test]
    fn the_body_has_only_the_fields_given() {
        let bare = PaymentIntent::builder(1999, "EUR", "cus_42").build();
        let full = PaymentIntent::builder(1999, "EUR", "cus_42")
            .description("two coffees")
            .metadata("order", "A-17")
            .metadata("till", "3")
            .payment_method("pm_card_visa")
            .provider_customer("cus_Q1")
            .build();

        let bare: Value = serde_json::from_str(bare.body()).unwrap();
        let full: Value = serde_json::from_str(full.body()).unwrap();

        assert_eq!(bare, json!({"amount": 1999, "currency": "EUR", "customer_id": "cus_42"}));
        assert_eq!(
            full,
            json!({
                "amount": 1999, "currency": "EUR", "customer_id": "cus_42", "description": "two coffees",
                "metadata": {"order": "A-17", "till": "3"}, "payment_method": "pm_card_visa",
                "provider_customer": "cus_Q1",
            })
        );
    }

    #[test]
    fn a_clone_is_the_same_intent_and_a_rebuild_is_a_new_one() {
        let builder = PaymentIntent::builder(500, "USD", "cus_1");
        let intent = builder.clone().build();

        assert_eq!(intent.clone().key(), intent.key());
        assert_eq!(intent.clone().body(), intent.body());
        assert_ne!(builder.build().key(), intent.key());
    }

    #[test]
    fn a_supplied_key_is_used_as_is() {
        let key = IdempotencyKey::new("order-A-17").unwrap();

        let intent = PaymentIntent::builder(500, "USD", "cus_1").build_with_key(key.clone());

        assert_eq!(intent.key(), &key);
    }
}
