//! The store: the PostgreSQL access that more than one binary needs, the pool and the migrations
//! ([`db`]), and [`settlement`], the one place that turns a provider's charge into a settlement.
//! [`leases`] runs only in the reconciler's sweeper, but it is the other half of the worker's
//! fencing, so the worker's tests race the two against each other.
//!
//! Functions take `&mut PgConnection`, so the caller owns the transaction (`&mut *tx`). Queries that
//! one binary owns (the worker's claim and finish, the reconciler's polling and dead letters) live in
//! that binary. Errors are classified once, here, as [`StoreError`].

pub mod broker_queues;
pub mod broker_users;
pub mod connections;
pub mod db;
#[cfg(feature = "fixtures")]
pub mod fixtures;
// Here rather than in the api, so that the worker's and the reconciler's tests and the benchmark
// create payments exactly as the api does.
pub mod intake;
pub mod leases;
pub mod merchant_deliveries;
pub mod merchant_endpoints;
pub mod merchant_events;
pub mod notify;
pub mod outbox;
pub mod payments;
pub mod recon_runs;
pub mod refunds;
pub mod sending;
pub mod settlement;
pub mod statements;
pub mod stored_name;
pub mod tenants;
pub mod transitions;
pub mod unknown_queue;
pub mod webhook_events;

use std::sync::Arc;

/// A store operation that did not complete. Cloned when one failure ends many requests' writes (a
/// group of accepts).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// PostgreSQL cannot be reached, or the transaction failed for a reason that a retry can cure
    /// (connection lost, pool exhausted, serialization failure, deadlock, shutdown, timeout). Fail
    /// closed and retry later.
    #[error("the database is unavailable")]
    Unavailable(#[source] Arc<sqlx::Error>),
    /// Anything else: a constraint or a query that should not have failed. A bug.
    #[error("unexpected database error")]
    Unexpected(#[source] Arc<sqlx::Error>),
}

impl StoreError {
    /// Whether a retry later may succeed.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }

    /// The SQLSTATE, when PostgreSQL reported one.
    pub fn sqlstate(&self) -> Option<String> {
        let (Self::Unavailable(error) | Self::Unexpected(error)) = self;
        sqlstate(error)
    }
}

/// The SQLSTATE of a database error.
pub fn sqlstate(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

/// SQLSTATEs (or their two-character classes) that mean "try again later".
const TRANSIENT_SQLSTATES: &[&str] = &[
    "08",    // connection exception
    "40001", // serialization_failure
    "40P01", // deadlock_detected
    "53",    // insufficient resources (disk full, out of memory, too many connections)
    "57P01", // admin_shutdown
    "57P02", // crash_shutdown
    "57P03", // cannot_connect_now
    "57014", // query_canceled (statement_timeout)
    "55P03", // lock_not_available (lock_timeout)
    "25006", // read_only_sql_transaction (a standby after failover)
];

/// Whether `error` means the database could not be reached or the transaction failed for a reason a
/// retry can cure, rather than that the database refused what it was asked.
pub fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => {
            sqlstate(error).is_some_and(|code| TRANSIENT_SQLSTATES.iter().any(|t| code.starts_with(t)))
        }
        _ => false,
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        if is_transient(&error) { Self::Unavailable(error.into()) } else { Self::Unexpected(error.into()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losing_the_connection_is_unavailable_and_a_decode_bug_is_not() {
        assert!(StoreError::from(sqlx::Error::PoolTimedOut).is_unavailable());
        assert!(StoreError::from(sqlx::Error::Io(std::io::Error::other("reset"))).is_unavailable());
        assert!(!StoreError::from(sqlx::Error::RowNotFound).is_unavailable());
    }
}
