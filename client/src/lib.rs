//! `oncepay_client`: a small async client for the oncepay HTTP API, for merchants to embed.
//!
//! It owns the client side of the at-most-once promise:
//!
//! - A [`PaymentIntent`] gets its idempotency key once, when it is built, and every attempt to
//!   send that intent carries that key and byte-identical body. The [`Client`] never makes a key,
//!   so no retry can go out under a new one; a caller that wants to retry later keeps the intent
//!   (or its key) and sends it again.
//! - [`Client::create`] retries what is safe to retry under the key: transport failures and
//!   timeouts, `408`, `409`, `429` and `5xx`, with exponential backoff and jitter, never earlier than
//!   the server's `Retry-After`. It never retries a rejection (`400`, `401`, `404`, `413`, `415`,
//!   `422`, ...): those come back as [`Error::Problem`] with the RFC 9457 details.
//! - [`Client::wait_for_terminal`] follows a payment with long polls (`Prefer: wait=N`) until it is
//!   `succeeded` or `failed`, or the caller's time is up. `unknown` and `dead_lettered` are
//!   reported as what they are: not final, possibly for a long time.
//!
//! It must not depend on oncepay's server crates, log or print the API key, or log idempotency
//! keys and request bodies. It only logs (through `tracing`) that an attempt failed and when it
//! will retry.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use oncepay_client::{Client, PaymentIntent, PaymentStatus};
//!
//! let client = Client::new("http://127.0.0.1:8080", "opk_...")?;
//! let intent = PaymentIntent::builder(1999, "EUR", "cus_42").metadata("order", "A-17").build();
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
mod error;
mod intent;
mod problem;
mod resource;
mod retry;

pub use client::{Client, ClientBuilder};
pub use error::{BuildError, Error};
pub use intent::{IdempotencyKey, InvalidIdempotencyKey, PaymentIntent, PaymentIntentBuilder};
pub use problem::{FieldError, Problem};
pub use resource::{Created, Failure, InvalidPaymentId, Payment, PaymentId, PaymentStatus};
pub use retry::{Jitter, RetryPolicy};
