//! The `[provider]` section of a process's settings: which provider charges the payments, how to
//! reach the simulator, the provider's key window, and Stripe's own settings when Stripe is chosen.
//!
//! The key window belongs to `[provider]` whatever the kind, since every resend decision depends on
//! it.

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::KeyWindow;
use crate::stripe::settings::{StripeMode, StripeSettings};

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
