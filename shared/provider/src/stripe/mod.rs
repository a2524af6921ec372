//! The Stripe adapter: oncepay's payments as Stripe PaymentIntents, behind [`PaymentProvider`].
//!
//! [`wire`] reads Stripe's JSON; [`classify`] turns the response to a create into a
//! [`SendOutcome`](crate::SendOutcome) or, for a refund, a [`RefundOutcome`](crate::RefundOutcome);
//! [`lookup`] turns searches and lists into found, certainly none or can't tell; [`client`] does the
//! I/O, as [`settings`] (`[provider.stripe]`) say; [`signature`] verifies `Stripe-Signature`;
//! [`limits`] says what Stripe would refuse, before a payment or a refund is accepted.
//!
//! A 200 whose intent has not finished (`processing`, `requires_action`) is uncertain
//! ([`UncertainReason::NotFinal`](crate::UncertainReason::NotFinal)): the reconciler settles it. A
//! refund is a Stripe Refund of the payment's intent; one still `pending` is
//! [`RefundOutcome::Unfinished`](crate::RefundOutcome::Unfinished), settled the same way.
//!
//! [`PaymentProvider`]: crate::PaymentProvider

pub mod classify;
pub mod client;
pub mod limits;
pub mod lookup;
pub mod settings;
pub mod signature;
pub mod wire;

pub use client::StripeProvider;
pub use lookup::{CantTell, Lookup};
pub use settings::{StripeMode, StripeSettings};
