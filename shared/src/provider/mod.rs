//! The payment provider: the protocol it speaks, the client oncepay uses, and how every answer is
//! classified.
//!
//! [`PaymentProvider`] is the seam: the worker and the reconciler only see it, and a real provider
//! is an adapter behind it. [`http::HttpProvider`] speaks the protocol in [`wire`] (the simulator
//! serves the same types). [`outcome`] turns every answer, including the absence of one, into a
//! typed outcome: definitive, not sent, or uncertain.

pub mod http;
pub mod outcome;
pub mod wire;

use std::collections::BTreeMap;
use std::future::Future;

use crate::ids::{DownstreamKey, PaymentId, TenantId};
use crate::money::{Amount, Currency};

pub use outcome::{LookupError, NotSentReason, SendOutcome, UncertainReason};
pub use wire::{Charge, ChargePage, ChargeStatus};

/// Metadata keys oncepay adds to every charge, so a charge found at the provider names its payment.
pub mod metadata_keys {
    /// The owning tenant.
    pub const TENANT_ID: &str = "oncepay_tenant_id";
    /// The payment.
    pub const PAYMENT_ID: &str = "oncepay_payment_id";
}

/// What oncepay asks the provider to charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRequest {
    /// Sent as the provider's `Idempotency-Key`; the same on every attempt for one payment.
    pub downstream_key: DownstreamKey,
    /// The amount in minor units.
    pub amount: Amount,
    /// The currency.
    pub currency: Currency,
    /// The merchant's customer reference.
    pub customer: String,
    /// The merchant's metadata plus oncepay's own keys.
    pub metadata: BTreeMap<String, String>,
}

impl ChargeRequest {
    /// The request for one payment: the merchant's metadata plus the keys that name the payment.
    pub fn for_payment(
        tenant_id: TenantId,
        payment_id: PaymentId,
        amount: Amount,
        currency: Currency,
        customer: String,
        merchant_metadata: &BTreeMap<String, String>,
    ) -> Self {
        let mut metadata = merchant_metadata.clone();
        metadata.insert(metadata_keys::TENANT_ID.to_owned(), tenant_id.to_string());
        metadata.insert(metadata_keys::PAYMENT_ID.to_owned(), payment_id.to_string());
        Self { downstream_key: payment_id.downstream_key(), amount, currency, customer, metadata }
    }
}

/// Filters for listing charges by creation time (Unix seconds, `created_gte <= created < created_lt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCharges {
    /// Inclusive lower bound.
    pub created_gte: i64,
    /// Exclusive upper bound.
    pub created_lt: i64,
    /// Continue after this charge id (the last one of the previous page).
    pub starting_after: Option<String>,
    /// Page size.
    pub limit: u32,
}

/// A payment provider, as the worker and the reconciler need it.
pub trait PaymentProvider: Send + Sync {
    /// Asks for a charge. Never fails: every way it can go wrong is an outcome.
    fn create_charge(&self, request: &ChargeRequest) -> impl Future<Output = SendOutcome> + Send;

    /// Every charge the provider holds for an idempotency key (normally none or one).
    fn find_by_key(&self, key: &DownstreamKey) -> impl Future<Output = Result<Vec<Charge>, LookupError>> + Send;

    /// One page of charges created in a time window, oldest first.
    fn list_charges(&self, query: &ListCharges) -> impl Future<Output = Result<ChargePage, LookupError>> + Send;
}
