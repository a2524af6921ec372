//! The reaper against a real PostgreSQL: expired keys of terminal payments go, in batches; keys of
//! payments still in flight stay however old they are; old webhook ids go, recent ones stay.

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_reconciler::reaper::Counts;
use oncepay_reconciler::unknown::Why;
use oncepay_reconciler::unknown::payments as unknown;
use oncepay_store::fixtures::{count, tenant};
use oncepay_store::merchant_endpoints::{self, NewEndpoint};
use oncepay_store::merchant_events;
use oncepay_store::transitions::{self, Settlement};
use oncepay_webhook_signature::WebhookSecret;
use serde_json::json;
use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::support::{accept, change, claim, count_for, reaper, unknown_payment};

/// Makes the payment's key two days old and expired a day ago.
async fn expire_key(pool: &PgPool, payment_id: PaymentId) {
    sqlx::query!(
        "UPDATE idempotency_keys SET created_at = now() - interval '2 days', expires_at = now() - interval '1 day'
         WHERE payment_id = $1",
        payment_id.as_uuid()
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn succeeded(pool: &PgPool, tenant_id: TenantId, key: &str) -> PaymentId {
    let payment_id = accept(pool, tenant_id, key, 100).await;
    claim(pool, tenant_id, payment_id, 1).await;
    let settlement = Settlement::Succeeded {
        charge_id: format!("ch_{key}"),
        amount: Amount::new(100).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        charged_at: OffsetDateTime::now_utc(),
    };
    let mut conn = pool.acquire().await.unwrap();
    let change = change(tenant_id, payment_id, PaymentStatus::Processing, Transition::Charged);
    transitions::settle(&mut conn, &change, &settlement).await.unwrap();
    payment_id
}

async fn has_key(pool: &PgPool, payment_id: PaymentId) -> bool {
    count_for(pool, "idempotency_keys", payment_id).await == 1
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn expired_keys_of_terminal_payments_go_and_keys_of_payments_in_flight_stay(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let done = succeeded(&pool, tenant_id, "done").await;
    let done_but_retained = succeeded(&pool, tenant_id, "retained").await;
    let pending = accept(&pool, tenant_id, "pending", 100).await;
    let processing = accept(&pool, tenant_id, "processing", 100).await;
    claim(&pool, tenant_id, processing, 1).await;
    let unknown = unknown_payment(&pool, tenant_id, "unknown", 100, 60).await;
    let dead = unknown_payment(&pool, tenant_id, "dead", 100, 60).await;
    let mut tx = pool.begin().await.unwrap();
    unknown::exhaust(&mut tx, tenant_id, dead, Why { actor: "test", reason: "attempts spent" }, json!({}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    for payment_id in [done, pending, processing, unknown, dead] {
        expire_key(&pool, payment_id).await;
    }

    let counts = reaper(&pool, 100).run_once().await.unwrap();

    assert_eq!(counts, Counts { keys: 1, ..Counts::default() });
    assert!(!has_key(&pool, done).await);
    for payment_id in [done_but_retained, pending, processing, unknown, dead] {
        assert!(has_key(&pool, payment_id).await, "{payment_id}");
    }
    // The payment itself, its audit trail and its ledger entry are never reaped.
    assert_eq!(count_for(&pool, "payments", done).await, 1);
    assert_eq!(count_for(&pool, "ledger_entries", done).await, 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn keys_are_reaped_in_batches_of_the_configured_size(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    for i in 0..5 {
        let payment_id = succeeded(&pool, tenant_id, &format!("k{i}")).await;
        expire_key(&pool, payment_id).await;
    }
    let reaper = reaper(&pool, 2);

    let passes = [reaper.run_once().await.unwrap(), reaper.run_once().await.unwrap(), reaper.run_once().await.unwrap()];

    assert_eq!(passes.map(|c| c.keys), [2, 2, 1]);
    assert_eq!(count(&pool, "idempotency_keys").await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn webhook_ids_past_their_retention_go_and_recent_ones_stay(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = accept(&pool, tenant_id, "order-1", 100).await;
    for (id, age_days) in [("old", 8), ("recent", 6)] {
        sqlx::query!(
            "INSERT INTO webhook_events (tenant_id, webhook_id, event_type, payment_id, outcome, received_at)
             VALUES ($1, $2, 'charge.succeeded', $3, 'not_unknown', now() - make_interval(days => $4))",
            tenant_id.as_uuid(),
            id,
            payment_id.as_uuid(),
            age_days
        )
        .execute(&pool)
        .await
        .unwrap();
    }

    let counts = reaper(&pool, 100).run_once().await.unwrap();

    assert_eq!(counts, Counts { webhook_events: 1, ..Counts::default() });
    let left: Vec<String> =
        sqlx::query_scalar!("SELECT webhook_id FROM webhook_events").fetch_all(&pool).await.unwrap();
    assert_eq!(left, ["recent"]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn events_to_merchants_past_their_retention_go_unless_a_delivery_is_still_owed(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let mut conn = pool.acquire().await.unwrap();
    let secret = WebhookSecret::generate();
    let new = NewEndpoint { url: "https://acme.example/hooks", description: "", event_types: &[], secret: &secret };
    let endpoint = merchant_endpoints::create(&mut conn, tenant_id, &new).await.unwrap();
    // Past the 30 days' retention: delivered, dead-lettered, and still owed; and one within it.
    let ages_and_states = [(31, "delivered"), (31, "dead_lettered"), (31, "pending"), (29, "delivered")];
    let mut ids = Vec::new();
    for (age_days, state) in ages_and_states {
        let event_id = merchant_events::send_test(&mut conn, &endpoint).await.unwrap();
        sqlx::query("UPDATE merchant_events SET created_at = now() - make_interval(days => $2) WHERE event_id = $1")
            .bind(event_id)
            .bind(age_days)
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("UPDATE merchant_deliveries SET state = $2 WHERE event_id = $1")
            .bind(event_id)
            .bind(state)
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO merchant_delivery_attempts (tenant_id, endpoint_id, event_id, attempted_at, worker, status)
             SELECT tenant_id, endpoint_id, event_id, now(), 'worker-0', 500 FROM merchant_deliveries WHERE event_id = $1",
        )
        .bind(event_id)
        .execute(&pool)
        .await
        .unwrap();
        ids.push(event_id);
    }

    let counts = reaper(&pool, 100).run_once().await.unwrap();

    assert_eq!(counts, Counts { merchant_events: 2, ..Counts::default() });
    let mut kept = vec![ids[2], ids[3]];
    kept.sort();
    for sql in [
        "SELECT DISTINCT event_id FROM merchant_events ORDER BY event_id",
        "SELECT DISTINCT event_id FROM merchant_deliveries ORDER BY event_id",
        "SELECT DISTINCT event_id FROM merchant_delivery_attempts ORDER BY event_id",
    ] {
        let left: Vec<Uuid> = sqlx::query_scalar(sql).fetch_all(&pool).await.unwrap();
        assert_eq!(left, kept, "{sql}");
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_is_kept_its_retention_after_its_payment_became_final_however_old_the_key(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    // Accepted two days ago with a day's retention, and `unknown` ever since.
    let late = unknown_payment(&pool, tenant_id, "late", 100, 60).await;
    expire_key(&pool, late).await;
    let settlement = Settlement::Succeeded {
        charge_id: "ch_late".into(),
        amount: Amount::new(100).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        charged_at: OffsetDateTime::now_utc(),
    };
    let mut conn = pool.acquire().await.unwrap();
    let change = change(tenant_id, late, PaymentStatus::Unknown, Transition::Charged);
    transitions::settle(&mut conn, &change, &settlement).await.unwrap();

    let counts = reaper(&pool, 100).run_once().await.unwrap();

    assert_eq!(counts, Counts::default());
    assert!(has_key(&pool, late).await, "a retry with the same key must still find the payment");
    let kept_for: f64 = sqlx::query_scalar!(r#"SELECT extract(epoch FROM expires_at - now())::float8 AS "kept_for!" FROM idempotency_keys WHERE payment_id = $1"#, late.as_uuid())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(kept_for > 86_400.0 - 60.0, "kept a day from now, not {kept_for} s");
}
