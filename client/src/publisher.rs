//! Publishing payment requests to oncepay's RabbitMQ queue instead of `POST /v1/payments`
//! (feature `broker`).
//!
//! A [`PaymentIntent`] is published as the api reads a message (docs/broker.md): its body, its key
//! in the `idempotency-key` header, the connection's user as `user_id`, persistently. Each publish
//! waits for RabbitMQ's confirmation; without one (a refusal, a lost connection, no answer in time)
//! the same intent is published again, with the same key, on a new connection if need be, so a
//! message that did arrive before the failure is replayed by the api, never charged twice.

use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use crate::intent::PaymentIntent;
use crate::resource::Payment;
use crate::retry::RetryPolicy;

/// Why an intent could not be published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The URL is not an `amqp://` URL with a user.
    #[error("invalid broker URL: {0}")]
    Url(String),
    /// RabbitMQ never confirmed the message, after every attempt. It may still have arrived:
    /// publishing the same intent again is safe.
    #[error("RabbitMQ did not confirm the message after {attempts} attempts: {last}")]
    NotConfirmed {
        /// Attempts made.
        attempts: u32,
        /// The last attempt's failure.
        last: String,
    },
}

/// What a confirmed publish brought back.
#[derive(Debug)]
pub struct Published {
    /// Attempts it took (1 when the first was confirmed).
    pub attempts: u32,
    /// The api's reply, if one was asked for and came in time: the payment as it stood when the
    /// message was taken, and whether an earlier message or request made it.
    pub reply: Option<(Payment, bool)>,
}

/// Publishes intents to one queue of one RabbitMQ node.
pub struct Publisher {
    url: String,
    user: String,
    queue: String,
    policy: RetryPolicy,
    confirm_timeout: Duration,
    open: Option<Open>,
}

/// A connection with a confirming channel and a queue for replies.
struct Open {
    _connection: Connection,
    channel: Channel,
    replies: lapin::Consumer,
    reply_queue: String,
}

impl Publisher {
    /// A publisher to `queue` on the node at `url` (`amqp://user:password@host:port/vhost`); it
    /// connects on the first publish.
    pub fn new(url: &str, queue: &str) -> Result<Self, PublishError> {
        let parsed: AMQPUri = url.parse().map_err(PublishError::Url)?;
        let user = parsed.authority.userinfo.username;
        if user.is_empty() {
            return Err(PublishError::Url("the URL names no user".into()));
        }
        Ok(Self {
            url: url.to_owned(),
            user,
            queue: queue.to_owned(),
            policy: RetryPolicy::default(),
            confirm_timeout: Duration::from_secs(10),
            open: None,
        })
    }

    /// The attempts and backoff of re-publishing.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Publishes `intent` until RabbitMQ confirms it, then waits up to `reply_wait` for the api's
    /// reply (none if zero).
    pub async fn publish(&mut self, intent: &PaymentIntent, reply_wait: Duration) -> Result<Published, PublishError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.publish_once(intent, !reply_wait.is_zero()).await {
                Ok(()) => break,
                Err(error) if attempt >= self.policy.attempts() => {
                    return Err(PublishError::NotConfirmed { attempts: attempt, last: error });
                }
                Err(_) => {
                    // The connection is suspect: the next attempt opens another.
                    self.open = None;
                    // Drawn before the wait: the thread's generator may not be held across it.
                    let backoff = self.policy.backoff(attempt, &mut rand::rng());
                    tokio::time::sleep(backoff).await;
                }
            }
        }
        let reply = if reply_wait.is_zero() { None } else { self.reply(intent, reply_wait).await };
        Ok(Published { attempts: attempt, reply })
    }

    /// One publish, confirmed or not.
    async fn publish_once(&mut self, intent: &PaymentIntent, with_reply: bool) -> Result<(), String> {
        if self.open.is_none() {
            self.open = Some(self.connect().await.map_err(|error| error.to_string())?);
        }
        let Some(open) = &self.open else { return Err("not connected".to_owned()) };
        let mut headers = FieldTable::default();
        headers.insert("idempotency-key".into(), AMQPValue::LongString(LongString::from(intent.key().as_str())));
        let mut properties = BasicProperties::default()
            .with_headers(headers)
            .with_user_id(ShortString::from(self.user.as_str()))
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        if with_reply {
            properties = properties
                .with_reply_to(open.reply_queue.as_str().into())
                .with_correlation_id(intent.key().as_str().into());
        }
        let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
        let published = open.channel.basic_publish(
            "".into(),
            self.queue.as_str().into(),
            options,
            intent.body().as_bytes(),
            properties,
        );
        let confirm = tokio::time::timeout(self.confirm_timeout, async { published.await?.await })
            .await
            .map_err(|_| "no confirmation in time".to_owned())?
            .map_err(|error| error.to_string())?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(format!("no queue named {} took the message", self.queue)),
            Confirmation::Nack(_) => Err("RabbitMQ refused the message".to_owned()),
            Confirmation::NotRequested => Err("publisher confirms are off".to_owned()),
        }
    }

    /// A new connection, with a confirming channel and a reply queue of its own.
    async fn connect(&self) -> lapin::Result<Open> {
        let connection = Connection::connect(&self.url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        let exclusive = QueueDeclareOptions { exclusive: true, ..QueueDeclareOptions::default() };
        let reply_queue = channel.queue_declare("".into(), exclusive, FieldTable::default()).await?.name().to_string();
        let replies = channel
            .basic_consume(
                reply_queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(Open { _connection: connection, channel, replies, reply_queue })
    }

    /// The api's reply to `intent`, within `wait`; other replies (to earlier attempts) are skipped.
    async fn reply(&mut self, intent: &PaymentIntent, wait: Duration) -> Option<(Payment, bool)> {
        let open = self.open.as_mut()?;
        let key = intent.key().as_str();
        tokio::time::timeout(wait, async {
            while let Some(Ok(delivery)) = open.replies.next().await {
                let _ = delivery.ack(BasicAckOptions::default()).await;
                if delivery.properties.correlation_id().as_ref().is_some_and(|id| id.as_str() == key) {
                    let replayed = delivery
                        .properties
                        .headers()
                        .as_ref()
                        .and_then(|headers| headers.inner().get("oncepay-replayed").cloned())
                        .is_some_and(|value| matches!(value, AMQPValue::Boolean(true)));
                    return serde_json::from_slice(&delivery.data).ok().map(|payment| (payment, replayed));
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
    }
}
