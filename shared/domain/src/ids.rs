//! Typed identifiers: tenants, payments, refunds, and the downstream idempotency key derived from a
//! payment or a refund.
//! They are UUIDs on the wire and in PostgreSQL.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The tenant (one customer of oncepay) that owns a payment, a key or an API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(transparent))]
#[serde(transparent)]
pub struct TenantId(Uuid);

impl TenantId {
    /// A fresh random tenant id.
    pub fn generate() -> Self {
        Self(Uuid::new_v4())
    }

    /// Wraps a UUID read from a trusted source (the database, a verified API key).
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The underlying UUID, for binding to queries.
    pub const fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for TenantId {
    type Err = uuid::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
    }
}

/// A payment's id: what `Location: /v1/payments/{id}` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(transparent))]
#[serde(transparent)]
#[schema(value_type = String, format = Uuid)]
pub struct PaymentId(Uuid);

impl PaymentId {
    /// A fresh, time-ordered payment id (UUIDv7), so new rows land at the right-hand end of the
    /// primary-key index.
    pub fn generate() -> Self {
        Self(Uuid::now_v7())
    }

    /// Wraps a UUID read from a trusted source (the database, the provider's metadata).
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The underlying UUID, for binding to queries.
    pub const fn as_uuid(&self) -> Uuid {
        self.0
    }

    /// The idempotency key under which this payment is sent to the provider, on every attempt.
    ///
    /// Derived from the payment id alone, never from the client's `Idempotency-Key`, so two tenants
    /// never collide at the provider and every resend of one payment carries the same key.
    pub fn downstream_key(&self) -> DownstreamKey {
        DownstreamKey(format!("{}{}", DownstreamKey::PREFIX, self.0))
    }
}

impl fmt::Display for PaymentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for PaymentId {
    type Err = uuid::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
    }
}

/// A refund's id: what `Location: /v1/refunds/{id}` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(transparent))]
#[serde(transparent)]
#[schema(value_type = String, format = Uuid)]
pub struct RefundId(Uuid);

impl RefundId {
    /// A fresh, time-ordered refund id (UUIDv7).
    pub fn generate() -> Self {
        Self(Uuid::now_v7())
    }

    /// Wraps a UUID read from a trusted source (the database, the provider's metadata).
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The underlying UUID, for binding to queries.
    pub const fn as_uuid(&self) -> Uuid {
        self.0
    }

    /// The idempotency key under which this refund is sent to the provider, on every attempt:
    /// derived from the refund id alone, as a payment's is from the payment id.
    pub fn downstream_key(&self) -> DownstreamKey {
        DownstreamKey(format!("{}{}", DownstreamKey::REFUND_PREFIX, self.0))
    }
}

impl fmt::Display for RefundId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for RefundId {
    type Err = uuid::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
    }
}

/// The `Idempotency-Key` oncepay sends to the provider for one payment (`oncepay-<payment id>`) or
/// one refund (`oncepay-refund-<refund id>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DownstreamKey(String);

impl DownstreamKey {
    const PREFIX: &'static str = "oncepay-";
    const REFUND_PREFIX: &'static str = "oncepay-refund-";

    /// The key as sent on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The payment a downstream key was derived from, if it is one of ours.
    pub fn payment_id(&self) -> Option<PaymentId> {
        Self::parse_payment_id(&self.0)
    }

    /// The payment id inside a key seen on the wire (a webhook, a provider listing), if it is ours.
    pub fn parse_payment_id(key: &str) -> Option<PaymentId> {
        key.strip_prefix(Self::PREFIX).and_then(|rest| Uuid::parse_str(rest).ok()).map(PaymentId)
    }

    /// The refund a downstream key was derived from, if it is one of ours.
    pub fn refund_id(&self) -> Option<RefundId> {
        Self::parse_refund_id(&self.0)
    }

    /// The refund id inside a key seen on the wire, if it is ours.
    pub fn parse_refund_id(key: &str) -> Option<RefundId> {
        key.strip_prefix(Self::REFUND_PREFIX).and_then(|rest| Uuid::parse_str(rest).ok()).map(RefundId)
    }
}

impl fmt::Display for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_downstream_key_is_stable_and_names_its_payment() {
        let payment = PaymentId::generate();

        let first = payment.downstream_key();
        let again = payment.downstream_key();

        assert_eq!(first, again);
        assert!(first.as_str().starts_with("oncepay-"));
        assert_eq!(first.payment_id(), Some(payment));
    }

    #[test]
    fn keys_that_are_not_ours_name_no_payment() {
        for foreign in ["", "oncepay-", "oncepay-not-a-uuid", "stripe-123", "0190c1f2-aaaa-7bbb-8ccc-123456789abc"] {
            assert_eq!(DownstreamKey::parse_payment_id(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn a_refunds_downstream_key_is_stable_names_its_refund_and_no_payment() {
        let refund = RefundId::generate();

        let key = refund.downstream_key();

        assert_eq!(key, refund.downstream_key());
        assert!(key.as_str().starts_with("oncepay-refund-"), "{key}");
        assert_eq!(key.refund_id(), Some(refund));
        assert_eq!(key.payment_id(), None);
        assert_eq!(PaymentId::from_uuid(refund.as_uuid()).downstream_key().refund_id(), None);
    }

    #[test]
    fn payment_ids_are_time_ordered() {
        let earlier = PaymentId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let later = PaymentId::generate();

        assert!(earlier < later);
    }
}
