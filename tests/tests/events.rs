//! Events to merchants when a worker is paused between claiming a delivery and sending it: the
//! order a receiver sees a payment's events in must not depend on when a worker wakes up.
//!
//! The test makes the pause happen at that moment every time. Worker 1 is paused throughout, so
//! worker 0 makes every claim. The endpoint responds 500 to the payment's event, then the merchant
//! disables it, so the delivery waits with its retry due. The test then enables the endpoint
//! with the delivery leased elsewhere, holds a lock on `merchant_events`, gives the lease up, waits
//! until worker 0's next claim waits on the lock, pauses worker 0 and lets go of the lock. The
//! claim goes through in PostgreSQL while its worker is frozen. Worker 1 then takes the delivery over once the lease has run out, and delivers it and
//! the refund's event after it. Worker 0 is resumed last.
//!
//! Needs every binary built (`cargo build --workspace --bins`; the test command does it first).

// Helpers outside `#[test]` functions fail loudly too: clippy's test exemption does not reach them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use oncepay_client::{Client, IdempotencyKey, PaymentIntent, PaymentStatus, RefundIntent};
use oncepay_devkit::pg::Durability;
use oncepay_devkit::process::setting_variable;
use oncepay_tests::events::{self, EventsVerdict, Subscription};
use oncepay_tests::receiver::{Behaviour, Plan, Receiver};
use oncepay_tests::system::{Binaries, Processes, Provider, Role, System, SystemConfig, Timing, Topology};
use sqlx::PgPool;
use uuid::Uuid;

/// Long enough to disable the endpoint before the retry is due.
const RETRY_AFTER_SECS: f64 = 5.0;

fn always(behaviour: Behaviour) -> Plan {
    Plan { mix: vec![(behaviour, 1)], gone_after: None }
}

async fn start() -> System {
    let mut env = events::settings();
    env.push((
        Processes::Only(Role::Worker),
        setting_variable("events.retry_schedule_secs"),
        format!("[{RETRY_AFTER_SECS}, {RETRY_AFTER_SECS}]"),
    ));
    // Few connections, so that the claims below prepare the claim on each of them.
    env.push((Processes::Only(Role::Worker), setting_variable("database.max_connections"), "3".to_owned()));
    System::start(SystemConfig {
        binaries: Binaries::built().unwrap(),
        topology: Topology { apis: 1, workers: 2, reconcilers: 1 },
        tenants: vec!["acme".into()],
        durability: Durability::Fast,
        timing: Timing::default(),
        provider: Provider::Simulator { seed: 49 },
        log_dir: None,
        env,
        broker: false,
    })
    .await
    .unwrap()
}

/// Turns the endpoint's deliveries off or on, as its merchant does.
async fn set_enabled(system: &System, endpoint: &Subscription, enabled: bool) {
    let api = &system.api_urls()[0];
    reqwest::Client::new()
        .patch(format!("{api}/v1/webhook-endpoints/{}", endpoint.endpoint_id))
        .bearer_auth(&system.tenants()[0].api_key)
        .json(&serde_json::json!({ "enabled": enabled }))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .unwrap();
}

/// Polls `check` until it is true, for at most 30 s.
async fn wait_until<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("waited 30 s for {what}");
}

/// The delivery of one event, of what the test follows.
#[derive(Debug, sqlx::FromRow)]
struct Delivery {
    state: String,
    attempts: i32,
    due: bool,
    locked_by: Option<String>,
    fencing_token: i64,
}

