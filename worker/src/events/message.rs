//! What a delivery carries, the same whichever way it goes: the body (the event's type, when it was
//! written, and its data) and the Standard Webhooks headers that sign it (`webhook-id`,
//! `webhook-timestamp`, `webhook-signature`), one `v1` signature per current secret.

use serde_json::json;
use time::OffsetDateTime;

use oncepay_store::merchant_deliveries::ClaimedDelivery;
use oncepay_webhook_signature::WebhookSecret;

/// A delivery's body and the headers that sign it, for one attempt.
#[derive(Debug, Clone)]
pub struct Signed {
    /// `webhook-id`: the event's id, the same on every attempt and replay.
    pub id: String,
    /// `webhook-timestamp`: when this attempt was signed, in Unix seconds.
    pub timestamp: i64,
    /// `webhook-signature`: `v1,<base64>` per current secret, space-separated.
    pub signature: String,
    /// The JSON body.
    pub body: Vec<u8>,
}

impl Signed {
    /// The attempt of `claimed` signed at `now`. Fails only on a secret the store should never
    /// hold, or an event time that cannot be written.
    pub fn of(claimed: &ClaimedDelivery, now: OffsetDateTime) -> Result<Self, String> {
        let written = claimed
            .created_at
            .format(&time::format_description::well_known::Rfc3339)
            .map_err(|e| format!("cannot write the event's time: {e}"))?;
        let body =
            serde_json::to_vec(&json!({ "type": claimed.event_type, "timestamp": written, "data": claimed.data }))
                .map_err(|e| format!("cannot write the event: {e}"))?;
        let id = claimed.event_id.to_string();
        let timestamp = now.unix_timestamp();
        let signature = claimed
            .secrets
            .iter()
            .map(|text| WebhookSecret::parse(text).map(|secret| secret.sign(&id, timestamp, &body)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?
            .join(" ");
        Ok(Self { id, timestamp, signature, body })
    }
}
