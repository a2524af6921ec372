//! The messages oncepay dead-lettered (feature `broker`): reading them without taking them, and
//! publishing one again to the payments queue once its cause is fixed (docs/broker.md, "Runbook").
//!
//! Whoever may read the dead-letter queue may use this: an operator, as the api's broker user, or a
//! producer given read access to it. Publishing a message again keeps its producer's `user_id`,
//! which RabbitMQ allows only to that producer or to a user tagged `impersonator` (the api's).
//! Nothing here is in oncepay's audit trail: RabbitMQ is told, oncepay is not, until the message
//! arrives in the payments queue again and goes through intake like any other.

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

/// The headers the api or RabbitMQ add to a message they dead-letter: a message published again
/// leaves them behind.
const DEAD_LETTER_HEADERS: [&str; 7] = [
    "oncepay-reason",
    "oncepay-problem",
    "oncepay-failed-at",
    "x-death",
    "x-first-death-reason",
    "x-first-death-queue",
    "x-first-death-exchange",
];

/// Why the dead letters could not be read or published again.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// RabbitMQ refused, or could not be reached.
    #[error("RabbitMQ: {0}")]
    Broker(#[from] lapin::Error),
    /// No dead letter has that key.
    #[error("no message in {queue} has the idempotency key {key:?}")]
    NotFound {
        /// The dead-letter queue.
        queue: String,
        /// The key looked for.
        key: String,
    },
    /// RabbitMQ did not confirm the message published again; the dead letter stays.
    #[error("RabbitMQ did not confirm the message published again to {0}; the dead letter was kept")]
    NotConfirmed(String),
}

/// A dead-lettered message, as it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its producer (`user_id`).
    pub user: Option<String>,
    /// Its `idempotency-key` header.
    pub key: Option<String>,
    /// Why: the api's `oncepay-reason`, else RabbitMQ's `x-first-death-reason` (`delivery_limit`).
    pub reason: Option<String>,
    /// The api's problem document (what HTTP would have answered), if it refused it.
    pub problem: Option<String>,
    /// When the api refused it (seconds since 1970), if it did.
    pub failed_at: Option<u64>,
    /// The payment request.
    pub body: Vec<u8>,
}

impl DeadLetter {
    fn of(delivery: &Delivery) -> Self {
        let headers = delivery.properties.headers().clone().unwrap_or_default();
        Self {
            user: delivery.properties.user_id().as_ref().map(ToString::to_string),
            key: text(&headers, "idempotency-key"),
            reason: text(&headers, "oncepay-reason").or_else(|| text(&headers, "x-first-death-reason")),
            problem: text(&headers, "oncepay-problem"),
            failed_at: match headers.inner().get("oncepay-failed-at") {
                Some(AMQPValue::Timestamp(seconds)) => Some(*seconds),
                _ => None,
            },
            body: delivery.data.clone(),
        }
    }
}

/// The dead-letter queue of one RabbitMQ node.
pub struct DeadLetters {
    connection: Connection,
    channel: Channel,
    queue: String,
}

impl DeadLetters {
    /// Connects to the node at `url` for the dead-letter queue `queue`.
    pub async fn connect(url: &str, queue: &str) -> Result<Self, DeadLetterError> {
        let connection = Connection::connect(url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok(Self { connection, channel, queue: queue.to_owned() })
    }

    /// The first `limit` dead letters, oldest first. They stay where they are: each is taken
    /// unacknowledged, and all go back to the queue, in their order, when the connection closes.
    pub async fn list(self, limit: usize) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let mut letters = Vec::new();
        while letters.len() < limit {
            let Some(message) = self.get().await? else { break };
            letters.push(DeadLetter::of(&message));
        }
        self.close().await;
        Ok(letters)
    }

    /// Publishes the first dead letter with idempotency key `key` (and producer `user`, if given)
    /// again to `payments_queue`, as its producer published it (same body, key, `user_id`), and takes
    /// it off the dead-letter queue once RabbitMQ has confirmed the copy. The other messages looked
    /// at on the way go back to the queue, in their order.
    pub async fn republish(
        self,
        key: &str,
        user: Option<&str>,
        payments_queue: &str,
    ) -> Result<DeadLetter, DeadLetterError> {
        let outcome = self.republish_one(key, user, payments_queue).await;
        self.close().await;
        outcome
    }

    async fn republish_one(
        &self,
        key: &str,
        user: Option<&str>,
        payments_queue: &str,
    ) -> Result<DeadLetter, DeadLetterError> {
        loop {
            let Some(message) = self.get().await? else {
                return Err(DeadLetterError::NotFound { queue: self.queue.clone(), key: key.to_owned() });
            };
            let letter = DeadLetter::of(&message);
            if letter.key.as_deref() != Some(key) || user.is_some_and(|user| letter.user.as_deref() != Some(user)) {
                continue;
            }
            let mut headers = message.properties.headers().clone().unwrap_or_default().inner().clone();
            headers.retain(|name, _| !DEAD_LETTER_HEADERS.contains(&name.as_str()));
            let properties = BasicProperties::default()
                .with_headers(FieldTable::from(headers))
                .with_delivery_mode(2)
                .with_content_type("application/json".into());
            let properties = match message.properties.user_id() {
                Some(user) => properties.with_user_id(user.clone()),
                None => properties,
            };
            let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
            let confirmation = self
                .channel
                .basic_publish("".into(), payments_queue.into(), options, &message.data, properties)
                .await?
                .await?;
            if confirmation != Confirmation::Ack(None) {
                return Err(DeadLetterError::NotConfirmed(payments_queue.to_owned()));
            }
            message.ack(BasicAckOptions::default()).await?;
            return Ok(letter);
        }
    }

    async fn get(&self) -> Result<Option<Delivery>, DeadLetterError> {
        let options = BasicGetOptions { no_ack: false };
        Ok(self.channel.basic_get(self.queue.as_str().into(), options).await?.map(|message| message.delivery))
    }

    /// Closes the connection: what was taken and not acknowledged goes back to the queue.
    async fn close(self) {
        let _ = self.connection.close(200, "done with the dead letters".into()).await;
    }
}

/// A header's text.
fn text(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(value) => Some(String::from_utf8_lossy(value.as_bytes()).into_owned()),
        AMQPValue::ShortString(value) => Some(value.to_string()),
        _ => None,
    }
}
