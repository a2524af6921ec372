//! The simulator's settings: one [`Settings`], loaded once in `main` (or built by a test) from the
//! embedded `config/default.toml`, an optional file and `ONCEPAY_*` environment variables.
//!
//! Invariants: after [`Settings::load`] (or [`Settings::validate`]) the faults are within their
//! bounds and the webhook secret parsed. Secrets are `secrecy`/opaque types and never printed.
//! Nothing here reads the environment except through `oncepay_service::config::load`.

use std::path::Path;

use oncepay_service::backoff::Backoff;
use oncepay_service::config::{HttpSettings, TelemetrySettings};
use oncepay_webhook_signature::WebhookSecret;
use secrecy::SecretString;
use serde::{Deserialize, Deserializer};

use crate::faults::{Faults, InvalidFaults};

/// The defaults, which also document every key.
pub const DEFAULTS: &str = include_str!("../config/default.toml");

/// Everything the simulator is configured with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Where to listen.
    pub http: HttpSettings,
    /// Logs and traces.
    pub telemetry: TelemetrySettings,
    /// The provider's own behaviour.
    pub simulator: SimulatorSettings,
    /// The faults in force at start-up.
    pub faults: Faults,
}

/// The `[simulator]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatorSettings {
    /// The Bearer credential `/v1/*` accepts.
    pub api_key: SecretString,
    /// How long a decided idempotency key is remembered, counted from its first request.
    pub key_window_secs: u64,
    /// The seed of the one random source; none picks one (and logs it).
    #[serde(default)]
    pub seed: Option<u64>,
    /// How long in-flight work may take to finish on shutdown.
    pub shutdown_grace_ms: u64,
    /// Where webhooks go; none means no webhooks.
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// The signing secret.
    #[serde(deserialize_with = "webhook_secret")]
    pub webhook_secret: WebhookSecret,
    /// Attempts per delivery, the first included.
    pub webhook_max_attempts: u32,
    /// How long one attempt waits for a response.
    pub webhook_timeout_ms: u64,
    /// The backoff between attempts.
    pub webhook_backoff: Backoff,
}

/// Why settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A layer could not be read or does not fit the shape.
    #[error("cannot load the settings: {0}")]
    Load(#[from] Box<figment::Error>),
    /// The faults are out of bounds.
    #[error(transparent)]
    Faults(#[from] InvalidFaults),
    /// The webhook URL is not an absolute http(s) URL.
    #[error("simulator.webhook_url is not an http(s) URL: {0}")]
    WebhookUrl(String),
    /// A delivery needs at least one attempt.
    #[error("simulator.webhook_max_attempts must be at least 1")]
    NoAttempts,
}

impl Settings {
    /// Loads the defaults, then `file`, then the environment, and validates the result.
    pub fn load(file: Option<&Path>) -> Result<Self, SettingsError> {
        let settings: Self = oncepay_service::config::load(DEFAULTS, file)?;
        settings.validate()
    }

    /// Checks what the types cannot: fault bounds, the webhook URL, the attempt count.
    pub fn validate(self) -> Result<Self, SettingsError> {
        self.faults.validate()?;
        if let Some(url) = &self.simulator.webhook_url {
            parse_webhook_url(url).map_err(SettingsError::WebhookUrl)?;
        }
        if self.simulator.webhook_max_attempts == 0 {
            return Err(SettingsError::NoAttempts);
        }
        Ok(self)
    }
}

/// Parses a webhook target: an absolute `http` or `https` URL.
pub fn parse_webhook_url(text: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(text).map_err(|e| format!("{text:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{text:?}: only http and https are supported"));
    }
    Ok(url)
}

fn webhook_secret<'de, D: Deserializer<'de>>(deserializer: D) -> Result<WebhookSecret, D::Error> {
    let text = String::deserialize(deserializer)?;
    WebhookSecret::parse(&text).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use figment::providers::{Format, Serialized, Toml};

    use super::*;

    #[test]
    fn the_embedded_defaults_load_and_inject_no_fault() {
        let settings = Settings::load(None).unwrap();

        assert_eq!(settings.http.port, 8090);
        assert_eq!(settings.simulator.key_window_secs, 86_400);
        assert_eq!(settings.simulator.webhook_url, None);
        assert_eq!(settings.faults, Faults::default());
    }

    #[test]
    fn a_bad_webhook_url_or_secret_is_refused() {
        let mut settings = Settings::load(None).unwrap();
        settings.simulator.webhook_url = Some("ftp://example.com".into());
        assert!(matches!(settings.validate(), Err(SettingsError::WebhookUrl(_))));

        let parsed: Result<Settings, _> = figment::Figment::new()
            .merge(Toml::string(DEFAULTS))
            .merge(Serialized::default("simulator.webhook_secret", "not-a-secret"))
            .extract();
        assert!(parsed.is_err());
    }
}
