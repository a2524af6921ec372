//! Publishing one delivery to an endpoint that is a RabbitMQ exchange (`rabbitmq:merchant.…`): the
//! body and Standard Webhooks headers of the HTTP request, as a persistent message with the routing
//! key `<tenant>.<event type>`, confirmed by RabbitMQ.
//!
//! The exchange is declared (durable, `topic`) the first time a connection publishes to it, so a
//! merchant binds queues to it and nobody has to make it first. The message is mandatory: one that
//! no queue takes comes back and counts as a failed attempt, retried on the schedule as an endpoint
//! that does not answer is, so an event is never confirmed into nowhere. One connection and one
//! channel in confirm mode serve every delivery of the worker; once either has failed (a refused
//! declaration closes the channel, a lost node the connection), the next delivery connects again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use secrecy::{ExposeSecret, SecretString};
use time::OffsetDateTime;
use tokio::sync::Mutex;

use oncepay_domain::endpoint_url;
use oncepay_store::merchant_deliveries::{Attempt, ClaimedDelivery};

use super::message::Signed;
use super::verdict::Outcome;

/// The connection deliveries to exchanges go out through, made when the first one is due.
#[derive(Clone)]
pub struct Publisher {
    url: Option<SecretString>,
    timeout: Duration,
    session: Arc<Mutex<Option<Session>>>,
}

/// One connection, its channel in confirm mode, and the exchanges declared on it.
struct Session {
    connection: Connection,
    channel: Channel,
    declared: HashSet<String>,
}

impl Publisher {
    /// A publisher to the node at `url` (none: every delivery to an exchange fails, saying why),
    /// giving up on an attempt after `timeout`.
    pub fn new(url: Option<SecretString>, timeout: Duration) -> Self {
        Self { url, timeout, session: Arc::new(Mutex::new(None)) }
    }

    /// Makes one attempt of `claimed` to `exchange`, signed at `now`: what became of it, as the
    /// verdict and the record need it.
    pub async fn send(&self, claimed: &ClaimedDelivery, exchange: &str, now: OffsetDateTime) -> (Outcome, Attempt) {
        let mut attempt = Attempt { attempted_at: now, status: None, response: String::new(), error: None };
        let published = tokio::time::timeout(self.timeout, self.publish(claimed, exchange, now)).await;
        let outcome = match published {
            Ok(Ok(())) => {
                attempt.response = "confirmed by RabbitMQ".to_owned();
                Outcome::Confirmed
            }
            Ok(Err(error)) => {
                attempt.error = Some(error);
                Outcome::NoAnswer
            }
            Err(_) => {
                attempt.error = Some(format!("RabbitMQ did not confirm the message within {:?}", self.timeout));
                Outcome::NoAnswer
            }
        };
        (outcome, attempt)
    }

    async fn publish(&self, claimed: &ClaimedDelivery, exchange: &str, now: OffsetDateTime) -> Result<(), String> {
        endpoint_url::exchange(exchange).map_err(|refusal| refusal.to_string())?;
        let signed = Signed::of(claimed, now)?;
        let channel = self.channel_for(exchange).await.map_err(|e| format!("cannot reach RabbitMQ: {e}"))?;
        let routing_key = format!("{}.{}", claimed.tenant_name, claimed.event_type);
        let options = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
        let confirmation = channel
            .basic_publish(exchange.into(), routing_key.as_str().into(), options, &signed.body, properties(&signed))
            .await
            .map_err(|e| format!("cannot publish to {exchange}: {e}"))?
            .await
            .map_err(|e| format!("cannot publish to {exchange}: {e}"))?;
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(format!("no queue bound to {exchange} takes {routing_key}")),
            Confirmation::Nack(_) => Err(format!("RabbitMQ refused the message to {exchange}")),
            Confirmation::NotRequested => Err("publisher confirms are off on the channel".to_owned()),
        }
    }

    /// The channel to publish on, connecting and declaring `exchange` first where needed.
    async fn channel_for(&self, exchange: &str) -> Result<Channel, String> {
        let Some(url) = &self.url else {
            return Err("this worker has no events.broker_url, so it delivers events over https only".to_owned());
        };
        let mut session = self.session.lock().await;
        let current = match session.take() {
            Some(open) if open.connection.status().connected() && open.channel.status().connected() => {
                session.insert(open)
            }
            stale => {
                if let Some(stale) = stale {
                    let _ = stale.connection.close(200, "the channel failed; connecting again".into()).await;
                }
                session.insert(connect(url.expose_secret()).await.map_err(|e| e.to_string())?)
            }
        };
        if !current.declared.contains(exchange) {
            let durable = ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
            current
                .channel
                .exchange_declare(exchange.into(), ExchangeKind::Topic, durable, FieldTable::default())
                .await
                .map_err(|e| format!("cannot declare the exchange {exchange}: {e}"))?;
            current.declared.insert(exchange.to_owned());
        }
        Ok(current.channel.clone())
    }
}

async fn connect(url: &str) -> lapin::Result<Session> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(Session { connection, channel, declared: HashSet::new() })
}

/// A persistent JSON message with the Standard Webhooks headers, and the event's id as its
/// `message_id`.
fn properties(signed: &Signed) -> BasicProperties {
    let string = |value: &str| AMQPValue::LongString(LongString::from(value));
    let headers: std::collections::BTreeMap<ShortString, AMQPValue> = [
        ("webhook-id", string(&signed.id)),
        ("webhook-timestamp", string(&signed.timestamp.to_string())),
        ("webhook-signature", string(&signed.signature)),
    ]
    .into_iter()
    .map(|(name, value)| (ShortString::from(name), value))
    .collect();
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(signed.id.as_str().into())
        .with_delivery_mode(2)
        .with_headers(FieldTable::from(headers))
}
