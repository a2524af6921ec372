//! `oncepay_client`: a small async client for the oncepay HTTP API, for merchants to embed.
//!
//! It owns the client side of the at-most-once promise: a [`PaymentIntent`] (and a
//! [`RefundIntent`]) fixes its idempotency key and body when it is built, and the [`Client`] never
//! makes a key, so no retry can go out under a new one. It must not depend on oncepay's server crates
//! (only on `oncepay-webhook-signature`, for [`webhooks::verify_webhook`]), and never logs the API key,
//! idempotency keys or request bodies.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use oncepay_client::{Client, PaymentIntent, PaymentStatus};
//!
//! let client = Client::new("http://127.0.0.1:8080", "opk_...")?;
//! let intent = PaymentIntent::builder(1999, "EUR", "customer-42").metadata("order", "A-17").build();
//! // Keep `intent.key()` with the order: sending the same intent again can never charge twice.
//! let payment = client.pay(&intent, Duration::from_secs(60)).await?;
//! match payment.status {
//!     PaymentStatus::Succeeded => println!("paid: {}", payment.id),
//!     PaymentStatus::Failed => println!("declined: {:?}", payment.failure),
//!     other => println!("not settled yet ({other}); ask again later"),
//! }
//! # Ok(())
//! # }
//! ```

mod client;
#[cfg(feature = "broker")]
mod dead_letters;
mod error;
mod intent;
mod problem;
#[cfg(feature = "broker")]
mod publisher;
mod refund_intent;
mod resource;
mod retry;
pub mod webhooks;

pub use client::{Client, ClientBuilder};
#[cfg(feature = "broker")]
pub use dead_letters::{DeadLetter, DeadLetterError, DeadLetters};
pub use error::{BuildError, Error};
pub use intent::{IdempotencyKey, InvalidIdempotencyKey, PaymentIntent, PaymentIntentBuilder};
pub use problem::{FieldError, Problem};
#[cfg(feature = "broker")]
pub use publisher::{PublishError, Published, Publisher};
pub use refund_intent::{RefundIntent, RefundIntentBuilder};
pub use resource::{
    Created, CreatedRefund, Failure, InvalidPaymentId, InvalidRefundId, InvalidRefundReason, Payment, PaymentId,
    PaymentStatus, Refund, RefundId, RefundReason, RefundStatus,
};
pub use retry::{Jitter, RetryPolicy};
pub use webhooks::verify_webhook;
