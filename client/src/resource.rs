//! The payment and refund resources as the api shows them, and what a create returns.
//!
//! These mirror the bodies of `GET /v1/payments/{id}` and `GET /v1/refunds/{id}` and nothing more.
//! Unknown members are ignored, so the api can add fields without breaking embedded clients.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

/// A payment's id, as assigned by the api.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PaymentId(Uuid);

/// A string that is not a payment id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a payment id is a UUID, e.g. 0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e7f")]
pub struct InvalidPaymentId;

impl PaymentId {
    /// The id as a UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl From<Uuid> for PaymentId {
    fn from(uuid: Uuid) -> Self {
        Self(uuid)
    }
}

impl FromStr for PaymentId {
    type Err = InvalidPaymentId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s.trim()).map(Self).map_err(|_| InvalidPaymentId)
    }
}

impl fmt::Display for PaymentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A refund's id, as assigned by the api.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RefundId(Uuid);

/// A string that is not a refund id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a refund id is a UUID, e.g. 0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e7f")]
pub struct InvalidRefundId;

impl RefundId {
    /// The id as a UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl From<Uuid> for RefundId {
    fn from(uuid: Uuid) -> Self {
        Self(uuid)
    }
}

impl FromStr for RefundId {
    type Err = InvalidRefundId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s.trim()).map(Self).map_err(|_| InvalidRefundId)
    }
}

impl fmt::Display for RefundId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Where a payment stands. A status this client does not know is a decoding error, not a guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Accepted, waiting for a worker to send it to the provider.
    Pending,
    /// Being sent to the provider now.
    Processing,
    /// The customer was charged. Final.
    Succeeded,
    /// The provider declined, or the charge provably never happened. Final.
    Failed,
    /// The provider's response was lost; oncepay is finding out whether the charge happened
    /// (webhooks, polling). Not final, and it may take a while; a retry of the request cannot
    /// change it.
    Unknown,
    /// Automatic reconciliation gave up; an operator will settle it. Not final, and it may take
    /// hours.
    DeadLettered,
}

/// `is_terminal`, `as_str` and `Display` of a status with the six states a payment and a refund
/// share, `what` naming its kind in the docs.
macro_rules! six_states {
    ($status:ident, $what:literal) => {
        impl $status {
            #[doc = concat!("Whether the ", $what, " has reached its final state (`succeeded` or `failed`).")]
            pub const fn is_terminal(self) -> bool {
                matches!(self, Self::Succeeded | Self::Failed)
            }

            /// The name used on the wire.
            pub const fn as_str(self) -> &'static str {
                match self {
                    Self::Pending => "pending",
                    Self::Processing => "processing",
                    Self::Succeeded => "succeeded",
                    Self::Failed => "failed",
                    Self::Unknown => "unknown",
                    Self::DeadLettered => "dead_lettered",
                }
            }
        }

        impl fmt::Display for $status {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

six_states!(PaymentStatus, "payment");

/// Where a refund stands: a payment's states by name, each meaning what it means for money going
/// back. A status this client does not know is a decoding error, not a guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    /// Accepted, waiting for a worker to send it to the provider.
    Pending,
    /// Being sent to the provider now.
    Processing,
    /// The money went back to the customer. Final.
    Succeeded,
    /// The provider refused or failed the refund, or it provably never happened: no money went
    /// back. Final.
    Failed,
    /// The provider's response was lost; oncepay is finding out whether the money went back. Not
    /// final; a retry of the request cannot change it.
    Unknown,
    /// Automatic reconciliation gave up; an operator will settle it. Not final.
    DeadLettered,
}

six_states!(RefundStatus, "refund");

/// Why a payment failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// A stable machine-readable code, e.g. `card_declined`.
    pub code: String,
    /// A human-readable explanation.
    pub message: String,
}

/// Why a refund gives money back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundReason {
    /// The customer was charged twice for one thing.
    Duplicate,
    /// The charge was fraudulent.
    Fraudulent,
    /// The customer asked for the money back.
    RequestedByCustomer,
}

/// A string that is not a refund reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a refund reason is one of duplicate, fraudulent, requested_by_customer")]
pub struct InvalidRefundReason;

impl RefundReason {
    /// The name used on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::RequestedByCustomer => "requested_by_customer",
        }
    }
}

impl FromStr for RefundReason {
    type Err = InvalidRefundReason;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Self::Duplicate, Self::Fraudulent, Self::RequestedByCustomer]
            .into_iter()
            .find(|reason| reason.as_str() == s)
            .ok_or(InvalidRefundReason)
    }
}

impl fmt::Display for RefundReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A payment, as `GET /v1/payments/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// The payment's id.
    pub id: PaymentId,
    /// Where it stands; see [`PaymentStatus::is_terminal`].
    pub status: PaymentStatus,
    /// Minor units, as requested.
    pub amount: i64,
    /// ISO 4217 code, as requested.
    pub currency: String,
    /// The merchant's customer reference.
    pub customer_id: String,
    /// The merchant's free text, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The merchant's key/value pairs.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The provider's reference of the payment method to charge, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<String>,
    /// The provider's customer the payment method belongs to, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_customer: Option<String>,
    /// When oncepay accepted it.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When its status last changed.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// The provider's charge, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_charge_id: Option<String>,
    /// Minor units given back so far: the sum of the payment's succeeded refunds (0 from an api
    /// that predates refunds).
    #[serde(default)]
    pub amount_refunded: i64,
    /// Why it failed, when `status` is `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

