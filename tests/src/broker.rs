//! The system's RabbitMQ, for a run that takes payments from a broker too: a node of the run's own
//! (so that the harness may stop it and cut its connections), which every api consumes from; a
//! producer user for each tenant, mapped to it as operators map one; once the run is over, what is
//! left in its queues; and the judgement of invariant 10 on it ([`BrokerVerdict`]).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use oncepay_client::{DeadLetter, DeadLetters};
use oncepay_devkit::rabbitmq::Node;
use sqlx::PgPool;
use uuid::Uuid;

use crate::checker::Violation;
use crate::system::Tenant;
use crate::workload::Observations;

/// The queue producers publish to (the api's default).
pub const QUEUE: &str = "oncepay.payments";
/// Where the api and RabbitMQ dead-letter messages (the api's default).
pub const DEAD_LETTER_QUEUE: &str = "oncepay.payments.dead-letters";
/// Where a message whose key is in flight waits (the api's default).
pub const DELAY_QUEUE: &str = "oncepay.payments.delayed";

/// The run's RabbitMQ node.
pub struct Broker {
    node: Node,
    up: bool,
}

impl Broker {
    /// Starts a node of the run's own.
    pub async fn start() -> anyhow::Result<Self> {
        let node = Node::start().await.context("cannot start a RabbitMQ node (is rabbitmq-server installed?)")?;
        Ok(Self { node, up: true })
    }

    /// The api's settings: the node as its administrator (an impersonator, as the api's user must
    /// be), the default queues, and a short delay for a key in flight.
    pub fn api_settings(&self) -> Vec<(&'static str, String)> {
        vec![("broker.url", self.node.url()), ("broker.delay_ms", "200".to_owned())]
    }

    /// Adds a producer user for `tenant` (to be mapped to it); its name and URL.
    pub async fn add_producer(&self, tenant: &str) -> anyhow::Result<(String, String)> {
        let user = producer(tenant);
        let password = uuid::Uuid::new_v4().simple().to_string();
        self.node.add_user(&user, &password).await?;
        Ok((user.clone(), self.node.url_as(&user, &password)))
    }

    /// Whether the node runs.
    pub const fn is_up(&self) -> bool {
        self.up
    }

    /// Stops the node cleanly (its queues and their messages stay on disk).
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.up = false;
        self.node.stop().await
    }

    /// Starts it again.
    pub async fn start_again(&mut self) -> anyhow::Result<()> {
        self.node.resume().await?;
        self.up = true;
        Ok(())
    }

    /// Closes every connection, the api's and the producers', as a network cut would.
    pub async fn cut_connections(&self) -> anyhow::Result<()> {
        self.node.close_connections().await
    }

    /// Messages not yet taken for good: in the queue (ready or held by a consumer) and in the delay
    /// queue.
    pub async fn in_flight(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for queue in [QUEUE, DELAY_QUEUE] {
            total += self.node.messages(queue).await?.unwrap_or(0);
        }
        Ok(total)
    }

    /// Waits up to `bound` until nothing is in flight; what still is.
    pub async fn settle(&self, bound: Duration) -> anyhow::Result<u64> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let left = self.in_flight().await?;
            if left == 0 || tokio::time::Instant::now() >= deadline {
                return Ok(left);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Every message of the dead-letter queue, oldest first (they stay there).
    pub async fn dead_letters(&self) -> anyhow::Result<Vec<DeadLetter>> {
        let letters = DeadLetters::connect(&self.node.url(), DEAD_LETTER_QUEUE).await?;
        Ok(letters.list(usize::MAX).await?)
    }
}

/// The name of `tenant`'s producer user.
fn producer(tenant: &str) -> String {
    format!("{tenant}-producer")
}

/// Invariant 10 (CONTRACT.md): every broker message confirmed to its producer became exactly one
/// payment or one dead-lettered message with a reason; never two payments for one key (the key rows
/// keep that, invariant 2); nothing left in flight.
const INVARIANT: u8 = 10;

/// Why a valid message may be dead-lettered: its key was reused with another body, or it was
/// delivered past the queue's limit (consumers died holding it).
const EXPECTED_REASONS: [&str; 2] = ["idempotency_key_reused", "delivery_limit"];

/// A dead letter of a key: the amount its body asked for, and why.
type Lettered = (Option<i64>, String);

