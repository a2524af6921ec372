//! oncepay's domain: what a payment and a refund are and which states they move through, money, ids, API keys,
//! operators' personal tokens, idempotency keys, references to things at the provider, what a
//! payment request must look like, how a request is fingerprinted, and JSON read strictly (no
//! member named twice).
//!
//! Pure: no I/O. With the `sqlx` feature, ids, money, provider references and the payment and refund
//! statuses can be bound to and read from PostgreSQL columns.

pub mod api_key;
pub mod fingerprint;
pub mod idempotency_key;
pub mod ids;
pub mod money;
pub mod operator_token;
pub mod payment;
pub mod payment_request;
pub mod provider_ref;
pub mod refund;
pub mod refund_status;
pub mod status;
pub mod strict_json;
