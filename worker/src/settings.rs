//! The worker's settings: `config/default.toml` (embedded, and the documentation of every key), then
//! an optional file, then the environment, loaded and checked once in `main`.
//!
//! [`Settings::drainer_config`] turns them into the [`DrainerConfig`] the drainer runs with, so the
//! drainer itself never sees configuration files and tests build a [`DrainerConfig`] directly.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use oncepay_provider::ProviderSettings;
use oncepay_service::backoff::Backoff;
use oncepay_service::config::{self, DatabaseSettings, HttpSettings, TelemetrySettings};
use secrecy::SecretString;
use serde::Deserialize;

use crate::drainer::DrainerConfig;
use crate::events::EventSenderConfig;
use crate::events::verdict::Rules;
use oncepay_domain::endpoint_url::UrlPolicy;

/// The embedded defaults.
pub const DEFAULTS: &str = include_str!("../config/default.toml");

/// Everything the worker binary is configured with.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// The operations endpoints.
    pub http: HttpSettings,
    /// PostgreSQL.
    pub database: DatabaseSettings,
    /// Logs and traces.
    pub telemetry: TelemetrySettings,
    /// The payment provider.
    pub provider: ProviderSettings,
    /// The drainer.
    pub worker: WorkerSettings,
    /// Delivering events to merchants.
    pub events: EventSettings,
}

/// The `[events]` section.
#[derive(Debug, Clone, Deserialize)]
pub struct EventSettings {
    /// Most deliveries one claim takes.
    pub batch_size: u32,
    /// Most deliveries in flight at once.
    pub max_in_flight: u32,
    /// Most deliveries in flight to one endpoint, across all workers.
    pub per_endpoint: u32,
    /// How long one attempt may take, in milliseconds.
    pub timeout_ms: u64,
    /// How long a claimed delivery stays leased, in seconds.
    pub lease_secs: u64,
    /// How often to look for due deliveries, in milliseconds.
    pub poll_interval_ms: u64,
    /// The delays before the second, third, … attempt, in seconds (fractions allowed).
    pub retry_schedule_secs: Vec<f64>,
    /// The longest `Retry-After` honoured, in seconds.
    pub retry_after_cap_secs: u64,
    /// How long an endpoint may fail before it is disabled, in seconds.
    pub disable_after_secs: u64,
    /// Plain `http` endpoints (tests and local runs only).
    pub allow_http: bool,
    /// Endpoints at loopback, private and link-local addresses (tests and local runs only).
    pub allow_private_addresses: bool,
    /// The RabbitMQ node endpoints that are exchanges are published to, an `amqp://` URL; unset,
    /// events go over HTTP only.
    #[serde(default)]
    pub broker_url: Option<SecretString>,
}

impl EventSettings {
    /// What URLs the HTTP sender may send to, beyond public `https`.
    pub const fn policy(&self) -> UrlPolicy {
        // The HTTP sender checks URLs only; an exchange goes to the publisher, which needs
        // `broker_url` and checks the exchange's name itself.
        UrlPolicy {
            allow_http: self.allow_http,
            allow_private_addresses: self.allow_private_addresses,
            allow_exchanges: false,
        }
    }
}

/// The `[worker]` section.
#[derive(Debug, Clone, Deserialize)]
pub struct WorkerSettings {
    /// This worker's name in leases and the audit trail; `<hostname>-<pid>` when unset.
    #[serde(default)]
    pub id: Option<String>,
    /// Most rows one claim takes.
    pub batch_size: u32,
    /// Most provider calls in flight at once.
    pub max_in_flight: u32,
    /// How long a claimed row stays leased, in seconds.
    pub lease_secs: u64,
    /// How often to look for due rows without a notification, in milliseconds.
    pub poll_interval_ms: u64,
    /// How many claims one queued send gets while the provider cannot be reached.
    pub max_attempts: u32,
    /// Delays between those claims.
    pub backoff: Backoff,
    /// How long in-flight calls may take to finish after SIGTERM, in seconds.
    pub shutdown_grace_secs: u64,
}

