//! The payment provider: the protocol it speaks, the client oncepay uses, and how every response is
//! classified.
//!
//! [`PaymentProvider`] is the seam: the worker and the reconciler see only it, and a real provider is
//! an adapter behind it. [`http::HttpProvider`] speaks the protocol in [`wire`], which the simulator
//! serves too. [`outcome`] turns every call into a typed outcome (definitive, not sent, or uncertain),
//! even one that got no response. The provider's webhooks are signed as Standard Webhooks
//! (`oncepay_webhook_signature`). [`stripe`] is the adapter for Stripe, with its own wire format, classification and signatures.

pub mod configured;
#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod http;
pub mod outcome;
pub mod refund;
pub mod settings;
pub mod stripe;
mod transport;
pub mod wire;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use oncepay_domain::ids::{DownstreamKey, PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::{ProviderAccount, ProviderCustomer};

pub use configured::ConfiguredProvider;
pub use outcome::{LookupError, NotSentReason, SendOutcome, UncertainReason};
pub use refund::{RefundLookup, RefundOutcome, RefundRequest};
pub use settings::{ProviderKind, ProviderSettings};
pub use wire::{Charge, ChargePage, ChargeStatus, Refund, RefundPage, RefundState, Retrieved, UnfinishedCharge};

/// How long the provider deduplicates resends of one downstream idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyWindow {
    /// How long the provider remembers a key (24 h at real providers;
    /// `provider.key_window_secs`).
    pub window: Duration,
    /// Subtracted from the window to cover clock skew and the time a resend takes to arrive.
    pub safety_margin: Duration,
}

impl KeyWindow {
    /// How long after a payment's first send a resend with the same key is still certain to be
    /// deduplicated.
    pub fn resend_horizon(&self) -> Duration {
        self.window.saturating_sub(self.safety_margin)
    }
}

/// Metadata keys oncepay adds to every charge, so a charge found at the provider names its payment.
pub mod metadata_keys {
    /// The owning tenant.
    pub const TENANT_ID: &str = "oncepay_tenant_id";
    /// The payment.
    pub const PAYMENT_ID: &str = "oncepay_payment_id";
    /// The refund, on a refund only.
    pub const REFUND_ID: &str = "oncepay_refund_id";

    /// The metadata that names a payment and its tenant, as far as they are known.
    pub fn naming(
        tenant_id: Option<super::TenantId>,
        payment_id: Option<super::PaymentId>,
    ) -> std::collections::BTreeMap<String, String> {
        let tenant = tenant_id.map(|t| (TENANT_ID.to_owned(), t.to_string()));
        let payment = payment_id.map(|p| (PAYMENT_ID.to_owned(), p.to_string()));
        tenant.into_iter().chain(payment).collect()
    }
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
    /// The merchant's customer reference. The simulator's protocol carries it; Stripe is never told
    /// it, since it is the merchant's reference and not a Stripe Customer.
    pub customer: String,
    /// The merchant's metadata plus oncepay's own keys.
    pub metadata: BTreeMap<String, String>,
    /// The provider's reference to what pays (a Stripe `pm_…`), when the payment names one. The
    /// simulator needs none; the Stripe adapter falls back to its configured default.
    pub payment_method: Option<String>,
    /// The provider's customer the payment method belongs to (a Stripe `cus_…`), when the payment
    /// names one.
    pub provider_customer: Option<ProviderCustomer>,
    /// The provider account to charge in (a Stripe connected account, sent as `Stripe-Account`);
    /// `None` charges in the account of oncepay's own credentials.
    pub account: Option<ProviderAccount>,
}

impl ChargeRequest {
    /// The request for one payment, in oncepay's own account, with no payment method or provider
    /// customer: the merchant's metadata plus the keys that name the payment. A payment that names
    /// more sets those fields on the result.
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
        Self {
            downstream_key: payment_id.downstream_key(),
            amount,
            currency,
            customer,
            metadata,
            payment_method: None,
            provider_customer: None,
            account: None,
        }
    }
}

