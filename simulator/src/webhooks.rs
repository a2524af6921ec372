//! Webhook delivery: every charge outcome becomes a `charge.succeeded` / `charge.failed` event, and
//! every refund a `refund.updated` / `refund.failed` one, POSTed to the configured URL with Standard Webhooks signature headers and retried with jittered
//! backoff, under the webhook faults (drop, delay, duplicate, reorder).
//!
//! Invariants: an event has one `webhook-id` and one body for all its attempts and copies; each
//! attempt is signed afresh with its own `webhook-timestamp`. Notifying never blocks the caller.
//! This module never touches the ledger.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use oncepay_provider::wire::{
    Charge, ChargeStatus, EventType, Refund, RefundEvent, RefundEventType, RefundState, WebhookEvent,
};
use oncepay_service::backoff::Backoff;
use oncepay_webhook_signature::WebhookSecret;
use reqwest::Url;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::{pause, unix_now};
use crate::dice::Dice;
use crate::faults::{SharedFaults, WebhookPlan};

/// Where webhooks go, changeable at run time; none means no webhooks.
#[derive(Debug, Clone, Default)]
pub struct Destination(Arc<RwLock<Option<Url>>>);

impl Destination {
    /// Starts at `url`.
    pub fn new(url: Option<Url>) -> Self {
        Self(Arc::new(RwLock::new(url)))
    }

    /// The current target.
    pub fn get(&self) -> Option<Url> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Changes the target for events from now on.
    pub fn set(&self, url: Option<Url>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = url;
    }
}

/// What an event is about, as it is now.
#[derive(Debug, Clone)]
enum Subject {
    Charge(Charge),
    Refund(Refund),
}

impl Subject {
    fn id(&self) -> &str {
        match self {
            Self::Charge(charge) => &charge.id,
            Self::Refund(refund) => &refund.id,
        }
    }

    /// The event's body: the subject under the type its status calls for.
    fn event(&self) -> serde_json::Result<Vec<u8>> {
        let created = unix_now();
        match self {
            Self::Charge(charge) => {
                let event_type = match charge.status {
                    ChargeStatus::Succeeded => EventType::ChargeSucceeded,
                    ChargeStatus::Failed => EventType::ChargeFailed,
                };
                serde_json::to_vec(&WebhookEvent { event_type, created, data: charge.clone() })
            }
            Self::Refund(refund) => {
                let event_type = match refund.status {
                    RefundState::Failed => RefundEventType::RefundFailed,
                    RefundState::Pending | RefundState::Succeeded | RefundState::Canceled => {
                        RefundEventType::RefundUpdated
                    }
                };
                serde_json::to_vec(&RefundEvent { event_type, created, data: refund.clone() })
            }
        }
    }
}

/// Hands charge and refund outcomes to the [`Dispatcher`] through an unbounded queue; cheap to
/// clone, never blocks.
#[derive(Debug, Clone)]
pub struct Notifier {
    queue: mpsc::UnboundedSender<(Subject, Url)>,
    destination: Destination,
}

impl Notifier {
    /// Queues the event for `charge`'s outcome, addressed to the destination of this instant; with
    /// no destination there is no event.
    pub fn charge_settled(&self, charge: &Charge) {
        self.queue(Subject::Charge(charge.clone()));
    }

    /// Queues the event for `refund`'s outcome, as [`Notifier::charge_settled`] does a charge's.
    pub fn refund_settled(&self, refund: &Refund) {
        self.queue(Subject::Refund(refund.clone()));
    }

    fn queue(&self, subject: Subject) {
        if let Some(url) = self.destination.get() {
            // The dispatcher only goes away on shutdown, when undelivered events are abandoned anyway.
            let _ = self.queue.send((subject, url));
        }
    }
}

/// How deliveries are attempted.
#[derive(Debug, Clone)]
pub struct DeliveryPolicy {
    /// The signing secret.
    pub secret: WebhookSecret,
    /// Attempts per delivery, the first included (≥ 1).
    pub max_attempts: u32,
    /// How long one attempt waits for a response.
    pub timeout: Duration,
    /// The delay between attempts.
    pub backoff: Backoff,
}

/// Turns queued outcomes into deliveries.
pub struct Dispatcher {
    queue: mpsc::UnboundedReceiver<(Subject, Url)>,
    faults: SharedFaults,
    dice: Dice,
    courier: Arc<Courier>,
    deliveries: TaskTracker,
}

/// One event ready to send.
#[derive(Debug, Clone)]
struct Delivery {
    url: Url,
    id: String,
    body: Bytes,
    duplicate: bool,
    delay: Duration,
}

/// Sends deliveries, with retries.
struct Courier {
    client: reqwest::Client,
    policy: DeliveryPolicy,
    dice: Dice,
}

/// Builds the queue and its dispatcher.
pub fn channel(
    destination: Destination,
    faults: SharedFaults,
    dice: Dice,
    policy: DeliveryPolicy,
) -> Result<(Notifier, Dispatcher), reqwest::Error> {
    oncepay_service::tls::install_provider();
    let client = reqwest::Client::builder().timeout(policy.timeout).build()?;
    let (sender, queue) = mpsc::unbounded_channel();
    let courier = Arc::new(Courier { client, policy, dice: dice.clone() });
    let dispatcher = Dispatcher { queue, faults, dice, courier, deliveries: TaskTracker::new() };
    Ok((Notifier { queue: sender, destination }, dispatcher))
}

