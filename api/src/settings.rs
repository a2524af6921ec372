//! The api's settings: the shared pieces (`[http]`, `[database]`, `[telemetry]`) plus its own
//! (`[intake]`, `[auth]`, `[long_poll]`, `[provider]`, `[broker]`, `[events]`), loaded once, in
//! `main` (or by a test).
//!
//! Values that would make the service misbehave are rejected at load time, never found on the
//! request path. Nothing here reads the environment itself.

use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use oncepay_domain::endpoint_url::UrlPolicy;
use oncepay_service::config::{self, DatabaseSettings, HttpSettings, TelemetrySettings};
use oncepay_service::group_commit::Limits;
use secrecy::SecretString;
use serde::Deserialize;

use crate::provider_intake::{ProviderIntake, ProviderIntakeSettings};

/// The largest `intake.group_max_requests`: a group is one statement, its arrays sent whole.
const MAX_GROUP_REQUESTS: usize = 1000;

/// The longest `events.rotation_overlap_secs`: thirty days.
const MAX_ROTATION_OVERLAP_SECS: u64 = 30 * 86_400;

/// The embedded defaults.
pub const DEFAULTS: &str = include_str!("../config/default.toml");

/// Everything the api is configured with.
#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    /// `[http]`: where to listen, and how long a graceful stop may take.
    pub http: ApiHttpSettings,
    /// `[database]`: PostgreSQL.
    pub database: DatabaseSettings,
    /// `[telemetry]`: logs and traces.
    pub telemetry: TelemetrySettings,
    /// `[intake]`: the rules of `POST /v1/payments` and `POST /v1/payments/{id}/refunds`.
    pub intake: IntakeSettings,
    /// `[auth]`: the cache of verified API keys.
    pub auth: AuthSettings,
    /// `[long_poll]`: `Prefer: wait=N` on `GET /v1/payments/{id}` and `GET /v1/refunds/{id}`.
    pub long_poll: LongPollSettings,
    /// `[provider]`: which provider the workers charge through, for what intake refuses up front.
    pub provider: ProviderIntakeSettings,
    /// `[broker]`: the RabbitMQ queue payments are also taken from, if any.
    pub broker: BrokerSettings,
    /// `[events]`: the webhook endpoints merchants save (`/v1/webhook-endpoints`).
    pub events: EventsSettings,
}

/// `[events]`: what a merchant's webhook endpoint may be, and how its secret is rotated.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct EventsSettings {
    /// `allow_http`, `allow_private_addresses` and `allow_exchanges`: the endpoints allowed beyond
    /// public `https` URLs.
    #[serde(flatten)]
    pub urls: UrlPolicy,
    /// How long an endpoint's previous secret keeps signing after the merchant rotates it.
    pub rotation_overlap_secs: u64,
}

impl EventsSettings {
    /// The rotation overlap as a duration.
    pub fn rotation_overlap(&self) -> Duration {
        Duration::from_secs(self.rotation_overlap_secs)
    }
}

/// `[broker]`: the queue the api takes payment requests from, beside HTTP, and its companions.
#[derive(Debug, Clone, Deserialize)]
pub struct BrokerSettings {
    /// The RabbitMQ node, an `amqp://` URL; unset, the api takes payments over HTTP only.
    #[serde(default)]
    pub url: Option<SecretString>,
    /// The queue producers publish payment requests to.
    pub queue: String,
    /// Deliveries of one message after which RabbitMQ dead-letters it.
    pub delivery_limit: u32,
    /// Where messages that will never be payments go: an exchange, and a queue bound to it.
    pub dead_letter_exchange: String,
    /// The queue that keeps them for an operator.
    pub dead_letter_queue: String,
    /// Where a message waits before it is delivered again.
    pub delay_queue: String,
    /// How long it waits there.
    pub delay_ms: u64,
    /// Messages the api holds at once, unacknowledged, and takes concurrently.
    pub prefetch: u16,
    /// How often the queues' depths are sampled for the metrics.
    pub sample_interval_ms: u64,
}

/// `[http]`: the shared `host` and `port`, and the api's grace period.
#[derive(Debug, Clone, Deserialize)]
pub struct ApiHttpSettings {
    /// `host` and `port`.
    #[serde(flatten)]
    pub listen: HttpSettings,
    /// HTTP worker threads; 0 means one per CPU.
    pub workers: usize,
    /// How long in-flight requests may take to finish after SIGTERM.
    pub shutdown_grace_secs: u64,
}

/// `[intake]`.
#[derive(Debug, Clone, Deserialize)]
pub struct IntakeSettings {
    /// How long a key is kept after its first use.
    pub key_retention_secs: u64,
    /// The pool's `lock_timeout`: how long to wait for a concurrent writer of the same key (409 after).
    pub key_lock_wait_ms: u64,
    /// `Retry-After` on 202, 409 and 503 responses.
    pub retry_after_secs: u64,
    /// The largest body accepted.
    pub max_body_bytes: usize,
    /// A tenant's requests per second when it has no limit of its own.
    pub default_rate_limit_per_second: NonZeroU32,
    /// The burst allowed on top of the default rate.
    pub default_rate_limit_burst: NonZeroU32,
    /// The most bytes of final responses remembered for replays; 0 remembers none.
    pub replay_cache_bytes: u64,
    /// The most requests of one tenant written in one statement and commit; 1 writes each alone.
    pub group_max_requests: usize,
    /// How long (µs) a request waits for its tenant's write under way before a write of its own
    /// starts beside it.
    pub group_max_wait_us: u64,
}

impl IntakeSettings {
    /// Key retention as a duration.
    pub fn key_retention(&self) -> Duration {
        Duration::from_secs(self.key_retention_secs)
    }

