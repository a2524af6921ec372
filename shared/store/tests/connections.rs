//! The checkout set against a real PostgreSQL: reuse only after release, a bound on connections,
//! waiting for a released one, taking an idle one without waiting. Each test gets a fresh database.

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use oncepay_devkit::wait::wait_until;
use oncepay_store::connections::Connections;
use sqlx::{PgConnection, PgPool};

async fn backend(connection: &mut PgConnection) -> i32 {
    sqlx::query_scalar!(r#"SELECT pg_backend_pid() AS "pid!""#).fetch_one(connection).await.unwrap()
}

/// Returns once PostgreSQL has no backend `pid`; fails after 10 s.
async fn until_gone(pool: &PgPool, pid: i32) {
    let what = format!("backend {pid} to end");
    wait_until(&what, Duration::from_secs(10), || async {
        let alive =
            sqlx::query_scalar!(r#"SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1) AS "alive!""#, pid)
                .fetch_one(pool)
                .await
                .unwrap();
        (!alive).then_some(())
    })
    .await
    .unwrap();
}

fn connections(pool: &PgPool, max: u32, acquire_timeout: Duration) -> Connections {
    Connections::new((*pool.connect_options()).clone(), max, acquire_timeout)
}

#[sqlx::test]
async fn a_released_connection_is_reused_and_one_dropped_unreleased_is_closed(pool: PgPool) {
    let connections = connections(&pool, 2, Duration::from_secs(10));

    let mut first = connections.acquire().await.unwrap();
    let first_backend = backend(&mut first).await;
    first.release();
    let mut again = connections.acquire().await.unwrap();
    let again_backend = backend(&mut again).await;
    drop(again);
    let mut fresh = connections.acquire().await.unwrap();
    let fresh_backend = backend(&mut fresh).await;

    assert_eq!(again_backend, first_backend, "a released connection is the next one handed out");
    assert_ne!(fresh_backend, first_backend, "a connection dropped without release is not reused");
    assert_eq!(connections.idle(), 0);
    // The dropped connection's backend ends: PostgreSQL sees its socket close.
    until_gone(&pool, first_backend).await;
}

#[sqlx::test]
async fn a_checkout_without_waiting_is_refused_at_once_when_every_connection_is_out(pool: PgPool) {
    let connections = connections(&pool, 2, Duration::from_secs(10));
    let mut first = connections.acquire().await.unwrap();
    let first_backend = backend(&mut first).await;
    first.release();

    let mut idle = connections.try_acquire().await.expect("one is idle").unwrap();
    let mut new = connections.try_acquire().await.expect("the limit allows a second").unwrap();
    let refused = connections.try_acquire().await;

    assert!(refused.is_none(), "both are checked out");
    assert_eq!(backend(&mut idle).await, first_backend, "the idle one first");
    assert_ne!(backend(&mut new).await, first_backend);
    idle.release();
    new.release();
    assert_eq!(connections.idle(), 2);
}

#[sqlx::test]
async fn checkouts_past_the_limit_time_out(pool: PgPool) {
    let connections = connections(&pool, 1, Duration::from_millis(100));
    let _held = connections.acquire().await.unwrap();

    let refused = connections.acquire().await;

    assert!(matches!(refused, Err(sqlx::Error::PoolTimedOut)), "{:?}", refused.err());
}

#[sqlx::test]
async fn a_waiting_checkout_gets_the_connection_released_meanwhile(pool: PgPool) {
    let connections = connections(&pool, 1, Duration::from_secs(30));
    let mut held = connections.acquire().await.unwrap();
    let held_backend = backend(&mut held).await;

    // `join!` polls the waiting checkout first, then releases the held one.
    let (waiting, ()) = tokio::join!(connections.acquire(), async move { held.release() });
    let mut waited = waiting.unwrap();

    assert_eq!(backend(&mut waited).await, held_backend);
}

#[sqlx::test]
async fn after_close_no_checkout_is_handed_out(pool: PgPool) {
    let connections = connections(&pool, 2, Duration::from_secs(10));
    connections.acquire().await.unwrap().release();

    connections.close().await;

    assert_eq!(connections.idle(), 0);
    assert!(matches!(connections.acquire().await, Err(sqlx::Error::PoolClosed)));
}

#[sqlx::test]
async fn a_connection_whose_transaction_was_dropped_unfinished_is_closed_not_kept_holding_its_locks(pool: PgPool) {
    use sqlx::Connection;
    let connections = connections(&pool, 1, Duration::from_secs(10));
    let mut checkout = connections.acquire().await.unwrap();
    let checkout_backend = backend(&mut checkout).await;
    let mut tx = checkout.begin().await.unwrap();
    sqlx::query!("SELECT pg_advisory_xact_lock(37)").execute(&mut *tx).await.unwrap();

    // Dropping a transaction only queues its ROLLBACK, to be sent with the connection's next
    // statement: until then PostgreSQL keeps the transaction open, and its locks held.
    drop(tx);
    checkout.release();

    assert_eq!(connections.idle(), 0, "a connection with a rollback still to send is not idle");
    // Its backend ends, and the transaction's lock with it.
    until_gone(&pool, checkout_backend).await;
    let free: bool =
        sqlx::query_scalar!(r#"SELECT pg_try_advisory_lock(37) AS "free!""#).fetch_one(&pool).await.unwrap();
    assert!(free);
}