impl Settings {
    /// Loads the defaults, then `file`, then the environment, and checks the result.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let settings: Self =
            config::load(DEFAULTS, file).map_err(|e| anyhow::anyhow!(e)).context("loading settings")?;
        settings.validate()?;
        Ok(settings)
    }

    /// Rejects combinations that would break the worker's guarantees or stall it.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            self.http.ops_port.is_none(),
            "http.ops_port does not apply to the worker: it serves only the operations endpoints, on http.port"
        );
        let worker = &self.worker;
        ensure!(worker.batch_size >= 1, "worker.batch_size must be at least 1");
        ensure!(worker.max_in_flight >= 1, "worker.max_in_flight must be at least 1");
        ensure!(worker.max_attempts >= 1, "worker.max_attempts must be at least 1");
        ensure!(worker.poll_interval_ms >= 1, "worker.poll_interval_ms must be at least 1");
        ensure!(worker.id.as_deref().is_none_or(|id| !id.trim().is_empty()), "worker.id must not be blank");
        // A lease that can run out while the provider call is still allowed to run hands a live
        // payment to another worker; the resend then meets the first call at the provider.
        let longest_call_ms = self.provider.longest_call().as_millis();
        ensure!(
            u128::from(worker.lease_secs) * 1000 > longest_call_ms,
            "worker.lease_secs ({} s) must exceed the provider's connect plus request timeouts ({} ms)",
            worker.lease_secs,
            longest_call_ms,
        );
        self.provider.validate().map_err(anyhow::Error::msg)?;
        let events = &self.events;
        ensure!(events.batch_size >= 1, "events.batch_size must be at least 1");
        ensure!(events.max_in_flight >= 1, "events.max_in_flight must be at least 1");
        ensure!(events.per_endpoint >= 1, "events.per_endpoint must be at least 1");
        ensure!(events.poll_interval_ms >= 1, "events.poll_interval_ms must be at least 1");
        ensure!(
            events.retry_schedule_secs.iter().all(|secs| secs.is_finite() && *secs >= 0.0),
            "events.retry_schedule_secs must hold durations of zero seconds or more"
        );
        // A lease that runs out under a live attempt hands the delivery to another worker while the
        // first one is still sending it.
        ensure!(
            u128::from(events.lease_secs) * 1000 > u128::from(events.timeout_ms),
            "events.lease_secs ({} s) must exceed events.timeout_ms ({} ms)",
            events.lease_secs,
            events.timeout_ms,
        );
        // The listener holds one connection for good; claims and records need at least one more.
        ensure!(self.database.max_connections >= 2, "database.max_connections must be at least 2");
        Ok(())
    }

    /// The event sender's configuration, under the drainer's worker name.
    pub fn event_sender_config(&self) -> EventSenderConfig {
        let events = &self.events;
        EventSenderConfig {
            worker_id: self.drainer_config().worker_id,
            batch_size: events.batch_size,
            max_in_flight: events.max_in_flight,
            per_endpoint: events.per_endpoint,
            lease: Duration::from_secs(events.lease_secs),
            poll_interval: Duration::from_millis(events.poll_interval_ms),
            rules: Rules {
                schedule: events.retry_schedule_secs.iter().copied().map(Duration::from_secs_f64).collect(),
                retry_after_cap: Duration::from_secs(events.retry_after_cap_secs),
                disable_after: Duration::from_secs(events.disable_after_secs),
            },
        }
    }

    /// The drainer's configuration, naming this worker `<hostname>-<pid>` unless `worker.id` is set.
    pub fn drainer_config(&self) -> DrainerConfig {
        let worker = &self.worker;
        DrainerConfig {
            worker_id: worker.id.clone().unwrap_or_else(default_worker_id),
            batch_size: worker.batch_size,
            max_in_flight: worker.max_in_flight,
            lease: Duration::from_secs(worker.lease_secs),
            poll_interval: Duration::from_millis(worker.poll_interval_ms),
            max_attempts: worker.max_attempts,
            backoff: worker.backoff,
            key_window: self.provider.key_window(),
            shutdown_grace: Duration::from_secs(worker.shutdown_grace_secs),
        }
    }
}

/// `<hostname>-<pid>`: unique among live processes, and readable in `outbox.locked_by`.
fn default_worker_id() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Settings {
        config::load(DEFAULTS, None).unwrap()
    }

    #[test]
    fn the_embedded_defaults_load_and_are_valid() {
        let settings = defaults();

        settings.validate().unwrap();
        assert_eq!(settings.http.port, 8081);
        let drainer = settings.drainer_config();
        assert_eq!(drainer.key_window.resend_horizon(), Duration::from_secs(86_400 - 3_600));
        assert!(drainer.worker_id.ends_with(&format!("-{}", std::process::id())), "{}", drainer.worker_id);
    }

    #[test]
    fn the_default_retry_schedule_is_the_published_one() {
        let events = defaults().event_sender_config();
        let published: Vec<Duration> =
            crate::events::verdict::DEFAULT_SCHEDULE_SECS.iter().copied().map(Duration::from_secs).collect();

        assert_eq!(events.rules.schedule, published);
        assert_eq!(events.rules.disable_after, Duration::from_secs(5 * 86_400));
    }

    #[test]
    fn an_event_lease_shorter_than_an_attempt_is_refused() {
        let mut settings = defaults();
        settings.events.timeout_ms = 60_000;

        assert!(settings.validate().is_err());
    }

    #[test]
    fn a_configured_id_is_used_as_is() {
        let mut settings = defaults();
        settings.worker.id = Some("worker-7".into());

        assert_eq!(settings.drainer_config().worker_id, "worker-7");
    }

    #[test]
    fn a_config_file_chooses_stripe_and_its_longer_timeouts_bound_the_lease() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        let stripe = "[provider]\nkind = \"stripe\"\n\n[provider.stripe]\nmode = \"connect\"\nsecret_key = \"sk_test_x\"\n\
                      api_version = \"2024-06-20\"\nrequest_timeout_ms = 57000\nlookup_deadline_ms = 70000\n";
        std::io::Write::write_all(&mut file, stripe.as_bytes()).unwrap();
        let mut settings: Settings = config::load(DEFAULTS, Some(file.path())).unwrap();

        assert_eq!(settings.provider.kind, oncepay_provider::ProviderKind::Stripe);
        assert_eq!(settings.provider.stripe.as_ref().unwrap().api_version, "2024-06-20");
        settings.validate().unwrap();
        // Stripe's connect (2 s by default) plus request timeout now exceed the 60 s lease.
        settings.provider.stripe.as_mut().unwrap().request_timeout_ms = 59_000;
        assert!(settings.validate().is_err(), "a lease shorter than a Stripe call is refused");
    }

    #[test]
    fn settings_that_break_a_guarantee_are_rejected() {
        type Edit = fn(&mut Settings);
        let cases: [(&str, Edit); 6] = [
            ("lease shorter than a call", |s| s.worker.lease_secs = 5),
            ("margin as wide as the window", |s| s.provider.key_window_margin_secs = s.provider.key_window_secs),
            ("no attempts", |s| s.worker.max_attempts = 0),
            ("no slots", |s| s.worker.max_in_flight = 0),
            ("one connection", |s| s.database.max_connections = 1),
            ("blank id", |s| s.worker.id = Some(" ".into())),
        ];
        for (name, edit) in cases {
            let mut settings = defaults();
            edit(&mut settings);
            assert!(settings.validate().is_err(), "{name}");
        }
    }
}