/// A refund, as `GET /v1/refunds/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// The refund's id.
    pub id: RefundId,
    /// The payment it gives money back from.
    pub payment_id: PaymentId,
    /// Where it stands; `succeeded` and `failed` are final.
    pub status: RefundStatus,
    /// Minor units given back (or to be), in the payment's currency.
    pub amount: i64,
    /// ISO 4217 code: the payment's.
    pub currency: String,
    /// Why, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<RefundReason>,
    /// The merchant's key/value pairs.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// When oncepay accepted it.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When its status last changed.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// The provider's refund, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_refund_id: Option<String>,
    /// Why it failed, when `status` is `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

/// What [`Client::refund`](crate::Client::refund) got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedRefund {
    /// The refund as it stands now: `pending` for a first request, possibly further along (even
    /// final) for a replay.
    pub refund: Refund,
    /// `true` when the api had already accepted this key (`Idempotent-Replayed: true`): this or an
    /// earlier attempt created the refund, and no second one was made.
    pub replayed: bool,
}

/// What [`Client::create`](crate::Client::create) got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// The payment as it stands now: `pending` for a first request, possibly further along (even
    /// final) for a replay.
    pub payment: Payment,
    /// `true` when the api had already accepted this key (`Idempotent-Replayed: true`): this or an
    /// earlier attempt created the payment, and no second one was made.
    pub replayed: bool,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_contract_resource_reads_and_writes_back_unchanged() {
        let wire = json!({
            "id": "00000000-0000-0000-0000-000000000007",
            "status": "failed",
            "amount": 1999,
            "currency": "EUR",
            "customer_id": "cus_1",
            "metadata": {"order": "42"},
            "payment_method": "pm_card_chargeDeclined",
            "created_at": "2026-11-22T04:23:00.5Z",
            "updated_at": "2026-11-22T04:23:01Z",
            "provider_charge_id": "ch_1",
            "amount_refunded": 0,
            "failure": {"code": "card_declined", "message": "The card was declined."},
        });

        let payment: Payment = serde_json::from_value(wire.clone()).unwrap();

        assert_eq!(payment.status, PaymentStatus::Failed);
        assert_eq!(payment.failure.as_ref().unwrap().code, "card_declined");
        assert_eq!(serde_json::to_value(&payment).unwrap(), wire);
    }

    #[test]
    fn a_payment_from_an_api_without_refunds_has_nothing_refunded() {
        let wire = json!({
            "id": "00000000-0000-0000-0000-000000000007", "status": "succeeded", "amount": 1999,
            "currency": "EUR", "customer_id": "cus_1", "created_at": "2026-11-22T04:23:00.5Z",
            "updated_at": "2026-11-22T04:23:01Z",
        });

        let payment: Payment = serde_json::from_value(wire).unwrap();

        assert_eq!(payment.amount_refunded, 0);
    }

    #[test]
    fn the_contract_refund_reads_and_writes_back_unchanged() {
        let wire = json!({
            "id": "00000000-0000-0000-0000-000000000009",
            "payment_id": "00000000-0000-0000-0000-000000000007",
            "status": "succeeded",
            "amount": 500,
            "currency": "EUR",
            "reason": "requested_by_customer",
            "metadata": {"ticket": "T-1"},
            "created_at": "2026-11-22T04:23:00.5Z",
            "updated_at": "2026-11-22T04:23:01Z",
            "provider_refund_id": "re_1",
        });

        let refund: Refund = serde_json::from_value(wire.clone()).unwrap();

        assert_eq!(refund.reason, Some(RefundReason::RequestedByCustomer));
        assert_eq!(refund.payment_id.to_string(), "00000000-0000-0000-0000-000000000007");
        assert_eq!(serde_json::to_value(&refund).unwrap(), wire);
    }

    #[test]
    fn refund_reasons_read_back_from_their_names_and_nothing_else() {
        for reason in [RefundReason::Duplicate, RefundReason::Fraudulent, RefundReason::RequestedByCustomer] {
            assert_eq!(reason.as_str().parse::<RefundReason>(), Ok(reason));
            assert_eq!(serde_json::to_value(reason).unwrap(), json!(reason.as_str()));
        }
        assert_eq!("changed_my_mind".parse::<RefundReason>(), Err(InvalidRefundReason));
        assert_eq!("../admin".parse::<RefundId>(), Err(InvalidRefundId));
    }

    #[test]
    fn only_succeeded_and_failed_are_terminal() {
        let cases = [
            ("pending", false),
            ("processing", false),
            ("succeeded", true),
            ("failed", true),
            ("unknown", false),
            ("dead_lettered", false),
        ];
        for (wire, terminal) in cases {
            let status: PaymentStatus = serde_json::from_value(json!(wire)).unwrap();
            assert_eq!(status.as_str(), wire);
            assert_eq!(status.is_terminal(), terminal, "{wire}");
            let refund: RefundStatus = serde_json::from_value(json!(wire)).unwrap();
            assert_eq!(refund.as_str(), wire);
            assert_eq!(refund.is_terminal(), terminal, "a refund {wire}");
        }
    }

    #[test]
    fn a_status_this_client_does_not_know_is_an_error_not_a_guess() {
        assert!(serde_json::from_value::<PaymentStatus>(json!("refunded")).is_err());
        assert!(serde_json::from_value::<RefundStatus>(json!("refunded")).is_err());
    }

    #[test]
    fn payment_ids_parse_from_uuids_only() {
        assert!("00000000-0000-0000-0000-000000000007".parse::<PaymentId>().is_ok());
        assert_eq!("../admin".parse::<PaymentId>(), Err(InvalidPaymentId));
    }
}
