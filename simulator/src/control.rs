//! The JSON of the simulator's control endpoints (`/_sim/*`), shared by the server and by
//! [`crate::client::SimulatorClient`] so tests and simulator cannot drift apart.
//!
//! - `GET /_sim/charges` → [`GroundTruth`]; `POST /_sim/charges` [`PlantCharge`] → 201 `Charge`.
//! - `GET /_sim/refunds` → [`RefundTruth`].
//! - `GET /_sim/faults` → `Faults`; `POST /_sim/faults` `FaultsPatch` → `Faults`.
//! - `POST /_sim/keys/expire` → [`ExpiredKeys`].
//! - `GET /_sim/webhook` → [`WebhookTarget`]; `POST /_sim/webhook` [`WebhookTarget`] → the same.
//!
//! These are types only; the protocol's own JSON lives in `oncepay_provider::wire`.

use std::collections::BTreeMap;

use oncepay_provider::wire::{Charge, ChargeStatus, Refund, RefundState};
use serde::{Deserialize, Serialize};

/// Everything the simulator ever charged, and every key it was asked with: the ground truth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroundTruth {
    /// Every charge, failed and planted ones included, in the order they were made.
    pub charges: Vec<Charge>,
    /// Every idempotency key seen on a charge POST or on a charge, sorted by key.
    pub keys: Vec<KeyRecord>,
}

/// What happened under one idempotency key, over the simulator's whole life (windows do not apply).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The key.
    pub idempotency_key: String,
    /// Authenticated, well-formed `POST /v1/charges` requests that carried it, whatever their
    /// response (replays, 409, 422 and injected faults included).
    pub posts: u64,
    /// The ids of the charges made under it, oldest first.
    pub charges: Vec<String>,
}

impl GroundTruth {
    /// The charges made under `key`.
    pub fn charges_with_key(&self, key: &str) -> Vec<&Charge> {
        self.charges.iter().filter(|c| c.idempotency_key == key).collect()
    }

    /// How many charge POSTs carried `key`.
    pub fn posts_with_key(&self, key: &str) -> u64 {
        self.keys.iter().find(|k| k.idempotency_key == key).map_or(0, |k| k.posts)
    }
}

/// Everything the simulator ever refunded (or failed to), and every key it was asked with: the
/// ground truth of refunds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundTruth {
    /// Every refund, failed ones included, in the order they were made.
    pub refunds: Vec<Refund>,
    /// Every idempotency key seen on a refund POST or on a refund, sorted by key.
    pub keys: Vec<RefundKeyRecord>,
}

/// What happened under one refund idempotency key, over the simulator's whole life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundKeyRecord {
    /// The key.
    pub idempotency_key: String,
    /// Authenticated, well-formed `POST /v1/refunds` requests that carried it, whatever their
    /// response (replays, refusals, 409, 422 and injected faults included).
    pub posts: u64,
    /// The ids of the refunds made under it, oldest first.
    pub refunds: Vec<String>,
}

impl RefundTruth {
    /// The refunds made under `key`.
    pub fn refunds_with_key(&self, key: &str) -> Vec<&Refund> {
        self.refunds.iter().filter(|r| r.idempotency_key.as_deref() == Some(key)).collect()
    }

    /// How many refund POSTs carried `key`.
    pub fn posts_with_key(&self, key: &str) -> u64 {
        self.keys.iter().find(|k| k.idempotency_key == key).map_or(0, |k| k.posts)
    }

    /// The refunds of `charge`.
    pub fn refunds_of(&self, charge: &str) -> Vec<&Refund> {
        self.refunds.iter().filter(|r| r.charge == charge).collect()
    }

    /// How much of `charge` its refunds give back or may still give back (every one that neither
    /// failed nor was canceled), in minor units: never more than the charge.
    pub fn refunded(&self, charge: &str) -> i64 {
        self.refunds_of(charge)
            .into_iter()
            .filter(|r| !matches!(r.status, RefundState::Failed | RefundState::Canceled))
            .map(|r| r.amount)
            .sum()
    }
}

/// A charge to put in the ledger directly, as if the provider had made it (`POST /_sim/charges`),
/// for reconciliation tests. It fires the webhook its outcome would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlantCharge {
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// The customer reference.
    #[serde(default = "default_customer")]
    pub customer: String,
    /// Metadata, e.g. the oncepay payment it claims to be for.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The key it is filed under; none draws a fresh `planted_…` key. Planting does not make the
    /// key remembered: a later POST with it creates another charge.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Succeeded (default) or failed.
    #[serde(default = "default_status")]
    pub status: ChargeStatus,
    /// Creation time in Unix seconds; none means now.
    #[serde(default)]
    pub created: Option<i64>,
    /// For a failed charge; defaults to `card_declined`.
    #[serde(default)]
    pub failure_code: Option<String>,
    /// For a failed charge; defaults to a generic message.
    #[serde(default)]
    pub failure_message: Option<String>,
}

fn default_customer() -> String {
    "cus_planted".to_owned()
}

const fn default_status() -> ChargeStatus {
    ChargeStatus::Succeeded
}

impl PlantCharge {
    /// A succeeded charge of `amount` `currency` with no metadata, filed under a fresh key.
    pub fn succeeded(amount: i64, currency: &str) -> Self {
        Self {
            amount,
            currency: currency.to_owned(),
            customer: default_customer(),
            metadata: BTreeMap::new(),
            idempotency_key: None,
            status: ChargeStatus::Succeeded,
            created: None,
            failure_code: None,
            failure_message: None,
        }
    }
}

/// How many remembered keys `POST /_sim/keys/expire` forgot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiredKeys {
    /// Keys that had been decided; keys still in flight are kept.
    pub forgotten: usize,
}

/// Where webhooks go (`/_sim/webhook`); none stops them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookTarget {
    /// An absolute http(s) URL.
    pub url: Option<String>,
}
