//! A merchant's webhook endpoint as the API shows it: where its events go and whether they still
//! do. Its secret is shown once, when it is made or rotated, and never again.

use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

/// The public form of an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct EndpointResource {
    /// The endpoint's id.
    pub id: Uuid,
    /// Where deliveries are sent (`https`).
    pub url: String,
    /// The merchant's note.
    pub description: String,
    /// The event types it receives; empty means every type.
    pub event_types: Vec<String>,
    /// Whether deliveries are made.
    pub enabled: bool,
    /// Why deliveries stopped, while it is disabled: `gone` (it answered 410), `failing` (every
    /// attempt failed for `events.disable_after_secs`, five days by default) or `merchant`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<String>,
    /// When it was made (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When it last changed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}
