//! Payments from a message broker: the second front door of the intake.
//!
//! A producer publishes the body of `POST /v1/payments` with an `idempotency-key` header to a
//! queue; the api's consumer takes each message through the very intake HTTP requests go through
//! ([`message`]: the same checks, fingerprint, group commit and transaction), and settles the
//! message with the broker by what became of it ([`rabbitmq`]). The consumer runs inside the api,
//! beside its HTTP workers, so a tenant's messages and requests are written in the same groups, and
//! every api process consumes: more api processes take more messages.
//!
//! [`message`] knows nothing of RabbitMQ: a second broker needs only a consumer of its own that
//! reads its messages into a [`message::Message`] and acts on the [`message::Outcome`].

pub mod message;
pub mod rabbitmq;
