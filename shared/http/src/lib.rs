//! HTTP plumbing for the processes that serve HTTP over a database: RFC 9457 problem details
//! ([`problem`]) and the operations endpoints (`/healthz`, `/readyz`, `/metrics`; [`ops_http`]).

pub mod ops_http;
pub mod problem;
