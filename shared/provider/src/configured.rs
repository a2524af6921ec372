//! The provider a process's configuration names: the simulator's protocol over HTTP, or Stripe.
//!
//! The worker and the reconciler hold a [`ConfiguredProvider`] and never branch on the kind
//! themselves; [`ProviderSettings`] names the kind.

use oncepay_domain::ids::DownstreamKey;
use oncepay_domain::provider_ref::ProviderAccount;

use crate::http::HttpProvider;
use crate::settings::{ProviderKind, ProviderSettings};
use crate::stripe::{self, StripeProvider};
use crate::{
    Charge, ChargePage, ChargeRequest, ListCharges, ListRefunds, LookupError, PaymentProvider, Refund, RefundLookup,
    RefundOutcome, RefundPage, RefundRequest, Retrieved, SendOutcome,
};

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
    use std::time::Duration;

    use secrecy::SecretString;

    use super::*;
    use crate::stripe::StripeSettings;

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
