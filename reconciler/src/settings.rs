//! The reconciler's settings: one struct, loaded once in `main` from `config/default.toml`, an
//! optional file and the environment (`oncepay_service::config::load`), then validated.
//!
//! Nothing outside `main` reads configuration; everything else receives the piece it needs. Secrets
//! (webhook secrets, the provider key, the database URL) are `secrecy` types and never printed.

use std::path::Path;
use std::time::Duration;

use oncepay_provider::KeyWindow;
use oncepay_provider::stripe::signature::StripeWebhookSecret;
use oncepay_provider::{ProviderKind, ProviderSettings};
use oncepay_service::backoff::Backoff;
use oncepay_service::config::{self, DatabaseSettings, HttpSettings, TelemetrySettings};
use oncepay_webhook_signature::{BadSecret, WebhookSecret};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::recon::ReconConfig;

/// The embedded defaults, which also document every key.
pub const DEFAULTS: &str = include_str!("../config/default.toml");

/// Everything the reconciler can be told.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// Where the webhook and operations endpoints listen.
    pub http: HttpSettings,
    /// PostgreSQL.
    pub database: DatabaseSettings,
    /// Logs and traces.
    pub telemetry: TelemetrySettings,
    /// The payment provider.
    pub provider: ProviderSettings,
    /// Incoming provider webhooks.
    pub webhooks: WebhookSettings,
    /// The unknown-payment poller.
    pub poller: PollerSettings,
    /// The expired-lease sweeper.
    pub sweeper: SweeperSettings,
    /// The key and webhook-event reaper.
    pub reaper: ReaperSettings,
    /// The ledger reconciliation.
    pub recon: ReconSettings,
    /// The backlog gauges.
    pub backlog: BacklogSettings,
    /// The operations API and operators' accounts.
    pub operators: OperatorSettings,
}

/// `[webhooks]`.
#[derive(Debug, Clone, Deserialize)]
pub struct WebhookSettings {
    /// `whsec_…` secrets; a delivery signed with any of them is accepted (rotation).
    pub secrets: Vec<SecretString>,
    /// Stripe's endpoint secrets (`whsec_…`, used as given), for `POST /webhooks/stripe`.
    #[serde(default)]
    pub stripe_secrets: Vec<SecretString>,
    /// Largest accepted distance between `webhook-timestamp` and now, either way, in seconds.
    pub tolerance_secs: i64,
    /// Largest accepted body.
    pub max_body_bytes: usize,
}

impl WebhookSettings {
    /// The secrets, parsed.
    pub fn parsed_secrets(&self) -> Result<Vec<WebhookSecret>, BadSecret> {
        self.secrets.iter().map(|s| WebhookSecret::parse(s.expose_secret())).collect()
    }

    /// The secrets the service verifies deliveries with. The provider oncepay charges through must
    /// have at least one, or the service must not start (the operator commands need none).
    pub fn serving_secrets(&self, kind: ProviderKind) -> Result<ServingSecrets, InvalidSettings> {
        let missing = match kind {
            ProviderKind::Simulator if self.secrets.is_empty() => Some(("secrets", "SECRETS")),
            ProviderKind::Stripe if self.stripe_secrets.is_empty() => Some(("stripe_secrets", "STRIPE_SECRETS")),
            _ => None,
        };
        if let Some((key, variable)) = missing {
            return Err(InvalidSettings::Rule(format!(
                "webhooks.{key} is empty: set it to the provider's webhook signing secret, e.g. \
                 ONCEPAY_WEBHOOKS__{variable}='[\"whsec_...\"]'"
            )));
        }
        let simulator = self.parsed_secrets().map_err(|e| InvalidSettings::Rule(format!("webhooks.secrets: {e}")))?;
        let stripe = self
            .stripe_secrets
            .iter()
            .map(|s| StripeWebhookSecret::parse(s.expose_secret()))
            .collect::<Result<_, _>>()
            .map_err(|e| InvalidSettings::Rule(format!("webhooks.stripe_secrets: {e}")))?;
        Ok(ServingSecrets { simulator, stripe })
    }
}