/// What the broker's part of a run came to.
#[derive(Debug, Clone, Default)]
pub struct BrokerVerdict {
    /// Intents published to RabbitMQ.
    pub intents: usize,
    /// Of those, intents with at least one confirmed message.
    pub confirmed: usize,
    /// Messages RabbitMQ confirmed (storm copies and publishes again after a heal included).
    pub messages: u32,
    /// Attempts without a confirmation, published again by the producer.
    pub republished: u32,
    /// Publishes never confirmed.
    pub unconfirmed: u32,
    /// Replies that said an earlier message or request had made the payment.
    pub replayed: u32,
    /// Payments made for published keys.
    pub payments: usize,
    /// Dead-lettered messages by reason.
    pub dead_letters: BTreeMap<String, usize>,
    /// Messages still in the queue or the delay queue after settling (must be 0).
    pub in_flight: u64,
    /// Broken promises (moved into the run's verdict).
    pub violations: Vec<Violation>,
}

impl BrokerVerdict {
    /// Judges the published intents against the payments their keys made and the dead letters.
    pub async fn judge(
        pool: &PgPool,
        tenants: &[Tenant],
        observations: &Observations,
        in_flight: u64,
        dead_letters: &[DeadLetter],
    ) -> anyhow::Result<Self> {
        let stored: BTreeMap<(Uuid, String), i64> = sqlx::query!(
            "SELECT k.tenant_id, k.idempotency_key, p.amount
               FROM idempotency_keys k
               JOIN payments p ON p.tenant_id = k.tenant_id AND p.payment_id = k.payment_id"
        )
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|row| ((row.tenant_id, row.idempotency_key), row.amount))
        .collect();
        let mut verdict = Self { in_flight, ..Self::default() };
        if in_flight > 0 {
            verdict.violation("messages were still in flight after settling", format!("{in_flight} message(s)"));
        }
        // The dead letters by (producer, key).
        let mut letters: BTreeMap<(String, String), Vec<Lettered>> = BTreeMap::new();
        for letter in dead_letters {
            let reason = letter.reason.clone().unwrap_or_default();
            *verdict.dead_letters.entry(reason.clone()).or_default() += 1;
            let describe = || format!("user {:?}, key {:?}, reason {reason:?}", letter.user, letter.key);
            if reason.is_empty() {
                verdict.violation("a message was dead-lettered without a reason", describe());
            } else if !EXPECTED_REASONS.contains(&reason.as_str()) {
                verdict.violation("a valid message was dead-lettered as invalid", describe());
            }
            let amount =
                serde_json::from_slice::<serde_json::Value>(&letter.body).ok().and_then(|body| body["amount"].as_i64());
            let (Some(user), Some(key)) = (&letter.user, &letter.key) else { continue };
            letters.entry((user.clone(), key.clone())).or_default().push((amount, reason));
        }
        for record in observations.intents.values() {
            let (Some(published), Some(tenant)) = (&record.published, tenants.get(record.tenant)) else { continue };
            verdict.intents += 1;
            verdict.messages += published.confirmed;
            verdict.republished += published.republished;
            verdict.unconfirmed += published.unconfirmed;
            verdict.replayed += record.replayed;
            let payment = stored.get(&(tenant.tenant_id, record.key.clone())).copied();
            verdict.payments += usize::from(payment.is_some());
            if published.confirmed == 0 && published.misuse.is_none() {
                continue;
            }
            verdict.confirmed += 1;
            let letters =
                letters.get(&(producer(&tenant.name), record.key.clone())).map(Vec::as_slice).unwrap_or_default();
            let describe = || {
                format!("tenant {}, key {:?}: payment {payment:?}, dead letters {letters:?}", tenant.name, record.key)
            };
            // Each confirmed body is the key's payment or was dead-lettered; a body that made the
            // payment was never refused as a reused key.
            let bodies = [Some(record.amount).filter(|_| published.confirmed > 0), published.misuse];
            for amount in bodies.into_iter().flatten() {
                let lettered = letters.iter().any(|(lettered, _)| *lettered == Some(amount));
                if payment != Some(amount) && !lettered {
                    verdict.violation("a confirmed message became neither a payment nor a dead letter", describe());
                }
                let refused = letters
                    .iter()
                    .any(|(lettered, reason)| *lettered == Some(amount) && reason == "idempotency_key_reused");
                if payment == Some(amount) && refused {
                    verdict.violation(
                        "a message that made its key's payment was also refused as a reused key",
                        describe(),
                    );
                }
            }
        }
        Ok(verdict)
    }

    fn violation(&mut self, what: &str, evidence: String) {
        self.violations.push(Violation { invariant: INVARIANT, what: what.to_owned(), evidence });
    }
}
