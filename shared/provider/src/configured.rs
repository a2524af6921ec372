//! The provider a process's configuration names: the simulator's protocol over HTTP, or Stripe.
//!
//! The worker and the reconciler hold a [`ConfiguredProvider`] and never branch on the kind
//! themselves. The key window belongs to `[provider]` whatever the kind, since every resend decision
//! depends on it.

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use oncepay_domain::ids::DownstreamKey;
use oncepay_domain::provider_ref::ProviderAccount;

use crate::http::HttpProvider;
use crate::stripe::{self, StripeMode, StripeProvider, StripeSettings};
use crate::{
    Charge, ChargePage, ChargeRequest, KeyWindow, ListCharges, ListRefunds, LookupError, PaymentProvider, Refund,
    RefundLookup, RefundOutcome, RefundPage, RefundRequest, Retrieved, SendOutcome,
};

/// Which provider charges the payments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// The simulator, or any server that speaks its protocol (`[provider]` `base_url`, `api_key`).
    #[default]
    Simulator,
    /// Stripe, configured in `[provider.stripe]`.
    Stripe,
}

/// The `[provider]` section: which provider, how to reach it, and its key window.
#[derive(Debug, Clone, Deserialize)]
pub struct ProviderSettings {
    /// Which provider.
    #[serde(default)]
    pub kind: ProviderKind,
    /// The simulator's base URL, e.g. `http://127.0.0.1:8090`.
    pub base_url: String,
    /// Bearer credential for the simulator.
    pub api_key: SecretString,
    /// How long to wait for a connection to the simulator.
    #[serde(default = "defaults::connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long to wait for the simulator's whole response.
    #[serde(default = "defaults::request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long the provider remembers an idempotency key (24 h at real providers).
    #[serde(default = "defaults::key_window_secs")]
    pub key_window_secs: u64,
    /// Resends (by the worker, the sweeper, the poller, an operator) stop this long before the key
    /// window closes, to cover clock skew and the time a resend takes to arrive.
    #[serde(default = "defaults::key_window_margin_secs")]
    pub key_window_margin_secs: u64,
    /// Stripe's settings; required when `kind` is `stripe`.
    #[serde(default)]
    pub stripe: Option<StripeSettings>,
}

impl ProviderSettings {
    /// The provider's key window, as every resend decision must see it.
    pub fn key_window(&self) -> KeyWindow {
        KeyWindow {
            window: Duration::from_secs(self.key_window_secs),
            safety_margin: Duration::from_secs(self.key_window_margin_secs),
        }
    }

    /// Whether payments are charged in their tenants' connected accounts (Stripe in connect mode),
    /// rather than in the account of oncepay's own credentials.
    pub fn charges_in_connected_accounts(&self) -> bool {
        matches!((self.kind, &self.stripe), (ProviderKind::Stripe, Some(stripe)) if stripe.mode == StripeMode::Connect)
    }

    /// The longest one call to the configured provider may take: its connect plus request timeouts.
    pub fn longest_call(&self) -> Duration {
        let (connect, request) = match (&self.kind, &self.stripe) {
            (ProviderKind::Stripe, Some(stripe)) => (stripe.connect_timeout_ms, stripe.request_timeout_ms),
            _ => (self.connect_timeout_ms, self.request_timeout_ms),
        };
        Duration::from_millis(connect.saturating_add(request))
    }

    /// The longest one lookup of a payment may take: Stripe's lookup deadline (a search and many
    /// list pages), else one call.
    pub fn longest_lookup(&self) -> Duration {
        match (&self.kind, &self.stripe) {
            (ProviderKind::Stripe, Some(stripe)) => Duration::from_millis(stripe.lookup_deadline_ms),
            _ => self.longest_call(),
        }
    }

    /// Rejects settings that cannot work: a margin that leaves no window to resend in, or Stripe
    /// chosen without usable Stripe settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.key_window_margin_secs >= self.key_window_secs {
            return Err(format!(
                "provider.key_window_margin_secs ({}) must be smaller than provider.key_window_secs ({})",
                self.key_window_margin_secs, self.key_window_secs
            ));
        }
        if self.kind == ProviderKind::Stripe {
            let Some(stripe) = &self.stripe else {
                return Err("provider.kind is \"stripe\" but there is no [provider.stripe] section".to_owned());
            };
            stripe.validate().map_err(|error| format!("provider.{error}"))?;
        }
        Ok(())
    }
}

mod defaults {
    pub const fn connect_timeout_ms() -> u64 {
        1_000
    }
    pub const fn request_timeout_ms() -> u64 {
        10_000
    }
    pub const fn key_window_secs() -> u64 {
        24 * 60 * 60
    }
    pub const fn key_window_margin_secs() -> u64 {
        60 * 60
    }
}