    /// How long intake waits for a concurrent writer of the same key (`key_lock_wait_ms`).
    pub fn key_lock_wait(&self) -> Duration {
        Duration::from_millis(self.key_lock_wait_ms)
    }

    /// How requests are grouped.
    pub fn group_limits(&self) -> Limits {
        Limits { max_items: self.group_max_requests, max_wait: Some(Duration::from_micros(self.group_max_wait_us)) }
    }
}

/// `[auth]`.
#[derive(Debug, Clone, Deserialize)]
pub struct AuthSettings {
    /// How long a verified key or broker user is admitted without a database read; past it, it is
    /// read again or the request (the message) fails closed. 0 disables the cache.
    pub cache_ttl_secs: u64,
    /// The most keys remembered at once (and, separately, the most refused keys).
    pub cache_max_entries: usize,
    /// The most reads at once, per process, of keys this process has not verified; as many again
    /// for reading the keys it has verified once their TTL has passed.
    pub max_concurrent_lookups: usize,
    /// How long a request waits for a place among those reads before it gets a 503.
    pub lookup_wait_ms: u64,
}

/// `[long_poll]`.
#[derive(Debug, Clone, Deserialize)]
pub struct LongPollSettings {
    /// The longest wait honoured.
    pub max_wait_secs: u64,
    /// The most long polls this process holds at once; beyond it, a status request gets its
    /// response at once, as if it had not asked to wait.
    pub max_waiting: usize,
    /// The most long polls one tenant holds at once in this process; beyond it, likewise.
    pub max_waiting_per_tenant: usize,
}

impl Settings {
    /// Loads the embedded defaults (`config/default.toml`, which documents every key), then `file`
    /// if given, then the environment, through [`oncepay_service::config::load`], and checks the
    /// result.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let settings: Self = config::load(DEFAULTS, file).context("invalid configuration")?;
        settings.validate()?;
        Ok(settings)
    }

    /// Rejects what the types cannot (a zero rate already fails to parse as a `NonZeroU32`): a zero
    /// body limit, key retention, lock wait, connection count or lookup budget, a group size out of
    /// range, and a rotation overlap past thirty days.
    fn validate(&self) -> anyhow::Result<()> {
        ensure!(self.intake.max_body_bytes > 0, "intake.max_body_bytes must be positive");
        ensure!(self.intake.key_retention_secs > 0, "intake.key_retention_secs must be positive");
        ensure!(self.intake.key_lock_wait_ms > 0, "intake.key_lock_wait_ms must be positive (0 would wait forever)");
        ensure!(self.database.max_connections > 0, "database.max_connections must be positive");
        ensure!(self.auth.max_concurrent_lookups > 0, "auth.max_concurrent_lookups must be positive");
        ensure!(
            (1..=MAX_GROUP_REQUESTS).contains(&self.intake.group_max_requests),
            "intake.group_max_requests must be between 1 (no grouping) and {MAX_GROUP_REQUESTS}"
        );
        ensure!(
            self.events.rotation_overlap_secs <= MAX_ROTATION_OVERLAP_SECS,
            "events.rotation_overlap_secs must be at most {MAX_ROTATION_OVERLAP_SECS} (thirty days)"
        );
        ProviderIntake::new(&self.provider)?;
        let broker = &self.broker;
        ensure!(broker.prefetch > 0, "broker.prefetch must be positive");
        ensure!(broker.delivery_limit > 0, "broker.delivery_limit must be positive");
        ensure!(broker.delay_ms > 0, "broker.delay_ms must be positive");
        ensure!(broker.sample_interval_ms > 0, "broker.sample_interval_ms must be positive");
        let names = [&broker.queue, &broker.dead_letter_queue, &broker.delay_queue];
        ensure!(
            names.iter().all(|name| !name.is_empty())
                && names[0] != names[1]
                && names[1] != names[2]
                && names[0] != names[2],
            "broker.queue, broker.dead_letter_queue and broker.delay_queue must be three different names"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_defaults_load_and_match_the_documented_values() {
        let settings: Settings = config::load(DEFAULTS, None).unwrap();

        assert!(settings.validate().is_ok());
        assert_eq!(settings.http.listen.port, 8080);
        assert_eq!(settings.intake.key_retention_secs, 86_400);
        assert_eq!(settings.intake.max_body_bytes, 64 * 1024);
        assert_eq!(settings.long_poll.max_wait_secs, 30);
        assert_eq!(settings.intake.group_max_requests, 64);
        assert_eq!(
            settings.events.urls,
            UrlPolicy { allow_http: false, allow_private_addresses: false, allow_exchanges: false }
        );
        assert_eq!(settings.events.rotation_overlap(), Duration::from_secs(86_400));
    }

    #[test]
    fn a_rotation_overlap_past_thirty_days_is_refused() {
        let mut settings: Settings = config::load(DEFAULTS, None).unwrap();
        for (secs, valid) in [(0, true), (MAX_ROTATION_OVERLAP_SECS, true), (MAX_ROTATION_OVERLAP_SECS + 1, false)] {
            settings.events.rotation_overlap_secs = secs;
            assert_eq!(settings.validate().is_ok(), valid, "{secs}");
        }
    }

    #[test]
    fn a_group_size_of_zero_or_past_the_largest_is_refused() {
        let mut settings: Settings = config::load(DEFAULTS, None).unwrap();
        for (size, valid) in [(0, false), (1, true), (MAX_GROUP_REQUESTS, true), (MAX_GROUP_REQUESTS + 1, false)] {
            settings.intake.group_max_requests = size;
            assert_eq!(settings.validate().is_ok(), valid, "{size}");
        }
    }
}
