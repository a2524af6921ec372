//! Sends that finish together are recorded together: one transaction for all their settlements, each
//! payment still guarded by its own fencing token and its own compare-and-set, and one payment's
//! problem never keeps the others from being recorded.
//!
//! Which sends share a transaction is read back from the database: every row a transaction writes
//! carries its id in `xmin`.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::KeyWindow;
use oncepay_provider::http::HttpProvider;
use oncepay_store::fixtures;
use oncepay_store::leases;
use oncepay_store::sending::Claimed;
use oncepay_store::transitions::Settlement;
use oncepay_worker::Drainer;
use oncepay_worker::record::{RecordError, Recorded};
use oncepay_worker::verdict::SendVerdict;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use time::OffsetDateTime;
use wiremock::MockServer;

use crate::support::{self, Accepted, Charges, accept, config, drainer, tenant};

/// `count` payments accepted, claimed by one worker and charged by the provider, not yet recorded.
async fn charged(
    pool: &PgPool,
    server: &MockServer,
    count: usize,
) -> (Drainer<HttpProvider>, Vec<(Accepted, Claimed)>) {
    let tenant_id = tenant(pool).await;
    let mut accepted = Vec::new();
    for i in 0..count {
        accepted.push(accept(pool, tenant_id, 100 + i as i64).await);
    }
    let worker = drainer(pool, &server.uri(), config("w1"));
    let mut claimed = worker.claim(count as u32).await.unwrap();
    assert_eq!(claimed.len(), count);
    // In the order they were accepted, so that the tests can name them.
    claimed.sort_by_key(|c| accepted.iter().position(|a| a.payment_id == c.payment_id));
    (worker, accepted.into_iter().zip(claimed).collect())
}

/// Sends every payment, one after the other, and decides what to record for each.
async fn send_all(worker: &Drainer<HttpProvider>, sends: &[(Accepted, Claimed)]) -> Vec<SendVerdict> {
    let mut verdicts = Vec::new();
    for (_, claimed) in sends {
        let outcome = worker.send(claimed).await;
        verdicts.push(worker.decide(claimed, &outcome));
    }
    verdicts
}

/// Records every verdict at once through `worker`, as sends that finish together would.
async fn record_together(
    worker: &Drainer<HttpProvider>,
    sends: &[(Accepted, Claimed)],
    verdicts: &[SendVerdict],
) -> Vec<Result<Recorded, RecordError>> {
    join_all(sends.iter().zip(verdicts).map(|((_, claimed), verdict)| worker.record(claimed, verdict))).await
}

/// Sends every payment, then records every outcome at once.
async fn send_and_record_together(
    worker: &Drainer<HttpProvider>,
    sends: &[(Accepted, Claimed)],
) -> Vec<Result<Recorded, RecordError>> {
    let verdicts = send_all(worker, sends).await;
    record_together(worker, sends, &verdicts).await
}

