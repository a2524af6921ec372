//! HTTP plumbing for the processes that serve HTTP over a database: RFC 9457 problem details
//! ([`problem`]) and the probes (`/healthz`, `/readyz`, `/metrics`; [`probes`]).

pub mod probes;
pub mod problem;
