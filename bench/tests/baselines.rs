//! Every raw baseline, run by pgbench for a moment against a freshly migrated database: the scripts
//! are built from the project's own SQL files, so a change to one of those that pgbench cannot run
//! (a missing cast, a renamed column) fails here and not only in a benchmark run.

// The helpers below are test code too; clippy's test allowance only covers `#[test]` functions.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use oncepay_bench::dataset::{self, ReplaySet, Tenant};
use oncepay_bench::measure::{self, Target, Timing};
use oncepay_bench::raw::{self, Baseline};
use sqlx::PgPool;

/// Settled payments the replays pick from.
const STORED: u64 = 100;

/// Pending payments: more than a claim+finish run of two seconds takes.
const BACKLOG: u64 = 20_000;

/// Refundable payments: enough that the refunds of a second rarely meet on one.
const REFUNDABLE: u64 = 2_000;

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn every_baseline_completes_transactions_and_writes_what_its_statements_write(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let tenant = Tenant::create(&mut conn, "bench").await.unwrap();
    dataset::load_settled(&mut conn, tenant.id, 0, STORED, "stored").await.unwrap();
    dataset::load_backlog(&mut conn, tenant.id, BACKLOG, "backlog").await.unwrap();
    drop(conn);
    let options = pool.connect_options();
    let database = options.get_database().unwrap().to_owned();
    let target =
        Target { pool: &pool, port: options.get_port(), database: &database, dataset: "test", postmasters: &[] };
    let timing = Timing { warmup: Duration::ZERO, window: Duration::from_secs(1) };
    let variables = raw::variables(&tenant, ReplaySet::all(STORED)).unwrap();
    let pgbench = oncepay_bench::pgbench::locate().await;
    let keys_before = count(&pool, "SELECT count(*) FROM idempotency_keys").await;

    for baseline in [
        Baseline::ThreeInserts,
        Baseline::Accept,
        Baseline::AcceptWithNotify,
        Baseline::AcceptGroup(4),
        Baseline::Replay,
        Baseline::ClaimFinish,
    ] {
        let keys = count(&pool, "SELECT count(*) FROM idempotency_keys").await;

        let row = measure::raw(&target, timing, &pgbench, baseline, 1, &variables).await.unwrap();

        assert!(row.ops > 0, "{} completed no transaction in its window", baseline.name());
        if let Baseline::AcceptGroup(size) = baseline {
            // Each transaction accepted a whole group, and the row counts payments.
            let added = u64::try_from(count(&pool, "SELECT count(*) FROM idempotency_keys").await - keys).unwrap();
            assert_eq!(added % u64::from(size), 0, "{added} keys");
            assert!(added >= row.ops && row.ops % u64::from(size) == 0, "{added} keys, {} payments", row.ops);
        }
    }

    // The accept baselines each wrote keys; the claim+finish settled backlog payments, each with
    // its claim and settlement in its history and one ledger entry.
    assert!(count(&pool, "SELECT count(*) FROM idempotency_keys").await > keys_before);
    let settled = count(&pool, "SELECT count(*) FROM payments WHERE status = 'succeeded' AND event_count = 3").await;
    assert!(settled > 0, "the claim+finish settled nothing");
    let ledger = count(&pool, "SELECT count(*) FROM ledger_entries").await;
    assert_eq!(ledger, settled, "one ledger entry per settled payment");
    let audited = count(
        &pool,
        "SELECT count(DISTINCT payment_id) FROM payment_events
         WHERE seq = 3 AND from_status = 'processing' AND to_status = 'succeeded'",
    )
    .await;
    assert_eq!(audited, settled, "one audit row per settlement, third in its payment's history");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_refund_baseline_writes_what_refund_intake_writes_for_each_refund(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let tenant = Tenant::create(&mut conn, "bench").await.unwrap();
    let refundable = dataset::load_refundable(&mut conn, tenant.id, REFUNDABLE).await.unwrap();
    drop(conn);
    let options = pool.connect_options();
    let database = options.get_database().unwrap().to_owned();
    let target =
        Target { pool: &pool, port: options.get_port(), database: &database, dataset: "test", postmasters: &[] };
    let timing = Timing { warmup: Duration::ZERO, window: Duration::from_secs(1) };
    let variables =
        [raw::variables(&tenant, ReplaySet::all(1)).unwrap(), raw::refund_variables(refundable).unwrap()].concat();
    let pgbench = oncepay_bench::pgbench::locate().await;

    let row = measure::raw(&target, timing, &pgbench, Baseline::Refund, 2, &variables).await.unwrap();

    assert!(row.ops > 0, "no refund in the window");
    let refunds = count(&pool, "SELECT count(*) FROM refunds WHERE status = 'pending' AND amount = 1").await;
    assert!(refunds >= i64::try_from(row.ops).unwrap(), "{refunds} refunds, {} in the window", row.ops);
    assert_eq!(count(&pool, "SELECT count(*) FROM refunds").await, refunds, "every refund is pending, of 1");
    for (table, sql) in [
        ("refund_keys", "SELECT count(*) FROM refund_keys k JOIN refunds USING (tenant_id, refund_id)"),
        (
            "refund_events",
            "SELECT count(*) FROM refund_events e JOIN refunds USING (tenant_id, refund_id) \
             WHERE e.seq = 1 AND e.to_status = 'pending' AND e.actor = 'api'",
        ),
        ("refund_outbox", "SELECT count(*) FROM refund_outbox o JOIN refunds USING (tenant_id, refund_id)"),
    ] {
        assert_eq!(count(&pool, sql).await, refunds, "one row of {table} per refund");
    }
    let reserved = count(&pool, "SELECT sum(refunds_reserved)::bigint FROM payments").await;
    assert_eq!(reserved, refunds, "each refund reserved its amount on its payment");
    let spread = count(&pool, "SELECT count(DISTINCT payment_id) FROM refunds").await;
    assert!(spread > 1, "the refunds are of payments picked at random");
}