/// The parsed secrets of every webhook endpoint.
#[derive(Debug)]
pub struct ServingSecrets {
    /// For `POST /webhooks/provider`.
    pub simulator: Vec<WebhookSecret>,
    /// For `POST /webhooks/stripe`.
    pub stripe: Vec<StripeWebhookSecret>,
}

/// `[poller]`.
#[derive(Debug, Clone, Deserialize)]
pub struct PollerSettings {
    /// Pause between passes that found nothing due.
    pub interval_ms: u64,
    /// Payments claimed per pass.
    pub batch_size: u32,
    /// Provider lookups in flight at once.
    pub concurrency: usize,
    /// How long a claimed payment stays hidden from other pollers.
    pub lease_ms: u64,
    /// Per-payment wait between inconclusive lookups.
    pub backoff: Backoff,
    /// Inconclusive lookups before a payment is dead-lettered.
    pub max_attempts: u32,
    /// Time in `unknown` before a payment is dead-lettered.
    pub max_age_secs: u64,
}

impl PollerSettings {
    /// The pause between idle passes.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }
}

/// `[sweeper]`.
#[derive(Debug, Clone, Deserialize)]
pub struct SweeperSettings {
    /// Pause between passes that found nothing.
    pub interval_ms: u64,
    /// Leases taken over per pass.
    pub batch_size: u32,
}

/// `[reaper]`.
#[derive(Debug, Clone, Deserialize)]
pub struct ReaperSettings {
    /// Pause between passes that found nothing.
    pub interval_ms: u64,
    /// Rows deleted per statement.
    pub batch_size: u32,
    /// How long a webhook-id is remembered.
    pub webhook_retention_secs: u64,
    /// How long an event sent to merchants is kept once no delivery of it is owed.
    pub event_retention_secs: u64,
}

/// `[recon]`.
#[derive(Debug, Clone, Deserialize)]
pub struct ReconSettings {
    /// Six-field cron expression (UTC) for the nightly run.
    pub schedule: String,
    /// Charges per provider page.
    pub page_size: u32,
    /// A running run whose heartbeat is older than this may be taken over.
    pub stale_after_secs: u64,
    /// How often to look for a run an operator queued (`recon run`).
    pub queue_interval_ms: u64,
    /// How many previous days the nightly job makes sure are reconciled.
    pub catch_up_days: u32,
}

/// `[backlog]`.
#[derive(Debug, Clone, Deserialize)]
pub struct BacklogSettings {
    /// How often the backlog gauges are sampled.
    pub interval_ms: u64,
}

/// `[operators]`.
#[derive(Debug, Clone, Deserialize)]
pub struct OperatorSettings {
    /// The operations API's port, on `http.host`; unset serves no operations API. 0 picks a free one.
    #[serde(default)]
    pub port: Option<u16>,
    /// How long a proposal waits for an approver.
    pub proposal_ttl_secs: u64,
    /// How long a token works when its request names no lifetime.
    pub token_ttl_days: u32,
    /// The longest a token may work.
    pub max_token_ttl_days: u32,
    /// Whether every resend is proposed for approval (a resend past the key window always is).
    pub retries_need_approval: bool,
    /// A browser session unused this long ends.
    pub session_idle_secs: u64,
    /// A browser session ends this long after its sign-in.
    pub session_max_secs: u64,
    /// How recent a session's sign-in must be to approve a proposal.
    pub fresh_sign_in_secs: u64,
    /// Refused sign-ins of one name within `sign_in_window_secs` that lock it until the window passes.
    pub sign_in_attempts: u32,
    /// The window of `sign_in_attempts` and `sign_in_source_attempts`.
    pub sign_in_window_secs: u64,
    /// Sign-in and enrollment attempts from one source address (an IPv6 address by its /64) within
    /// `sign_in_window_secs`, successes given back, past which the address is refused until the
    /// window passes.
    pub sign_in_source_attempts: u32,
    /// Password hashes (each about 19 MiB) that may run at once in the process; beyond them a
    /// sign-in is answered 503 at once.
    pub max_concurrent_password_hashes: usize,
    /// How long an enrollment code works.
    pub enrollment_ttl_secs: u64,
    /// With `oidc` set, the one operator who may still sign in with a local password (the
    /// break-glass account, each use of which is recorded); unset, nobody may.
    #[serde(default)]
    pub break_glass: Option<String>,
    /// The organisation's OpenID provider; none means operators sign in with local passwords only.
    #[serde(default)]
    pub oidc: Option<oncepay_ops::operators::oidc::OidcSettings>,
}

