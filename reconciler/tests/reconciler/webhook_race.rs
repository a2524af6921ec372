//! A webhook that arrives while the worker is settling the same payment: it waits for the worker's
//! transaction and then judges the charge against everything that transaction committed (status and
//! ledger entry), so it agrees with the settled payment instead of reporting a false conflict.

use std::time::Duration;

use oncepay_devkit::wait::wait_until;
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::ChargeStatus;
use oncepay_provider::wire::{EventType, WebhookEvent};
use oncepay_reconciler::webhooks::{self, Handled};
use oncepay_store::fixtures::{count, tenant};
use oncepay_store::settlement::{self, Asked};
use oncepay_store::transitions::{self, Recorded};
use sqlx::PgPool;

use crate::support::{accept, change, charge, claim};

/// Waits until some session of this database waits for a row lock.
async fn someone_waits_for_a_lock(pool: &PgPool) {
    wait_until("a session to wait for a row lock", Duration::from_secs(10), || async {
        let waiting = sqlx::query_scalar!(
            r#"SELECT count(*) AS "waiting!" FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock'"#
        )
        .fetch_one(pool)
        .await
        .unwrap();
        (waiting > 0).then_some(())
    })
    .await
    .unwrap();
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_webhook_racing_the_workers_settlement_agrees_with_it(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = accept(&pool, tenant_id, "order-1", 4_200).await;
    claim(&pool, tenant_id, payment_id, 1).await;
    let charged = charge(tenant_id, payment_id, "ch_race", ChargeStatus::Succeeded, 4_200);
    let asked = Asked {
        payment_id,
        account: None,
        amount: Amount::new(4_200).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
    };
    let settlement = settlement::settlement_of(&asked, &charged).unwrap();
    let transition = settlement::transition_of(&settlement);
    // The worker's recording: status and ledger entry in one transaction, not yet committed.
    let mut worker = pool.begin().await.unwrap();
    let settled = transitions::settle(
        &mut worker,
        &change(tenant_id, payment_id, PaymentStatus::Processing, transition),
        &settlement,
    )
    .await
    .unwrap();
    assert!(matches!(settled, Recorded::Moved(_)));

    let event = WebhookEvent { event_type: EventType::ChargeSucceeded, created: charged.created, data: charged };
    let delivery = tokio::spawn({
        let pool = pool.clone();
        async move { webhooks::apply(&pool, "msg_race", &event).await.unwrap() }
    });
    someone_waits_for_a_lock(&pool).await;
    worker.commit().await.unwrap();
    let outcome = delivery.await.unwrap();

    assert_eq!(outcome, Handled::Recorded("already_terminal"));
    assert_eq!(count(&pool, "dead_letters").await, 0);
}