async fn delivery(pool: &PgPool, event_id: Uuid) -> Delivery {
    sqlx::query_as(
        "SELECT state, attempts, next_attempt_at < now() AS due, locked_by, fencing_token
           FROM merchant_deliveries WHERE event_id = $1",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Leases the delivery of `event_id` for an hour to a worker that does not exist, or (`held`
/// false) gives that lease up, keeping the fencing token.
async fn hold_lease(pool: &PgPool, event_id: Uuid, held: bool) {
    // Two statements: Citus refuses `now()` inside a `CASE` of an UPDATE.
    let lease = if held {
        "UPDATE merchant_deliveries SET locked_by = 'elsewhere', locked_until = now() + interval '1 hour'
          WHERE event_id = $1"
    } else {
        "UPDATE merchant_deliveries SET locked_by = NULL, locked_until = NULL WHERE event_id = $1"
    };
    sqlx::query(lease).bind(event_id).execute(pool).await.unwrap();
}

/// Whether a worker's statement on `merchant_deliveries` waits on a lock.
async fn a_claim_waits(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT count(*) > 0 FROM pg_stat_activity
          WHERE usename = 'oncepay_worker' AND wait_event_type = 'Lock' AND query LIKE '%merchant_deliveries%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The deliveries a worker counted as lost to an expired lease, from its `/metrics` at `url`.
async fn leases_lost(url: &str) -> u64 {
    let text = reqwest::get(url).await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(r#"oncepay_worker_event_deliveries_total{result="lease_lost"} "#))
        .map_or(0, |count| count.trim().parse().unwrap())
}

/// The id of the event of type `event_type`.
async fn event_id(pool: &PgPool, event_type: &str) -> Uuid {
    sqlx::query_scalar("SELECT event_id FROM merchant_events WHERE type = $1")
        .bind(event_type)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_paused_after_its_claim_never_sends_a_payments_event_after_a_later_one() {
    let mut system = start().await;
    let receiver = Receiver::start(49, events::TOO_LATE).await.unwrap();
    let tenant = system.tenants()[0].clone();
    let endpoint =
        events::subscribe_endpoint(&system, &tenant, &receiver, "main-0", &[], always(Behaviour::ServerError))
            .await
            .unwrap();
    let subscriptions = [endpoint.clone()];
    let pool = system.pool().clone();
    let client = Client::new(system.api_urls()[0].clone(), tenant.api_key.clone()).unwrap();
    system.pause(Role::Worker, 1).unwrap();

    // The payment succeeds; its event's first attempt gets a 500, and the merchant turns the
    // endpoint off before the retry is due.
    let intent = PaymentIntent::builder(1999, "EUR", "cus-49").build_with_key(IdempotencyKey::new("order-49").unwrap());
    let payment = client.create(&intent).await.unwrap().payment;
    let payment = client.wait_for_terminal(&payment.id, Duration::from_secs(30)).await.unwrap();
    assert_eq!(payment.status, PaymentStatus::Succeeded);
    let succeeded = event_id(&pool, "payment.succeeded").await;
    wait_until("the first attempt", || async { delivery(&pool, succeeded).await.attempts == 1 }).await;
    set_enabled(&system, &endpoint, false).await;
    receiver.set_plan("main-0", always(Behaviour::Accept)).unwrap();
    wait_until("the retry to be due", || async { delivery(&pool, succeeded).await.due }).await;

    // The endpoint is on again, but the delivery is leased to someone else: worker 0 claims it at
    // every poll and finds nothing, which prepares its claim on each of its few connections. A
    // claim still to be prepared would wait on the lock below in its preparation, and a worker
    // frozen there never sends the claim itself.
    hold_lease(&pool, succeeded, true).await;
    set_enabled(&system, &endpoint, true).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Worker 0's next claim waits on the lock of the events (finding the tenants with deliveries
    // due does not read them); it is paused there, and the claim goes through while it is frozen.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE merchant_events IN ACCESS EXCLUSIVE MODE").execute(&mut *lock).await.unwrap();
    hold_lease(&pool, succeeded, false).await;
    wait_until("worker 0's claim to wait on the lock", || a_claim_waits(&pool)).await;
    system.pause(Role::Worker, 0).unwrap();
    lock.rollback().await.unwrap();
    wait_until("the frozen worker's claim", || async {
        let claimed = delivery(&pool, succeeded).await;
        claimed.locked_by.as_deref() == Some("worker-0") && claimed.fencing_token == 2
    })
    .await;

    // Worker 1 takes the delivery over when the lease runs out, then delivers the refund's event.
    system.resume(Role::Worker, 1).unwrap();
    wait_until("the takeover", || async { delivery(&pool, succeeded).await.state == "delivered" }).await;
    let refund = RefundIntent::builder(payment.id).build_with_key(IdempotencyKey::new("refund-49").unwrap());
    let refund = client.refund(&refund).await.unwrap().refund;
    client.wait_for_refund(&refund.id, Duration::from_secs(30)).await.unwrap();
    let refunded = event_id(&pool, "refund.succeeded").await;
    wait_until("the refund's event", || async { delivery(&pool, refunded).await.state == "delivered" }).await;

    // Worker 0 wakes up holding a claim whose lease ran out long ago. Whether it sends the event or
    // not, it counts the claim as lost once it is done with it.
    system.resume(Role::Worker, 0).unwrap();
    let metrics = format!("{}/metrics", system.url(Role::Worker, 0).unwrap());
    wait_until("worker 0 to be done with its stale claim", || async { leases_lost(&metrics).await >= 1 }).await;
    let verdict = EventsVerdict::judge(&pool, &subscriptions, &receiver).await.unwrap();

    let log: Vec<_> = receiver.log().into_iter().map(|l| (l.event_type, l.behaviour)).collect();
    assert!(verdict.violations.is_empty(), "{:#?}\nthe receiver got, in order: {log:?}", verdict.violations);
    system.shutdown().await.unwrap();
}