/// Why the configured provider's client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The settings cannot work.
    #[error("{0}")]
    Settings(String),
    /// The simulator's HTTP client could not be built.
    #[error("the HTTP client could not be built: {0}")]
    Client(#[from] reqwest::Error),
    /// Stripe's client could not be built.
    #[error(transparent)]
    Stripe(#[from] stripe::client::BuildError),
}

/// The provider `[provider]` names. Cheap to clone.
#[derive(Debug, Clone)]
pub enum ConfiguredProvider {
    /// The simulator's protocol.
    Simulator(HttpProvider),
    /// Stripe.
    Stripe(StripeProvider),
}

impl ConfiguredProvider {
    /// Builds the client for the configured kind.
    pub fn new(settings: &ProviderSettings) -> Result<Self, BuildError> {
        settings.validate().map_err(BuildError::Settings)?;
        Ok(match (settings.kind, &settings.stripe) {
            (ProviderKind::Stripe, Some(stripe)) => Self::Stripe(StripeProvider::new(stripe)?),
            _ => Self::Simulator(HttpProvider::new(settings)?),
        })
    }
}

impl PaymentProvider for ConfiguredProvider {
    async fn create_charge(&self, request: &ChargeRequest) -> SendOutcome {
        match self {
            Self::Simulator(provider) => provider.create_charge(request).await,
            Self::Stripe(provider) => provider.create_charge(request).await,
        }
    }

    async fn find_by_key(
        &self,
        key: &DownstreamKey,
        account: Option<&ProviderAccount>,
    ) -> Result<Vec<Charge>, LookupError> {
        match self {
            Self::Simulator(provider) => provider.find_by_key(key, account).await,
            Self::Stripe(provider) => provider.find_by_key(key, account).await,
        }
    }

    async fn list_charges(&self, query: &ListCharges) -> Result<ChargePage, LookupError> {
        match self {
            Self::Simulator(provider) => provider.list_charges(query).await,
            Self::Stripe(provider) => provider.list_charges(query).await,
        }
    }

    async fn retrieve(&self, id: &str, account: Option<&ProviderAccount>) -> Result<Retrieved, LookupError> {
        match self {
            Self::Simulator(provider) => provider.retrieve(id, account).await,
            Self::Stripe(provider) => provider.retrieve(id, account).await,
        }
    }

    async fn create_refund(&self, request: &RefundRequest) -> RefundOutcome {
        match self {
            Self::Simulator(provider) => provider.create_refund(request).await,
            Self::Stripe(provider) => provider.create_refund(request).await,
        }
    }

    async fn find_refunds(&self, lookup: &RefundLookup) -> Result<Vec<Refund>, LookupError> {
        match self {
            Self::Simulator(provider) => provider.find_refunds(lookup).await,
            Self::Stripe(provider) => provider.find_refunds(lookup).await,
        }
    }

    async fn list_refunds(&self, query: &ListRefunds) -> Result<RefundPage, LookupError> {
        match self {
            Self::Simulator(provider) => provider.list_refunds(query).await,
            Self::Stripe(provider) => provider.list_refunds(query).await,
        }
    }

    async fn retrieve_refund(
        &self,
        id: &str,
        account: Option<&ProviderAccount>,
    ) -> Result<Option<Refund>, LookupError> {
        match self {
            Self::Simulator(provider) => provider.retrieve_refund(id, account).await,
            Self::Stripe(provider) => provider.retrieve_refund(id, account).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(kind: ProviderKind, stripe: Option<StripeSettings>) -> ProviderSettings {
        ProviderSettings {
            kind,
            base_url: "http://127.0.0.1:8090".to_owned(),
            api_key: SecretString::from("sk_test"),
            connect_timeout_ms: 1_000,
            request_timeout_ms: 10_000,
            key_window_secs: 86_400,
            key_window_margin_secs: 3_600,
            stripe,
        }
    }

    fn stripe_settings(api_version: &str) -> StripeSettings {
        serde_json::from_value(
            serde_json::json!({"mode": "direct", "secret_key": "sk_test_x", "api_version": api_version}),
        )
        .expect("valid Stripe settings")
    }

    #[test]
    fn the_kind_decides_which_client_is_built() {
        let simulator = ConfiguredProvider::new(&settings(ProviderKind::Simulator, None)).unwrap();
        assert!(matches!(simulator, ConfiguredProvider::Simulator(_)));
        let stripe =
            ConfiguredProvider::new(&settings(ProviderKind::Stripe, Some(stripe_settings("2024-06-20")))).unwrap();
        assert!(matches!(stripe, ConfiguredProvider::Stripe(_)));
    }

    #[test]
    fn stripe_without_usable_settings_is_refused_by_name() {
        let cases =
            [(None, "no [provider.stripe] section"), (Some(stripe_settings(" ")), "provider.stripe.api_version")];
        for (stripe, expected) in cases {
            let error = ConfiguredProvider::new(&settings(ProviderKind::Stripe, stripe)).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn the_longest_call_is_the_configured_providers() {
        let simulator = settings(ProviderKind::Simulator, Some(stripe_settings("2024-06-20")));
        assert_eq!(simulator.longest_call(), Duration::from_millis(11_000));
        let stripe = settings(ProviderKind::Stripe, Some(stripe_settings("2024-06-20")));
        assert_eq!(stripe.longest_call(), Duration::from_millis(32_000));
    }
}
