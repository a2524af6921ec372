//! What every handler of one HTTP worker shares ([`AppState`]), and the check every request
//! passes before anything else ([`AppState::admit`]).

use std::sync::Arc;

use actix_web::HttpRequest;
use oncepay_store::connections::Connections;
use oncepay_store::notify::Wakeups;
use tokio_util::sync::CancellationToken;

use crate::accept_groups::AcceptGroups;
use crate::auth::{Authenticator, Caller};
use crate::errors::ApiError;
use crate::provider_intake::ProviderIntake;
use crate::rate_limit::RateLimits;
use crate::replay_cache::ReplayCache;
use crate::rereads::Rereads;
use crate::settings::{EventsSettings, IntakeSettings, LongPollSettings};
use crate::watch::Watch;

/// What every handler of one HTTP worker shares.
pub struct AppState {
    /// This worker's connections.
    pub connections: Arc<Connections>,
    /// Requests of one tenant being written together (shared by the process).
    pub accepts: Arc<AcceptGroups>,
    /// API key verification (shared by the process).
    pub auth: Arc<Authenticator>,
    /// Per-tenant buckets (shared by the process).
    pub limits: Arc<RateLimits>,
    /// Long polls waiting for payments and refunds to change (shared by the process).
    pub watch: Arc<Watch>,
    /// Their re-reads, coalesced (shared by the process).
    pub rereads: Rereads,
    /// `[intake]`.
    pub intake: IntakeSettings,
    /// `[long_poll]`.
    pub long_poll: LongPollSettings,
    /// Cancelled when the process begins to shut down: long polls respond at once.
    pub draining: CancellationToken,
    /// Asks the process's outbox notifier to wake the workers (shared by the process).
    pub wake: Wakeups,
    /// Final responses, for replays without a database read (shared by the process).
    pub replays: Arc<ReplayCache>,
    /// What the configured provider could never charge, and which account a payment is charged to.
    pub provider_intake: ProviderIntake,
    /// `[events]`.
    pub events: EventsSettings,
}

impl AppState {
    /// Authenticates the request and takes one request from its tenant's rate limit.
    pub async fn admit(&self, request: &HttpRequest) -> Result<Caller, ApiError> {
        let caller = self.auth.authenticate(request.headers(), &self.connections).await?;
        self.limits.admit(&caller)?;
        Ok(caller)
    }
}
