//! `oncepay_store::leases::sweep`, the takeover of expired worker leases, against a real
//! PostgreSQL: inside the provider's key window a payment goes back to `pending` and is claimable
//! again, past it the payment becomes `unknown` and is queued, and unexpired or busy leases are left
//! alone.

use std::time::Duration;

use oncepay_domain::status::PaymentStatus;
use oncepay_provider::KeyWindow;
use oncepay_store::leases::{self, SweepCounts};
use oncepay_store::transitions::Settlement;
use sqlx::PgPool;

use crate::support::{self, Accepted, accept, config, drainer, tenant};

const KEY_WINDOW: KeyWindow =
    KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3_600) };

async fn sweep(pool: &PgPool, batch_size: u32) -> SweepCounts {
    let mut conn = pool.acquire().await.unwrap();
    leases::sweep(&mut conn, "sweeper", KEY_WINDOW, batch_size).await.unwrap()
}

/// Accepts `n` payments and has a worker claim them all (no provider is called).
async fn claimed_payments(pool: &PgPool, n: usize) -> Vec<(Accepted, i64)> {
    let tenant_id = tenant(pool).await;
    let mut accepted = Vec::new();
    for _ in 0..n {
        accepted.push(accept(pool, tenant_id, 700).await);
    }
    let claimed = drainer(pool, &support::refusing_url(), config("gone")).claim(100).await.unwrap();
    assert_eq!(claimed.len(), n);
    accepted
        .into_iter()
        .map(|a| (a, claimed.iter().find(|c| c.payment_id == a.payment_id).unwrap().fencing_token))
        .collect()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_expired_lease_inside_the_key_window_goes_back_to_pending_and_is_claimable_again(pool: PgPool) {
    let (accepted, old_token) = claimed_payments(&pool, 1).await[0];
    support::expire_leases(&pool).await;
    let before = support::db_now(&pool).await;

    let counts = sweep(&pool, 10).await;

    assert_eq!(counts, SweepCounts { released: 1, ..SweepCounts::default() });
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Pending);
    let row = support::outbox_row(&pool, accepted).await.unwrap();
    assert_eq!((row.locked_by, row.locked_until, row.fencing_token), (None, None, None));
    assert_eq!(row.lease_expirations, 1);
    assert!(row.available_at <= support::db_now(&pool).await && row.available_at >= before, "due now");
    let last = support::events(&pool, accepted).await.pop().unwrap();
    assert_eq!((last.0, last.1, last.2.as_str()), (Some(PaymentStatus::Processing), PaymentStatus::Pending, "sweeper"));
    assert!(support::unknown_entry(&pool, accepted).await.is_none());

    let reclaimed = drainer(&pool, &support::refusing_url(), config("next")).claim(10).await.unwrap();

    assert_eq!(reclaimed.len(), 1);
    assert!(reclaimed[0].fencing_token > old_token, "a new claim, a new token");
    assert!(reclaimed[0].may_be_charged);
    assert!(reclaimed[0].send_is_safe());
    assert_eq!(reclaimed[0].attempt, 2);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_expired_lease_past_the_key_window_makes_the_payment_unknown_and_queues_it(pool: PgPool) {
    let (accepted, token) = claimed_payments(&pool, 1).await[0];
    support::expire_leases(&pool).await;
    support::age_first_send(&pool, accepted, Duration::from_secs(23 * 3_600 + 1)).await;

    let counts = sweep(&pool, 10).await;

    assert_eq!(counts, SweepCounts { uncertain: 1, ..SweepCounts::default() });
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Unknown);
    assert!(support::outbox_row(&pool, accepted).await.is_none());
    let (reason, evidence) = support::unknown_entry(&pool, accepted).await.unwrap();
    assert_eq!(reason, "lease_expired_past_key_window");
    assert_eq!(evidence[0]["locked_by"], "gone");
    assert_eq!(evidence[0]["fencing_token"], token);
    let last = support::events(&pool, accepted).await.pop().unwrap();
    assert_eq!((last.0, last.1, last.2.as_str()), (Some(PaymentStatus::Processing), PaymentStatus::Unknown, "sweeper"));
    assert!(drainer(&pool, &support::refusing_url(), config("next")).claim(10).await.unwrap().is_empty());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn unexpired_leases_are_left_alone(pool: PgPool) {
    let claimed = claimed_payments(&pool, 2).await;

    let counts = sweep(&pool, 10).await;

    assert_eq!(counts, SweepCounts::default());
    for (accepted, token) in claimed {
        assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Processing);
        let row = support::outbox_row(&pool, accepted).await.unwrap();
        assert_eq!((row.locked_by.as_deref(), row.fencing_token), (Some("gone"), Some(token)));
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_lease_its_worker_is_recording_right_now_is_skipped(pool: PgPool) {
    let (accepted, _) = claimed_payments(&pool, 1).await[0];
    support::expire_leases(&pool).await;
    // The worker's recording transaction holds the row.
    let mut recording = pool.begin().await.unwrap();
    sqlx::query!(r#"SELECT 1 AS "locked" FROM outbox WHERE payment_id = $1 FOR UPDATE"#, accepted.payment_id.as_uuid())
        .fetch_one(&mut *recording)
        .await
        .unwrap();

    let counts = sweep(&pool, 10).await;
    recording.rollback().await.unwrap();

    assert_eq!(counts, SweepCounts { skipped: 1, ..SweepCounts::default() });
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Processing);
    assert_eq!(sweep(&pool, 10).await.released, 1, "taken back once the row is free");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_expired_lease_of_a_payment_settled_meanwhile_is_dropped(pool: PgPool) {
    let (accepted, _) = claimed_payments(&pool, 1).await[0];
    support::settle_by_webhook(
        &pool,
        accepted,
        &Settlement::Failed { code: "card_declined".into(), message: "declined".into(), charge_id: None },
    )
    .await;
    support::expire_leases(&pool).await;

    let counts = sweep(&pool, 10).await;

    assert_eq!(counts, SweepCounts { obsolete: 1, ..SweepCounts::default() });
    assert!(support::outbox_row(&pool, accepted).await.is_none());
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Failed);
    let last = support::events(&pool, accepted).await.pop().unwrap();
    assert_eq!(last.2, "webhook", "the sweeper wrote no transition");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_sweep_takes_at_most_one_batch_oldest_lease_first(pool: PgPool) {
    let claimed = claimed_payments(&pool, 3).await;
    // Expire them with distinct ages: the first one's lease expired most recently.
    for (age, (accepted, _)) in claimed.iter().enumerate() {
        sqlx::query!(
            "UPDATE outbox SET locked_until = now() - make_interval(secs => $2) WHERE payment_id = $1",
            accepted.payment_id.as_uuid(),
            10.0 + age as f64
        )
        .execute(&pool)
        .await
        .unwrap();
    }

    let first = sweep(&pool, 2).await;

    assert_eq!(first, SweepCounts { released: 2, ..SweepCounts::default() });
    assert_eq!(support::status(&pool, claimed[0].0).await, PaymentStatus::Processing, "the youngest expiry waits");
    assert_eq!(sweep(&pool, 2).await, SweepCounts { released: 1, ..SweepCounts::default() });
    assert_eq!(sweep(&pool, 2).await, SweepCounts::default());
}