/// Filters for listing charges by creation time (Unix seconds, `created_gte <= created < created_lt`),
/// in one provider account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCharges {
    /// Whose charges: a Stripe connected account, or `None` for oncepay's own account.
    pub account: Option<ProviderAccount>,
    /// Inclusive lower bound.
    pub created_gte: i64,
    /// Exclusive upper bound.
    pub created_lt: i64,
    /// Continue after this charge id (the last one of the previous page).
    pub starting_after: Option<String>,
    /// Page size.
    pub limit: u32,
}

/// Filters for listing refunds by creation time (Unix seconds, `created_gte <= created < created_lt`),
/// in one provider account, as [`ListCharges`] lists charges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListRefunds {
    /// Whose refunds: a Stripe connected account, or `None` for oncepay's own account.
    pub account: Option<ProviderAccount>,
    /// Inclusive lower bound.
    pub created_gte: i64,
    /// Exclusive upper bound.
    pub created_lt: i64,
    /// Continue after this refund id (the last one of the previous page).
    pub starting_after: Option<String>,
    /// Page size.
    pub limit: u32,
}

/// A payment provider, as the worker and the reconciler need it.
pub trait PaymentProvider: Send + Sync {
    /// Asks for a charge. Never fails: every way it can go wrong is an outcome.
    fn create_charge(&self, request: &ChargeRequest) -> impl Future<Output = SendOutcome> + Send;

    /// Every charge the provider holds for an idempotency key (normally none or one) in `account`
    /// (`None`: oncepay's own account).
    fn find_by_key(
        &self,
        key: &DownstreamKey,
        account: Option<&ProviderAccount>,
    ) -> impl Future<Output = Result<Vec<Charge>, LookupError>> + Send;

    /// One page of charges created in a time window, oldest first.
    fn list_charges(&self, query: &ListCharges) -> impl Future<Output = Result<ChargePage, LookupError>> + Send;

    /// The charge `id` in `account` (`None`: oncepay's own account), as it stands now.
    fn retrieve(
        &self,
        id: &str,
        account: Option<&ProviderAccount>,
    ) -> impl Future<Output = Result<Retrieved, LookupError>> + Send;

    /// Asks for a refund of a charge. Never fails: every way it can go wrong is an outcome.
    fn create_refund(&self, request: &RefundRequest) -> impl Future<Output = RefundOutcome> + Send;

    /// Every refund of `lookup.charge_id` made under `lookup.key` (normally none or one), from a
    /// consistent source: an empty answer proves that no refund was made under that key.
    fn find_refunds(&self, lookup: &RefundLookup) -> impl Future<Output = Result<Vec<Refund>, LookupError>> + Send;

    /// One page of refunds created in a time window, in every state (one not finished among them),
    /// whoever asked for them. Each refund names the charge it refunds, as oncepay books a
    /// payment's charge.
    fn list_refunds(&self, query: &ListRefunds) -> impl Future<Output = Result<RefundPage, LookupError>> + Send;

    /// The refund `id` in `account` (`None`: oncepay's own account), as it stands now; `None` when
    /// the provider holds no refund under that id.
    fn retrieve_refund(
        &self,
        id: &str,
        account: Option<&ProviderAccount>,
    ) -> impl Future<Output = Result<Option<Refund>, LookupError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resend_horizon_is_the_window_minus_the_margin_and_never_negative() {
        let cases = [(86_400, 3_600, 82_800), (60, 10, 50), (10, 60, 0)];
        for (window, margin, horizon) in cases {
            let key_window =
                KeyWindow { window: Duration::from_secs(window), safety_margin: Duration::from_secs(margin) };
            assert_eq!(key_window.resend_horizon(), Duration::from_secs(horizon), "{window} - {margin}");
        }
    }
}
