//! The Stripe adapter: oncepay's payments as Stripe PaymentIntents, behind [`PaymentProvider`].
//!
//! [`wire`] reads Stripe's JSON.
//!
//! [`PaymentProvider`]: crate::PaymentProvider

pub mod wire;
