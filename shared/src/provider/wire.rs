//! The provider protocol's JSON, shared by oncepay's client and the simulator so the two can never
//! drift apart.
//!
//! - `POST /v1/charges` (`Idempotency-Key` header, [`CreateCharge`] body) answers 201 [`Charge`];
//!   402 [`ErrorBody`] for a decline (with the declined charge's id); 409 while the same key is in
//!   flight; 422 when the key was used with other parameters.
//! - `GET /v1/charges/{id}` answers [`Charge`]; `GET /v1/charges?idempotency_key=K` and
//!   `GET /v1/charges?created_gte=&created_lt=&starting_after=&limit=` answer [`ChargePage`].
//! - Webhooks deliver [`WebhookEvent`]s, signed as in `crate::webhook_signature`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{PaymentId, TenantId};
use crate::provider::metadata_keys;

/// The body of `POST /v1/charges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateCharge {
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// The customer reference.
    pub customer: String,
    /// Free key/value pairs, echoed on the charge.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// Whether a charge took the money.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    /// The customer was charged.
    Succeeded,
    /// The charge was declined; no money moved.
    Failed,
}

/// A charge as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The provider's id, e.g. `ch_…`.
    pub id: String,
    /// Whether it took the money.
    pub status: ChargeStatus,
    /// Minor units actually charged (or attempted).
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// The customer reference.
    pub customer: String,
    /// The idempotency key it was created under.
    pub idempotency_key: String,
    /// Creation time, Unix seconds.
    pub created: i64,
    /// Echoed metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Decline code, when failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_code: Option<String>,
    /// Decline message, when failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
}

impl Charge {
    /// The oncepay payment this charge was made for, read from its metadata.
    pub fn payment_ref(&self) -> Option<(TenantId, PaymentId)> {
        let tenant = self.metadata.get(metadata_keys::TENANT_ID)?.parse().ok()?;
        let payment = self.metadata.get(metadata_keys::PAYMENT_ID)?.parse().ok()?;
        Some((tenant, payment))
    }
}

/// A list of charges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargePage {
    /// The charges, oldest first (ties broken by id).
    pub data: Vec<Charge>,
    /// Whether another page follows.
    pub has_more: bool,
}

/// The body of every provider error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The detail of a provider error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A stable code, e.g. `card_declined`, `idempotency_key_in_use`.
    pub code: String,
    /// For humans.
    pub message: String,
    /// For a decline: the id of the (failed) charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<String>,
}

/// Webhook event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventType {
    /// A charge took the money.
    #[serde(rename = "charge.succeeded")]
    ChargeSucceeded,
    /// A charge was declined.
    #[serde(rename = "charge.failed")]
    ChargeFailed,
}

/// One webhook delivery's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookEvent {
    /// What happened.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// When it happened, Unix seconds.
    pub created: i64,
    /// The charge it happened to, as it is now.
    pub data: Charge,
}