impl Dispatcher {
    /// Delivers events until `shutdown`, then abandons what is still pending: the simulator
    /// promises no delivery across its own exit.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut held: Option<(Delivery, Instant)> = None;
        loop {
            let hold_until = held.as_ref().map(|(_, until)| *until);
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = sleep_until(hold_until) => {
                    if let Some((earlier, _)) = held.take() {
                        self.launch(vec![earlier], &shutdown);
                    }
                }
                next = self.queue.recv() => {
                    let Some((subject, url)) = next else { break };
                    let Some((delivery, reorder, hold)) = self.prepare(&subject, url) else { continue };
                    match (reorder, held.take()) {
                        // Reordering: the held event goes only after the next one has been
                        // delivered, so the receiver gets the two swapped.
                        (true, Some((earlier, _))) => self.launch(vec![delivery, earlier], &shutdown),
                        (true, None) => held = Some((delivery, Instant::now() + hold)),
                        (false, earlier) => {
                            if let Some((earlier, _)) = earlier {
                                self.launch(vec![earlier], &shutdown);
                            }
                            self.launch(vec![delivery], &shutdown);
                        }
                    }
                }
            }
        }
        self.deliveries.close();
        self.deliveries.wait().await;
    }

    /// The delivery for `subject`, whether to reorder it and for how long to hold it; none when
    /// the drop fault hit.
    fn prepare(&self, subject: &Subject, url: Url) -> Option<(Delivery, bool, Duration)> {
        let faults = self.faults.get();
        let plan = self.dice.with(|rng| WebhookPlan::draw(&faults, rng));
        let id = self.dice.token("msg_");
        if plan.drop {
            tracing::info!(webhook.id = %id, event.subject = subject.id(), "webhook dropped (injected fault)");
            metrics::counter!("oncepay_simulator_webhook_events_total", "fate" => "dropped").increment(1);
            return None;
        }
        let body = match subject.event() {
            Ok(body) => Bytes::from(body),
            Err(error) => {
                tracing::error!(error = %error, event.subject = subject.id(), "cannot encode a webhook event");
                return None;
            }
        };
        let fate = if plan.duplicate { "duplicated" } else { "queued" };
        metrics::counter!("oncepay_simulator_webhook_events_total", "fate" => fate).increment(1);
        let delivery = Delivery {
            url,
            id,
            body,
            duplicate: plan.duplicate,
            delay: Duration::from_millis(faults.webhook_delay_ms),
        };
        Some((delivery, faults.webhook_reorder, Duration::from_millis(faults.webhook_reorder_hold_ms)))
    }

    /// Sends `sequence` in order (each one after the previous one is done), and each duplicate
    /// alongside its original.
    fn launch(&self, sequence: Vec<Delivery>, shutdown: &CancellationToken) {
        for copy in sequence.iter().filter(|d| d.duplicate) {
            let (courier, copy, shutdown) = (self.courier.clone(), copy.clone(), shutdown.clone());
            self.deliveries.spawn(async move { courier.deliver(&copy, &shutdown).await });
        }
        let (courier, shutdown) = (self.courier.clone(), shutdown.clone());
        self.deliveries.spawn(async move {
            for delivery in &sequence {
                courier.deliver(delivery, &shutdown).await;
            }
        });
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl Courier {
    /// Attempts `delivery` until the receiver responds 2xx, attempts run out, or `shutdown`. A
    /// non-2xx response and a transport error are both retried.
    #[tracing::instrument(name = "webhook.deliver", skip_all, fields(webhook.id = %delivery.id))]
    async fn deliver(&self, delivery: &Delivery, shutdown: &CancellationToken) {
        if !pause(delivery.delay, shutdown).await {
            return;
        }
        for attempt in 1..=self.policy.max_attempts {
            let timestamp = unix_now();
            let signature = self.policy.secret.sign(&delivery.id, timestamp, &delivery.body);
            let sent = self
                .client
                .post(delivery.url.clone())
                .header("content-type", "application/json")
                .header("webhook-id", &delivery.id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signature)
                .body(delivery.body.clone())
                .send();
            let result = tokio::select! {
                () = shutdown.cancelled() => return,
                result = sent => result,
            };
            match result {
                Ok(response) if response.status().is_success() => {
                    metrics::counter!("oncepay_simulator_webhook_attempts_total", "result" => "delivered").increment(1);
                    tracing::debug!(attempt, "webhook delivered");
                    return;
                }
                Ok(response) => {
                    metrics::counter!("oncepay_simulator_webhook_attempts_total", "result" => "rejected").increment(1);
                    tracing::info!(attempt, http.status_code = response.status().as_u16(), "webhook refused");
                }
                Err(error) => {
                    metrics::counter!("oncepay_simulator_webhook_attempts_total", "result" => "unreachable")
                        .increment(1);
                    tracing::info!(attempt, error = %error, "webhook receiver unreachable");
                }
            }
            if attempt < self.policy.max_attempts {
                let delay = self.dice.with(|rng| self.policy.backoff.delay(attempt, rng));
                if !pause(delay, shutdown).await {
                    return;
                }
            }
        }
        metrics::counter!("oncepay_simulator_webhook_abandoned_total").increment(1);
        tracing::warn!(attempts = self.policy.max_attempts, "webhook abandoned after its last attempt");
    }
}
