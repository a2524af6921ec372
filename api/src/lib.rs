//! The HTTP intake: authenticates tenants, accepts payment requests idempotently (`POST
//! /v1/payments`), serves their status with long polling (`GET /v1/payments/{id}`), accepts refunds
//! of succeeded payments the same way (`POST /v1/payments/{id}/refunds`, `GET /v1/refunds/{id}`,
//! `GET /v1/payments/{id}/refunds`), lets merchants manage where their events are sent
//! (`/v1/webhook-endpoints`, [`webhook_endpoints`]), takes payment requests from a RabbitMQ queue
//! through the same intake ([`broker`]), and serves the operations endpoints (`/healthz`, `/readyz`,
//! `/metrics`, `/openapi.json`).
//!
//! `main.rs` only loads [`settings::Settings`], starts telemetry and runs an [`Application`] until
//! SIGTERM; tests build one on port 0 with [`Application::build_with`] on a fresh database. The api
//! writes only through `oncepay_store` and never runs migrations.

pub mod accept_groups;
pub mod auth;
pub mod broker;
pub mod create;
pub mod create_payment;
pub mod create_refund;
pub mod endpoints;
pub mod errors;
pub mod get_payment;
pub mod get_refund;
pub mod idempotent_request;
pub mod json_body;
pub mod list_refunds;
pub mod long_poll;
pub mod metrics;
pub mod openapi;
pub mod prefer;
pub mod provider_intake;
pub mod rate_limit;
pub mod read_cache;
pub mod replay_cache;
pub mod request_span;
pub mod rereads;
pub mod resource_response;
pub mod settings;
pub mod startup;
pub mod state;
pub mod watch;
pub mod webhook_endpoints;

pub use settings::Settings;
pub use startup::Application;
