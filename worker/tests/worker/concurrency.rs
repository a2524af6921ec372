//! Many workers at once: drainers with their own pools drain 2,000 payments concurrently, and the
//! provider sees exactly one request per payment.

use std::time::Duration;

use oncepay_devkit::wait::wait_until;
use oncepay_provider::http::HttpProvider;
use oncepay_store::fixtures;
use oncepay_worker::{Counts, Drainer};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;
use wiremock::MockServer;

use crate::support::{self, Charges, accept, config, tenant};

const PAYMENTS: usize = 2_000;

async fn succeeded(pool: &PgPool) -> i64 {
    sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM payments WHERE status = 'succeeded'"#)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Drains with `workers` drainers that claim up to `batch_size` rows at a time into 16 slots each.
async fn drain_with_workers(pool: PgPool, workers: usize, batch_size: u32) {
    let server = MockServer::start().await;
    let charges = Charges::new();
    charges.mount(&server).await;
    let tenant_id = tenant(&pool).await;
    let mut accepted = Vec::with_capacity(PAYMENTS);
    for i in 0..PAYMENTS {
        accepted.push(accept(&pool, tenant_id, 100 + i as i64).await);
    }

    let shutdown = CancellationToken::new();
    let mut running = Vec::new();
    for n in 0..workers {
        // Each worker has its own pool, as separate processes would.
        let own_pool =
            PgPoolOptions::new().max_connections(6).connect_with((*pool.connect_options()).clone()).await.unwrap();
        let mut config = config(&format!("w{n}"));
        config.batch_size = batch_size;
        let drainer =
            Drainer::new(own_pool, HttpProvider::new(&support::provider_settings(&server.uri())).unwrap(), config);
        let shutdown = shutdown.clone();
        running.push(tokio::spawn(async move { drainer.run(shutdown).await }));
    }
    // Wait for the event itself: every payment settled.
    let settled = wait_until("every payment to settle", Duration::from_secs(300), || async {
        (succeeded(&pool).await == PAYMENTS as i64).then_some(())
    })
    .await;
    assert!(settled.is_ok(), "only {} of {PAYMENTS} settled", succeeded(&pool).await);
    shutdown.cancel();
    let mut per_worker = Vec::new();
    for handle in running {
        per_worker.push(handle.await.unwrap());
    }

    let requests = charges.requests();
    assert_eq!(requests.len(), PAYMENTS, "one downstream key per payment");
    let resent: Vec<_> = requests.iter().filter(|(_, n)| **n != 1).collect();
    assert!(resent.is_empty(), "keys sent more than once: {resent:?}");
    for payment in &accepted {
        assert_eq!(requests.get(payment.payment_id.downstream_key().as_str()), Some(&1));
    }
    assert_eq!(fixtures::count(&pool, "outbox").await, 0, "nothing left in the outbox");
    assert_eq!(fixtures::count(&pool, "ledger_entries").await, PAYMENTS as i64);
    let mut total = Counts::default();
    for counts in &per_worker {
        assert!(counts.claimed > 0, "every worker took part: {per_worker:?}");
        total += *counts;
    }
    assert_eq!(total, Counts { claimed: PAYMENTS as u64, succeeded: PAYMENTS as u64, ..Counts::default() });
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn two_workers_drain_2000_payments_with_exactly_one_provider_request_each(pool: PgPool) {
    drain_with_workers(pool, 2, 16).await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn four_workers_drain_2000_payments_with_exactly_one_provider_request_each(pool: PgPool) {
    // Batches smaller than the slots: a worker claims several batches before it waits.
    drain_with_workers(pool, 4, 5).await;
}
