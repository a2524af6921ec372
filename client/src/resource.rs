//! The payment resource as the api shows it, and what a create returns.
//!
//! These mirror the contract's `GET /v1/payments/{id}` body and nothing more. Unknown members are
//! ignored, so the api can add fields without breaking embedded clients.

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

impl PaymentStatus {
    /// Whether the payment has reached its final state (`succeeded` or `failed`).
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

impl fmt::Display for PaymentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a payment failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// A stable machine-readable code, e.g. `card_declined`.
    pub code: String,
    /// A human-readable explanation.
    pub message: String,
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
    /// Why it failed, when `status` is `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
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
            "failure": {"code": "card_declined", "message": "The card was declined."},
        });

        let payment: Payment = serde_json::from_value(wire.clone()).unwrap();

        assert_eq!(payment.status, PaymentStatus::Failed);
        assert_eq!(payment.failure.as_ref().unwrap().code, "card_declined");
        assert_eq!(serde_json::to_value(&payment).unwrap(), wire);
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
        }
    }

    #[test]
    fn a_status_this_client_does_not_know_is_an_error_not_a_guess() {
        assert!(serde_json::from_value::<PaymentStatus>(json!("refunded")).is_err());
    }

    #[test]
    fn payment_ids_parse_from_uuids_only() {
        assert!("00000000-0000-0000-0000-000000000007".parse::<PaymentId>().is_ok());
        assert_eq!("../admin".parse::<PaymentId>(), Err(InvalidPaymentId));
    }
}