/// The transactions that last wrote these payments.
async fn writers(pool: &PgPool, sends: &[(Accepted, Claimed)]) -> Vec<String> {
    let mut writers = Vec::new();
    for (accepted, _) in sends {
        let xmin = sqlx::query_scalar!(
            r#"SELECT xmin::text AS "xmin!" FROM payments WHERE payment_id = $1"#,
            accepted.payment_id.as_uuid()
        )
        .fetch_one(pool)
        .await
        .unwrap();
        writers.push(xmin);
    }
    writers
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn settlements_waiting_while_one_is_written_are_written_next_in_one_transaction(pool: PgPool) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let (worker, sends) = charged(&pool, &server, 12).await;

    let recorded = send_and_record_together(&worker, &sends).await;

    assert!(recorded.iter().all(|r| matches!(r, Ok(Recorded::Moved(PaymentStatus::Succeeded)))), "{recorded:?}");
    // The first recording started at once, alone; the other eleven queued behind it.
    let writers = writers(&pool, &sends).await;
    assert_ne!(writers[0], writers[1], "the first was written on its own");
    assert_eq!(writers[1..].iter().collect::<HashSet<_>>().len(), 1, "the rest in one transaction: {writers:?}");
    // And each one completely: audit row, ledger entry with the provider's amount, stored response.
    for (accepted, _) in &sends {
        let payment = support::payment(&pool, *accepted).await;
        let (charge_id, amount, currency) = support::ledger_entry(&pool, *accepted).await.unwrap();
        assert_eq!(
            (Some(charge_id), amount, currency.as_str()),
            (payment.provider_charge_id.clone(), payment.amount.minor_units(), "EUR")
        );
        let (status, body) = support::stored_response(&pool, *accepted).await.unwrap();
        assert_eq!(
            (status, body["status"].as_str(), body["id"].as_str()),
            (200, Some("succeeded"), Some(accepted.payment_id.to_string().as_str()))
        );
        let events = support::events(&pool, *accepted).await;
        assert_eq!(
            events.last().map(|e| (e.0, e.1)),
            Some((Some(PaymentStatus::Processing), PaymentStatus::Succeeded))
        );
        assert!(support::outbox_row(&pool, *accepted).await.is_none());
    }
    assert_eq!(fixtures::count(&pool, "ledger_entries").await, 12);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn in_one_transaction_a_lost_lease_and_a_payment_settled_first_affect_only_themselves(pool: PgPool) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let (worker, sends) = charged(&pool, &server, 4).await;
    let (first, lost, settled_first, ordinary) = (sends[0].0, sends[1].0, sends[2].0, sends[3].0);
    // `lost`: the sweeper takes its lease back (and frees its row for a resend).
    sqlx::query!(
        "UPDATE outbox SET locked_until = now() - interval '1 second' WHERE payment_id = $1",
        lost.payment_id.as_uuid()
    )
    .execute(&pool)
    .await
    .unwrap();
    let window = KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3_600) };
    let swept = leases::sweep(&mut pool.acquire().await.unwrap(), "sweeper", window, 100).await.unwrap();
    assert_eq!(swept.released, 1);
    // `settled_first`: the provider's webhook settles it before the worker records.
    let from_webhook = Settlement::Succeeded {
        charge_id: "ch_from_webhook".into(),
        amount: Amount::new(102).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        charged_at: OffsetDateTime::now_utc(),
    };
    support::settle_by_webhook(&pool, settled_first, &from_webhook).await;

    let recorded = send_and_record_together(&worker, &sends).await;

    let recorded: Vec<Recorded> = recorded.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        recorded,
        [
            Recorded::Moved(PaymentStatus::Succeeded),
            Recorded::LeaseLost,
            Recorded::Superseded(PaymentStatus::Succeeded),
            Recorded::Moved(PaymentStatus::Succeeded),
        ]
    );
    let writers = writers(&pool, &sends).await;
    assert_ne!(writers[0], writers[3], "the first alone, the others together");
    assert_eq!(support::status(&pool, first).await, PaymentStatus::Succeeded);
    assert_eq!(support::status(&pool, lost).await, PaymentStatus::Pending, "nothing recorded for it");
    assert!(support::outbox_row(&pool, lost).await.unwrap().fencing_token.is_none(), "its row waits for a resend");
    assert!(support::ledger_entry(&pool, lost).await.is_none());
    let webhook_payment = support::payment(&pool, settled_first).await;
    assert_eq!(webhook_payment.provider_charge_id.as_deref(), Some("ch_from_webhook"), "the webhook's record stands");
    assert!(support::outbox_row(&pool, settled_first).await.is_none(), "a settled payment keeps no row");
    assert_eq!(support::status(&pool, ordinary).await, PaymentStatus::Succeeded);
    assert_eq!(fixtures::count(&pool, "ledger_entries").await, 3);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_that_cannot_be_recorded_with_others_is_left_out_and_the_others_are_recorded_one_by_one(
    pool: PgPool,
) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let (worker, sends) = charged(&pool, &server, 3).await;
    // A bug elsewhere put `broken` back to `pending` while this worker holds its lease: recording the
    // batch it is in must fail as a whole.
    let broken = sends[1].0;
    sqlx::query!("UPDATE payments SET status = 'pending' WHERE payment_id = $1", broken.payment_id.as_uuid())
        .execute(&pool)
        .await
        .unwrap();

    let recorded = send_and_record_together(&worker, &sends).await;

    assert!(matches!(recorded[0], Ok(Recorded::Moved(PaymentStatus::Succeeded))), "{recorded:?}");
    assert!(matches!(recorded[1], Err(RecordError::Inconsistent(PaymentStatus::Pending))), "{recorded:?}");
    assert!(matches!(recorded[2], Ok(Recorded::Moved(PaymentStatus::Succeeded))), "{recorded:?}");
    assert_eq!(support::status(&pool, broken).await, PaymentStatus::Pending, "nothing written for it");
    assert!(support::outbox_row(&pool, broken).await.is_some(), "its row stays for the sweeper");
    assert_eq!(support::status(&pool, sends[2].0).await, PaymentStatus::Succeeded);
    assert_eq!(fixtures::count(&pool, "ledger_entries").await, 2);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn when_the_database_stays_unreachable_every_waiting_recording_fails_as_transient(pool: PgPool) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let (worker, sends) = charged(&pool, &server, 4).await;
    let verdicts = send_all(&worker, &sends).await;
    // The same worker's sends, recorded by a drainer whose database no longer answers.
    let port = oncepay_devkit::ports::reserve().unwrap();
    let unreachable = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy_with(PgConnectOptions::new().host("127.0.0.1").port(port));
    let cut_off =
        Drainer::new(unreachable, HttpProvider::new(&support::provider_settings(&server.uri())).unwrap(), config("w1"));

    let recorded = record_together(&cut_off, &sends, &verdicts).await;

    assert!(recorded.iter().all(|r| r.as_ref().is_err_and(RecordError::is_transient)), "{recorded:?}");
    assert!(
        recorded[1..].iter().all(|r| matches!(r, Err(RecordError::Together(_)))),
        "the three that waited failed together, not one by one: {recorded:?}"
    );
    for (accepted, _) in &sends {
        assert_eq!(support::status(&pool, *accepted).await, PaymentStatus::Processing, "left to the sweeper");
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn sends_of_several_tenants_are_recorded_in_transactions_that_each_hold_one_tenant(pool: PgPool) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let (first, second) = (tenant(&pool).await, tenant(&pool).await);
    let mut accepted = Vec::new();
    for (i, tenant_id) in [first, second, first, second, second].into_iter().enumerate() {
        accepted.push(accept(&pool, tenant_id, 100 + i as i64).await);
    }
    let worker = drainer(&pool, &server.uri(), config("w1"));
    let mut claimed = worker.claim(5).await.unwrap();
    claimed.sort_by_key(|c| accepted.iter().position(|a| a.payment_id == c.payment_id));
    let sends: Vec<(Accepted, Claimed)> = accepted.into_iter().zip(claimed).collect();

    let recorded = send_and_record_together(&worker, &sends).await;

    assert!(recorded.iter().all(|r| matches!(r, Ok(Recorded::Moved(PaymentStatus::Succeeded)))), "{recorded:?}");
    // Under Citus one tenant's rows live on one node: a transaction of two tenants could span two.
    let writers = writers(&pool, &sends).await;
    let of = |tenant_id| -> HashSet<&String> {
        sends.iter().zip(&writers).filter(|((a, _), _)| a.tenant_id == tenant_id).map(|(_, w)| w).collect()
    };
    assert!(of(first).is_disjoint(&of(second)), "a transaction wrote both tenants: {writers:?}");
    for (accepted, _) in &sends {
        let payment = support::payment(&pool, *accepted).await;
        assert_eq!(payment.tenant_id, accepted.tenant_id);
        let (_, body) = support::stored_response(&pool, *accepted).await.unwrap();
        assert_eq!(body["id"].as_str(), Some(accepted.payment_id.to_string().as_str()), "its own answer");
        assert!(support::ledger_entry(&pool, *accepted).await.is_some());
    }
}