impl OperatorSettings {
    /// How long a token works when its request names no lifetime.
    pub fn token_ttl(&self) -> Duration {
        days(self.token_ttl_days)
    }

    /// The longest a token may work.
    pub fn max_token_ttl(&self) -> Duration {
        days(self.max_token_ttl_days)
    }

    /// How sessions and sign-ins are limited, and who may sign in with a local password.
    pub fn session_policy(&self) -> oncepay_ops::operators::sessions::Policy {
        use oncepay_ops::operators::sessions::LocalPasswords;
        let local = match (&self.oidc, &self.break_glass) {
            (None, _) => LocalPasswords::Everyone,
            (Some(_), Some(name)) => LocalPasswords::BreakGlass(name.clone()),
            (Some(_), None) => LocalPasswords::Nobody,
        };
        oncepay_ops::operators::sessions::Policy {
            idle: Duration::from_secs(self.session_idle_secs),
            max: Duration::from_secs(self.session_max_secs),
            limits: oncepay_ops::operators::limits::Limits {
                attempts: self.sign_in_attempts,
                source_attempts: self.sign_in_source_attempts,
                window: Duration::from_secs(self.sign_in_window_secs),
            },
            local,
        }
    }

    /// How long an enrollment code works.
    pub const fn enrollment_ttl(&self) -> Duration {
        Duration::from_secs(self.enrollment_ttl_secs)
    }
}

fn days(days: u32) -> Duration {
    Duration::from_secs(u64::from(days) * 86_400)
}

/// A setting that loads but cannot work.
#[derive(Debug, thiserror::Error)]
pub enum InvalidSettings {
    /// The layers could not be read or merged.
    #[error("cannot load the configuration: {0}")]
    Load(String),
    /// A rule below is broken.
    #[error("invalid configuration: {0}")]
    Rule(String),
}

