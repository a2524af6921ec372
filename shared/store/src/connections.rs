//! Connections for hot request paths: a bounded set of PostgreSQL connections, checked out and
//! returned without a round trip to the server.
//!
//! Invariants: at most `max` connections are open or opening at once; a checkout waits at most the
//! acquire timeout ([`sqlx::Error::PoolTimedOut`]); a released connection is in no transaction and
//! has nothing left to send. A connection belongs to the runtime that opened it, so a process with
//! several runtimes (actix's HTTP workers) keeps one set per runtime. This module runs no SQL of
//! its own.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, PgPool};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{Instant, timeout_at};

/// A bounded set of connections to one database.
///
/// Not sqlx's pool: that pings a connection (a `Sync` message and its `ReadyForQuery`) each time one
/// is returned, and again before handing it out unless told not to, a round trip on every checkout
/// of a hot path (BENCHMARKS.md has what it costs). Here a connection is returned only when the
/// caller says its last statement completed, so it is known to be idle.
pub struct Connections {
    options: PgConnectOptions,
    // A std mutex: held only to push or pop, never across an `.await`.
    idle: Mutex<Vec<PgConnection>>,
    slots: Semaphore,
    acquire_timeout: Duration,
}

/// One connection, checked out. Dereferences to the connection; give it back with
/// [`Checkout::release`], or drop it to close it.
pub struct Checkout<'a> {
    connection: Option<PgConnection>,
    owner: &'a Connections,
    _slot: SemaphorePermit<'a>,
}

impl Connections {
    /// At most `max` connections made with `options`; a checkout waits at most `acquire_timeout`.
    /// Connects lazily: nothing is opened until a checkout needs it.
    pub fn new(options: PgConnectOptions, max: u32, acquire_timeout: Duration) -> Self {
        let max = usize::try_from(max.max(1)).unwrap_or(usize::MAX);
        Self { options, idle: Mutex::new(Vec::with_capacity(max)), slots: Semaphore::new(max), acquire_timeout }
    }

    /// A set with `pool`'s connect options, as many connections as it may open and its acquire
    /// timeout: for a process's hot paths beside the pool that serves the rest.
    pub fn like(pool: &PgPool) -> Self {
        let options = pool.options();
        Self::new((*pool.connect_options()).clone(), options.get_max_connections(), options.get_acquire_timeout())
    }

    /// An idle connection, or a new one if there is none and the limit allows, waiting for one to
    /// be released or closed otherwise.
    pub async fn acquire(&self) -> Result<Checkout<'_>, sqlx::Error> {
        let deadline = Instant::now() + self.acquire_timeout;
        let slot = timeout_at(deadline, self.slots.acquire())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .map_err(|_| sqlx::Error::PoolClosed)?;
        self.checkout(slot, deadline).await
    }

    /// An idle connection for `slot`, or a new one made by `deadline`.
    async fn checkout<'a>(&'a self, slot: SemaphorePermit<'a>, deadline: Instant) -> Result<Checkout<'a>, sqlx::Error> {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let connection = match idle {
            Some(connection) => connection,
            None => timeout_at(deadline, self.options.connect()).await.map_err(|_| sqlx::Error::PoolTimedOut)??,
        };
        Ok(Checkout { connection: Some(connection), owner: self, _slot: slot })
    }

    /// A connection if the limit allows one now, idle or new; `None` at once if every connection is
    /// checked out. For work that may be skipped, so that it never waits for, nor holds up, the
    /// callers of [`Connections::acquire`]. A failure to connect is an error, as there.
    pub async fn try_acquire(&self) -> Option<Result<Checkout<'_>, sqlx::Error>> {
        let slot = self.slots.try_acquire().ok()?;
        Some(self.checkout(slot, Instant::now() + self.acquire_timeout).await)
    }

    /// Refuses further checkouts and closes the idle connections (checked-out ones close when they
    /// are released or dropped).
    pub async fn close(&self) {
        self.slots.close();
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(PoisonError::into_inner));
        for connection in idle {
            let _ = connection.close().await;
        }
    }

    /// How many idle connections the set holds.
    pub fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Checkout<'_> {
    /// Gives the connection back for the next checkout. Only after its last statement completed,
    /// outside a transaction (or after the commit); one still inside a transaction is closed.
    ///
    /// So is one with messages still to send. A transaction dropped without commit or rollback only
    /// queues its `ROLLBACK`, sent with the connection's next statement: until then PostgreSQL keeps
    /// the transaction open, with every lock it took. Kept idle, such a connection would hold them
    /// for as long as nobody checks it out; closed, its backend ends and they go with it.
    ///
    /// A connection that died while idle (PostgreSQL restarted) is not noticed here: the next
    /// statement on it fails, its caller fails closed and drops the checkout instead of releasing it.
    pub fn release(mut self) {
        if let Some(connection) = self.connection.take()
            && !connection.is_in_transaction()
            // Public, though hidden from sqlx's documentation; tests/connections.rs checks that it
            // still sees a dropped transaction's queued ROLLBACK.
            && !connection.should_flush()
            && !self.owner.slots.is_closed()
        {
            self.owner.idle.lock().unwrap_or_else(PoisonError::into_inner).push(connection);
        }
    }

    fn connection(&self) -> &PgConnection {
        // `connection` is only taken by `release`, which consumes the checkout.
        self.connection.as_ref().unwrap_or_else(|| unreachable!("a released checkout is gone"))
    }

    fn connection_mut(&mut self) -> &mut PgConnection {
        self.connection.as_mut().unwrap_or_else(|| unreachable!("a released checkout is gone"))
    }
}

impl Deref for Checkout<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.connection()
    }
}

impl DerefMut for Checkout<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.connection_mut()
    }
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        // Not released: its state is unknown (an error, or a statement cut short), so it is closed
        // rather than reused. Dropping the connection closes its socket; PostgreSQL ends the backend.
        drop(self.connection.take());
    }
}
