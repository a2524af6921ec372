//! The reconciler's webhook endpoint against forged deliveries: what a forged delivery costs the
//! reconciler next to a genuine one, and how long `/healthz` takes while forgeries arrive next to
//! the same when nothing does. Measured in the same run, reported as ratios.
//!
//! The load is a closed loop of `reqwest` requests from tasks of the benchmark process
//! ([`crate::closed_loop`]), so its CPU time is the `bench` role's, not the reconciler's.

use std::collections::BTreeMap;

use oncepay_provider::wire::{EventType, WebhookEvent};
use oncepay_provider::{Charge, ChargeStatus};
use oncepay_webhook_signature::WebhookSecret;

use crate::closed_loop::Window;
use crate::measure::Timing;

/// Candidates in a forged `webhook-signature` header: far more than a sender ever sends (one, two
/// during a rotation), within the 32 KiB a request's headers may take.
pub const FORGED_SIGNATURES: usize = 300;

/// A forged delivery's body: large, to make each hash of it count (the reconciler takes up to 256 KiB).
pub const FORGED_BODY_BYTES: usize = 60 * 1024;

/// What the requests are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Deliveries signed anew per request with the reconciler's secret, each with its own
    /// `webhook-id`, for a charge of no payment of ours: verified, parsed and looked up, and the
    /// reconciler responds 200.
    Genuine,
    /// Deliveries with [`FORGED_SIGNATURES`] made-up signatures and a [`FORGED_BODY_BYTES`] body;
    /// the reconciler responds 401.
    Forged,
    /// `GET /healthz`.
    Health,
}

/// The requests of one load, built once.
struct Requests {
    load: Load,
    base: String,
    secret: WebhookSecret,
    genuine_body: Vec<u8>,
    forged_body: Vec<u8>,
    forged_signature: String,
}

impl Requests {
    fn new(load: Load, base: &str, secret: WebhookSecret) -> anyhow::Result<Self> {
        let charge = Charge {
            id: "ch_bench".into(),
            status: ChargeStatus::Succeeded,
            amount: 1999,
            currency: "EUR".into(),
            customer: "cus_bench".into(),
            idempotency_key: "oncepay-bench".into(),
            created: 0,
            metadata: BTreeMap::new(),
            failure_code: None,
            failure_message: None,
            payment_method: None,
            account: None,
        };
        let event = WebhookEvent { event_type: EventType::ChargeSucceeded, created: 0, data: charge };
        // Any 32 bytes make a well-formed candidate that matches nothing.
        let candidate = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        Ok(Self {
            load,
            base: base.to_owned(),
            secret,
            genuine_body: serde_json::to_vec(&event)?,
            forged_body: vec![b' '; FORGED_BODY_BYTES],
            forged_signature: vec![candidate; FORGED_SIGNATURES].join(" "),
        })
    }

    /// Request number `number` (each genuine delivery has an id of its own).
    fn build(&self, client: &reqwest::Client, number: u64) -> reqwest::RequestBuilder {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        match self.load {
            Load::Health => client.get(format!("{}/healthz", self.base)),
            Load::Genuine => {
                let id = format!("msg_bench_{number}");
                let signature = self.secret.sign(&id, now, &self.genuine_body);
                self.delivery(client, &id, now, &signature, self.genuine_body.clone())
            }
            Load::Forged => self.delivery(client, "msg_forged", now, &self.forged_signature, self.forged_body.clone()),
        }
    }

    fn delivery(
        &self,
        client: &reqwest::Client,
        id: &str,
        timestamp: i64,
        signature: &str,
        body: Vec<u8>,
    ) -> reqwest::RequestBuilder {
        client
            .post(format!("{}/webhooks/provider", self.base))
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
    }
}

/// Runs `connections` closed loops of `load` against the reconciler at `base` (`http://host:port`)
/// from now until the window that opens after the warm-up closes; returns what it measured.
pub async fn closed_loop(
    base: &str,
    secret: &WebhookSecret,
    load: Load,
    connections: usize,
    timing: Timing,
) -> anyhow::Result<Window> {
    let requests = Requests::new(load, base, secret.clone())?;
    crate::closed_loop::run(connections, timing, move |client, number| requests.build(client, number)).await
}
