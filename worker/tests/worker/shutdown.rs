//! Graceful shutdown: the drainer stops claiming at once, and records the sends already in flight
//! if they finish within the grace period; a send that does not keeps its lease for the sweeper.

use std::time::Duration;

use oncepay_domain::status::PaymentStatus;
use oncepay_provider::KeyWindow;
use oncepay_provider::http::HttpProvider;
use oncepay_store::fixtures;
use oncepay_store::leases::{self, SweepCounts};
use oncepay_worker::{Counts, Drainer};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use wiremock::MockServer;

use crate::support::{self, Charges, accept, config, tenant};

/// A drainer with one slot and a provider that answers after `delay`, started on two payments; returns
/// once the first request has reached the provider.
async fn one_send_in_flight(
    pool: &PgPool,
    delay: Duration,
    grace: Duration,
) -> (MockServer, Charges, CancellationToken, tokio::task::JoinHandle<Counts>, [support::Accepted; 2]) {
    let server = MockServer::start().await;
    let charges = Charges::with_delay(delay);
    charges.mount(&server).await;
    let tenant_id = tenant(pool).await;
    let payments = [accept(pool, tenant_id, 100).await, accept(pool, tenant_id, 200).await];
    let mut config = config("w1");
    config.max_in_flight = 1;
    config.shutdown_grace = grace;
    let mut provider = support::provider_settings(&server.uri());
    provider.request_timeout_ms = 30_000;
    let drainer = Drainer::new(pool.clone(), HttpProvider::new(&provider).unwrap(), config);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { drainer.run(shutdown).await }
    });
    charges.arrived().await;
    (server, charges, shutdown, running, payments)
}

async fn statuses(pool: &PgPool, payments: [support::Accepted; 2]) -> Vec<PaymentStatus> {
    let mut statuses = vec![support::status(pool, payments[0]).await, support::status(pool, payments[1]).await];
    statuses.sort_by_key(|s| s.as_str());
    statuses
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn shutdown_stops_claiming_and_records_the_send_in_flight(pool: PgPool) {
    let (_server, charges, shutdown, running, payments) =
        one_send_in_flight(&pool, Duration::from_millis(500), Duration::from_secs(10)).await;

    shutdown.cancel();
    let counts = running.await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, succeeded: 1, ..Counts::default() });
    assert_eq!(statuses(&pool, payments).await, [PaymentStatus::Pending, PaymentStatus::Succeeded]);
    assert_eq!(charges.requests().len(), 1, "the second payment was never sent");
    assert!(support::lease_holders(&pool).await.is_empty());
    assert_eq!(fixtures::count(&pool, "outbox").await, 1, "the unsent payment keeps its row");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_send_still_in_flight_when_the_grace_period_ends_keeps_its_lease_for_the_sweeper(pool: PgPool) {
    let (_server, _charges, shutdown, running, payments) =
        one_send_in_flight(&pool, Duration::from_secs(20), Duration::from_millis(200)).await;

    shutdown.cancel();
    let counts = running.await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, ..Counts::default() }, "nothing recorded");
    assert_eq!(statuses(&pool, payments).await, [PaymentStatus::Pending, PaymentStatus::Processing]);
    assert_eq!(support::lease_holders(&pool).await, ["w1"], "the lease outlives the worker");
    support::expire_leases(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    let window = KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3_600) };
    let swept = leases::sweep(&mut conn, "sweeper", window, 10).await.unwrap();
    assert_eq!(swept, SweepCounts { released: 1, ..SweepCounts::default() });
}