impl Settings {
    /// Loads and validates the settings.
    pub fn load(file: Option<&Path>) -> Result<Self, InvalidSettings> {
        let settings: Self = config::load(DEFAULTS, file).map_err(|e| InvalidSettings::Load(e.to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    /// How long the provider deduplicates a resend with a payment's key, and the margin every resend
    /// decision (the poller's, the sweeper's, an operator's retry) keeps from its end.
    pub fn key_window(&self) -> KeyWindow {
        self.provider.key_window()
    }

    /// The reconciliation's settings.
    pub fn recon_config(&self) -> ReconConfig {
        ReconConfig {
            schedule: self.recon.schedule.clone(),
            page_size: self.recon.page_size,
            stale_after: Duration::from_secs(self.recon.stale_after_secs),
            queue_interval: Duration::from_millis(self.recon.queue_interval_ms),
            catch_up_days: self.recon.catch_up_days,
            connected_accounts: self.provider.charges_in_connected_accounts(),
        }
    }

    fn validate(&self) -> Result<(), InvalidSettings> {
        let rule = |ok: bool, message: &str| if ok { Ok(()) } else { Err(InvalidSettings::Rule(message.to_owned())) };
        self.webhooks.parsed_secrets().map_err(|e| InvalidSettings::Rule(format!("webhooks.secrets: {e}")))?;
        rule(self.webhooks.tolerance_secs > 0, "webhooks.tolerance_secs must be positive")?;
        rule(self.poller.batch_size > 0, "poller.batch_size must be positive")?;
        rule(self.poller.concurrency > 0, "poller.concurrency must be positive")?;
        // The provider in use: a Stripe lookup is bounded by its deadline across all its calls, the
        // simulator's by one call's timeouts.
        let longest_lookup_ms = self.provider.longest_lookup().as_millis();
        rule(
            u128::from(self.poller.lease_ms) > longest_lookup_ms,
            &format!(
                "poller.lease_ms ({}) must exceed the longest lookup of the provider in use ({longest_lookup_ms} ms: \
                 the simulator's connect plus request timeouts, or stripe.lookup_deadline_ms), or a lookup could \
                 outlive its lease",
                self.poller.lease_ms
            ),
        )?;
        rule(self.poller.max_attempts > 0, "poller.max_attempts must be positive")?;
        self.provider.validate().map_err(InvalidSettings::Rule)?;
        rule(self.sweeper.batch_size > 0, "sweeper.batch_size must be positive")?;
        rule(self.reaper.batch_size > 0, "reaper.batch_size must be positive")?;
        rule(self.recon.page_size > 0, "recon.page_size must be positive")?;
        rule(self.operators.proposal_ttl_secs > 0, "operators.proposal_ttl_secs must be positive")?;
        rule(
            (1..=self.operators.max_token_ttl_days).contains(&self.operators.token_ttl_days),
            "operators.token_ttl_days must be between 1 and operators.max_token_ttl_days",
        )?;
        let o = &self.operators;
        rule(
            0 < o.session_idle_secs && o.session_idle_secs <= o.session_max_secs,
            "operators.session_idle_secs must be positive and at most operators.session_max_secs",
        )?;
        rule(o.fresh_sign_in_secs > 0, "operators.fresh_sign_in_secs must be positive")?;
        rule(
            o.sign_in_attempts > 0 && o.sign_in_window_secs > 0 && o.sign_in_source_attempts > 0,
            "operators.sign_in_attempts, sign_in_source_attempts and sign_in_window_secs must be positive",
        )?;
        rule(o.max_concurrent_password_hashes > 0, "operators.max_concurrent_password_hashes must be positive")?;
        rule(o.enrollment_ttl_secs > 0, "operators.enrollment_ttl_secs must be positive")?;
        if let Some(name) = &o.break_glass {
            oncepay_ops::operators::OperatorName::parse(name)
                .map_err(|e| InvalidSettings::Rule(format!("operators.break_glass: {e}")))?;
        }
        rule(self.recon.stale_after_secs > 0, "recon.stale_after_secs must be positive")?;
        rule(self.recon.queue_interval_ms > 0, "recon.queue_interval_ms must be positive")?;
        tokio_cron_scheduler::Job::new_async(self.recon.schedule.as_str(), |_, _| Box::pin(async {})).map_err(
            |_| {
                InvalidSettings::Rule(format!(
                    "recon.schedule {:?} is not a six-field cron expression (sec min hour day month weekday)",
                    self.recon.schedule
                ))
            },
        )?;
        rule(self.recon.catch_up_days > 0, "recon.catch_up_days must be at least 1 (yesterday)")?;
        rule(self.backlog.interval_ms > 0, "backlog.interval_ms must be positive")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_defaults_load_and_validate() {
        let settings: Settings = config::load(DEFAULTS, None).unwrap();
        settings.validate().unwrap();
        assert_eq!(settings.http.port, 8082);
        assert_eq!(settings.webhooks.tolerance_secs, 300);
        assert!(settings.webhooks.secrets.is_empty(), "a default secret would be a published one");
    }

    #[test]
    fn serving_without_a_webhook_secret_is_refused_and_says_which_setting_to_set() {
        let mut settings: Settings = config::load(DEFAULTS, None).unwrap();

        let refused = settings.webhooks.serving_secrets(ProviderKind::Simulator);
        settings.webhooks.secrets = vec![SecretString::from("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")];
        let served = settings.webhooks.serving_secrets(ProviderKind::Simulator);

        assert!(matches!(refused, Err(InvalidSettings::Rule(rule)) if rule.contains("ONCEPAY_WEBHOOKS__SECRETS")));
        assert_eq!(served.unwrap().simulator.len(), 1);
    }

    #[test]
    fn serving_stripe_needs_a_stripe_secret_whatever_the_simulator_has() {
        let mut settings: Settings = config::load(DEFAULTS, None).unwrap();
        settings.webhooks.secrets = vec![SecretString::from("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")];

        let refused = settings.webhooks.serving_secrets(ProviderKind::Stripe);
        settings.webhooks.stripe_secrets = vec![SecretString::from("whsec_test_stripe_endpoint_secret")];
        let served = settings.webhooks.serving_secrets(ProviderKind::Stripe);

        assert!(
            matches!(refused, Err(InvalidSettings::Rule(rule)) if rule.contains("ONCEPAY_WEBHOOKS__STRIPE_SECRETS"))
        );
        assert_eq!(served.unwrap().stripe.len(), 1);
    }

    #[test]
    fn a_schedule_that_is_not_cron_is_refused() {
        let mut settings: Settings = config::load(DEFAULTS, None).unwrap();
        settings.recon.schedule = "every night".into();
        assert!(matches!(settings.validate(), Err(InvalidSettings::Rule(rule)) if rule.contains("recon.schedule")));
    }

    #[test]
    fn a_lease_shorter_than_a_lookup_is_refused() {
        let mut settings: Settings = config::load(DEFAULTS, None).unwrap();
        settings.poller.lease_ms = settings.provider.request_timeout_ms;
        assert!(matches!(settings.validate(), Err(InvalidSettings::Rule(rule)) if rule.contains("poller.lease_ms")));
    }

    #[test]
    fn a_lease_that_covers_one_stripe_call_but_not_a_whole_lookup_is_refused() {
        let mut settings: Settings = config::load(DEFAULTS, None).unwrap();
        settings.provider.kind = ProviderKind::Stripe;
        // One call takes at most 2 s + 1 s; a lookup is a search and up to 20 list pages.
        let stripe = serde_json::json!({
            "mode": "direct", "secret_key": "sk_test_x", "api_version": "2024-06-20", "request_timeout_ms": 1000
        });
        settings.provider.stripe = Some(serde_json::from_value(stripe).unwrap());
        settings.poller.lease_ms = 5_000;

        assert!(
            matches!(settings.validate(), Err(InvalidSettings::Rule(rule)) if rule.contains("poller.lease_ms")),
            "a lookup of 21 calls could outlive a 5 s lease"
        );
    }

    #[test]
    fn the_lease_is_measured_against_the_timeouts_of_the_provider_in_use() {
        let mut settings: Settings = config::load(DEFAULTS, None).unwrap();
        settings.provider.kind = ProviderKind::Stripe;
        let stripe = serde_json::json!({
            "mode": "direct", "secret_key": "sk_test_x", "api_version": "2024-06-20", "request_timeout_ms": 1000,
            "lookup_deadline_ms": 4000
        });
        settings.provider.stripe = Some(serde_json::from_value(stripe).unwrap());
        settings.provider.request_timeout_ms = 120_000;
        settings.poller.lease_ms = 5_000;
        settings.validate().expect("a 4 s Stripe lookup fits in a 5 s lease; the simulator's timeout does not apply");

        settings.provider.stripe.as_mut().unwrap().lookup_deadline_ms = 6_000;
        assert!(
            matches!(settings.validate(), Err(InvalidSettings::Rule(rule)) if rule.contains("poller.lease_ms")),
            "a 6 s lookup outlasts a 5 s lease"
        );
        settings.provider.stripe.as_mut().unwrap().lookup_deadline_ms = 2_500;
        assert!(
            matches!(settings.validate(), Err(InvalidSettings::Rule(rule)) if rule.contains("lookup_deadline_ms")),
            "a deadline shorter than one call (2 s + 1 s) leaves no lookup a chance"
        );
    }
}
