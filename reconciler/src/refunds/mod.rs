//! Refunds in the reconciler: `unknown` refunds settled by lookups ([`poller`]) and by signed
//! provider webhooks ([`webhooks`]), exactly as `unknown` payments are, with [`unknown`] holding
//! the bookkeeping both share.
//!
//! Every status change goes through `oncepay_store::refunds::settling` as a compare-and-set from the
//! status the reconciler saw, and what a provider's refund means for the refund that asked for it is
//! decided by `settling::judge` alone, here as in the worker. The sweeper and the reaper handle
//! refunds' leases and keys beside payments' ([`crate::sweeper`], [`crate::reaper`]).

pub mod poller;
pub mod unknown;
pub mod webhooks;
