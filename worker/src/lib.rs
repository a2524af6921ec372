//! The worker: drains the outbox and asks the provider to charge, at most once per payment.
//!
//! The [`drainer`] claims due rows (`oncepay_store::sending`, which also holds the fenced take and
//! release), one tenant at a time in turns ([`rotation`]), sends each to the provider, decides what
//! the outcome means ([`verdict`], pure) and records it under the lease's fencing token ([`record`],
//! many at once through `oncepay_service::group_commit`). The worker never takes back an expired lease:
//! `oncepay_store::leases::sweep` does, run by the reconciler. Refunds have a queue of their own,
//! sent by [`refunds`] under the same protocol. Events to merchants are delivered by [`events`], under
//! leases and fencing tokens of their own.

pub mod app;
pub mod drainer;
pub mod events;
pub mod metrics;
pub mod record;
pub mod refunds;
pub mod rotation;
pub mod settings;
pub mod verdict;
pub mod wake;

pub use drainer::{Counts, Drainer, DrainerConfig};
