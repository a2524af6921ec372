//! `[provider.stripe]`: whose account Stripe charges in ([`StripeMode`]), how to reach Stripe, as
//! whom, how long to wait, and how far a lookup may go ([`StripeSettings`]), and the settings that
//! cannot work ([`SettingsError`]).

use secrecy::SecretString;

/// Whose Stripe account a tenant's payments are charged in: a choice every deployment makes
/// explicitly, since in direct mode tenants share one account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StripeMode {
    /// Stripe Connect: oncepay runs with the platform's key, each tenant is a connected account that
    /// an operator sets on it, and each payment is charged in its tenant's account. A tenant without
    /// one cannot take payments.
    Connect,
    /// Every tenant is charged in the one account of `secret_key`, so tenants must be one
    /// organisation: any of them can name any payment method or customer of that account.
    Direct,
}

/// How to reach Stripe, as whom, and how long to wait.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct StripeSettings {
    /// Connect or direct: the same for every process.
    pub mode: StripeMode,
    /// The secret API key, `sk_live_…` or `sk_test_…` (a restricted `rk_…` key works if it may
    /// write PaymentIntents). In connect mode, the platform's.
    pub secret_key: SecretString,
    /// Stripe's API, or a stand-in for tests.
    #[serde(default = "defaults::base_url")]
    pub base_url: String,
    /// The pinned API version, sent as `Stripe-Version` on every call, so the account's default
    /// version cannot change the shapes oncepay reads, or the parameters a resend is compared with.
    pub api_version: String,
    /// The payment method (`pm_…`) used when a payment names none. Only for a deployment in direct
    /// mode: a connected account does not know the platform's payment methods.
    #[serde(default)]
    pub default_payment_method: Option<String>,
    /// How long to wait for a connection.
    #[serde(default = "defaults::connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long to wait for a whole response. A confirmation talks to the card network, so this is
    /// longer than for the simulator; a timeout makes the payment uncertain.
    #[serde(default = "defaults::request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Intents per page of a list call (Stripe allows 1 to 100).
    #[serde(default = "defaults::list_page_size")]
    pub list_page_size: u32,
    /// The most list pages one lookup reads before it gives up with "can't tell".
    #[serde(default = "defaults::max_lookup_pages")]
    pub max_lookup_pages: u32,
    /// How far Stripe's clock may be behind ours: a lookup lists intents from this long before the
    /// payment was created.
    #[serde(default = "defaults::clock_skew_secs")]
    pub clock_skew_secs: i64,
    /// The longest one lookup may take, across its search and every list page it reads: past it,
    /// the lookup stops and proves nothing. The poller's lease must be longer.
    #[serde(default = "defaults::lookup_deadline_ms")]
    pub lookup_deadline_ms: u64,
}

mod defaults {
    pub fn base_url() -> String {
        "https://api.stripe.com".to_owned()
    }
    pub const fn connect_timeout_ms() -> u64 {
        2_000
    }
    pub const fn request_timeout_ms() -> u64 {
        30_000
    }
    pub const fn list_page_size() -> u32 {
        100
    }
    pub const fn max_lookup_pages() -> u32 {
        20
    }
    pub const fn clock_skew_secs() -> i64 {
        10 * 60
    }
    pub const fn lookup_deadline_ms() -> u64 {
        50_000
    }
}

/// Settings that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// No API version: the account's default would apply and could change under oncepay.
    #[error("stripe.api_version must name a Stripe API version, e.g. \"2024-06-20\"")]
    NoApiVersion,
    /// A page size Stripe refuses.
    #[error("stripe.list_page_size must be between 1 and 100, not {0}")]
    PageSize(u32),
    /// A lookup that can read nothing.
    #[error("stripe.max_lookup_pages must be at least 1")]
    NoLookupPages,
    /// A negative clock skew.
    #[error("stripe.clock_skew_secs must not be negative")]
    NegativeSkew,
    /// A default payment method, which would be the platform's, with payments charged in connected
    /// accounts.
    #[error(
        "stripe.default_payment_method cannot be set in connect mode: a payment method belongs to one account, \
         and each payment is charged in its tenant's"
    )]
    DefaultPaymentMethodInConnect,
    /// A lookup deadline that leaves no room for one whole call.
    #[error(
        "stripe.lookup_deadline_ms ({deadline_ms}) must allow at least one whole call: the connect plus request \
         timeouts ({call_ms} ms)"
    )]
    DeadlineBelowOneCall {
        /// The deadline.
        deadline_ms: u64,
        /// One call's longest time.
        call_ms: u64,
    },
}

impl StripeSettings {
    /// Rejects settings that cannot work.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.api_version.trim().is_empty() {
            return Err(SettingsError::NoApiVersion);
        }
        if !(1..=100).contains(&self.list_page_size) {
            return Err(SettingsError::PageSize(self.list_page_size));
        }
        if self.max_lookup_pages == 0 {
            return Err(SettingsError::NoLookupPages);
        }
        if self.clock_skew_secs < 0 {
            return Err(SettingsError::NegativeSkew);
        }
        if self.mode == StripeMode::Connect && self.default_payment_method.is_some() {
            return Err(SettingsError::DefaultPaymentMethodInConnect);
        }
        let call_ms = self.connect_timeout_ms.saturating_add(self.request_timeout_ms);
        if self.lookup_deadline_ms < call_ms {
            return Err(SettingsError::DeadlineBelowOneCall { deadline_ms: self.lookup_deadline_ms, call_ms });
        }
        Ok(())
    }
}
