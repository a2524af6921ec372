//! oncepay's domain: what a payment and a refund are and which states they move through, the events
//! their changes send merchants and where they may be sent, money, ids, API keys, operators'
//! personal tokens, idempotency keys, references to things at the provider, what a payment request
//! must look like, how a request is fingerprinted, and JSON read strictly (no member named twice).

pub mod api_key;
pub mod endpoint_url;
pub mod fingerprint;
pub mod idempotency_key;
pub mod ids;
pub mod merchant_event;
pub mod money;
pub mod operator_token;
pub mod payment;
pub mod payment_request;
pub mod provider_ref;
pub mod refund;
pub mod refund_status;
pub mod status;
pub mod strict_json;
pub mod webhook_endpoint;
