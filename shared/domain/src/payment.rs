//! The payment resource clients see: the body of every 200 and 202 response, and of the terminal
//! response stored on the idempotency key. One `From` impl in `oncepay_store::payments` renders both
//! from the stored row, so a replay and a poll always agree on a payment's shape.

use std::collections::BTreeMap;

use serde::Serialize;
use time::OffsetDateTime;

use crate::ids::PaymentId;
use crate::money::{Amount, Currency};
use crate::status::PaymentStatus;

/// Why a payment failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Failure {
    /// A stable machine-readable code: the provider's decline code (e.g. `card_declined`), or one of
    /// oncepay's own (`provider_unreachable`, `provider_rejected`, `resolved_by_operator`).
    pub code: String,
    /// A human-readable explanation.
    pub message: String,
}

/// The public form of a payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct PaymentResource {
    /// The payment's id.
    pub id: PaymentId,
    /// Where it stands; `succeeded` and `failed` are final.
    pub status: PaymentStatus,
    /// Minor units, as requested.
    #[schema(value_type = i64)]
    pub amount: Amount,
    /// ISO 4217 code, as requested.
    #[schema(value_type = String, example = "EUR")]
    pub currency: Currency,
    /// As requested.
    pub customer_id: String,
    /// As requested, if given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// As requested (empty if none were given).
    pub metadata: BTreeMap<String, String>,
    /// The provider's reference of the payment method to charge, as requested, if given.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "pm_card_visa")]
    pub payment_method: Option<String>,
    /// The provider's customer the payment method belongs to, as requested, if given.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "cus_NffrFeUfNV2Hib")]
    pub provider_customer: Option<String>,
    /// When oncepay accepted the payment (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When its status last changed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// The provider's charge id, once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_charge_id: Option<String>,
    /// Minor units given back to the customer so far: the sum of the payment's succeeded refunds.
    pub amount_refunded: i64,
    /// Why it failed, when `status` is `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}
