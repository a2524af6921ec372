//! Fencing and resends: a worker that lost its lease records nothing, every resend of a payment
//! carries the same downstream key, and a payment that may already have reached the provider is
//! never sent once the provider may have forgotten its key.

use std::time::Duration;

use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::KeyWindow;
use oncepay_store::fixtures;
use oncepay_store::leases;
use oncepay_store::transitions::Settlement;
use oncepay_worker::Counts;
use oncepay_worker::record::Recorded;
use sqlx::PgPool;
use time::OffsetDateTime;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, Charges, accept, config, drainer, tenant};

const KEY_WINDOW: KeyWindow =
    KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3_600) };

async fn sweep(pool: &PgPool) -> leases::SweepCounts {
    let mut conn = pool.acquire().await.unwrap();
    leases::sweep(&mut conn, "sweeper", KEY_WINDOW, 100).await.unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_worker_whose_lease_was_swept_cannot_record_and_the_resend_uses_the_same_key(pool: PgPool) {
    let server = MockServer::start().await;
    let charges = Charges::new();
    charges.mount(&server).await;
    let accepted = accept(&pool, tenant(&pool).await, 500).await;
    let stalled = drainer(&pool, &server.uri(), config("stalled"));
    let claimed = stalled.claim(1).await.unwrap().remove(0);
    // The stalled worker's call reaches the provider and charges; then it stalls past its lease.
    let outcome = stalled.send(&claimed).await;
    support::expire_leases(&pool).await;
    assert_eq!(sweep(&pool).await, leases::SweepCounts { released: 1, ..Default::default() });

    let recorded = stalled.record(&claimed, &stalled.decide(&claimed, &outcome)).await.unwrap();

    assert_eq!(recorded, Recorded::LeaseLost);
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Pending, "nothing was recorded");
    assert!(support::ledger_entry(&pool, accepted).await.is_none());

    // Another worker resends: the provider sees the same key and answers with the first charge.
    let counts = drainer(&pool, &server.uri(), config("other")).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, succeeded: 1, ..Counts::default() });
    let requests = support::requests_for(&server, accepted).await;
    assert_eq!(requests.len(), 2);
    let expected_key = accepted.payment_id.downstream_key();
    for request in &requests {
        assert_eq!(request.headers.get("Idempotency-Key").unwrap().to_str().unwrap(), expected_key.as_str());
    }
    assert_eq!(charges.requests().len(), 1, "one key, so one charge at the provider");
    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Succeeded);
    assert_eq!(payment.send_attempts, 2);
    assert_eq!(fixtures::count(&pool, "ledger_entries").await, 1);
}

/// Tokens come from the payment's own claim count, not from a sequence shared by all payments (which
/// Citus could not draw in a tenant's `UPDATE`). A worker of the version before, still running during
/// an upgrade, holds a token from that sequence: it must never equal a token a claim gives now.
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_token_from_the_old_shared_sequence_never_matches_a_later_claim(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/v1/charges")).respond_with(ResponseTemplate::new(503)).mount(&server).await;
    let accepted = accept(&pool, tenant(&pool).await, 500).await;
    let worker = drainer(&pool, &server.uri(), config("new"));
    // An old worker claimed the payment first, under the sequence's token 2, and stalled.
    let mut old = worker.claim(1).await.unwrap().remove(0);
    old.fencing_token = 2;
    sqlx::query!("UPDATE outbox SET fencing_token = 2").execute(&pool).await.unwrap();
    support::expire_leases(&pool).await;
    sweep(&pool).await;

    // The payment's second claim: a new worker holds it now.
    let current = worker.claim(1).await.unwrap().remove(0);
    let outcome = worker.send(&old).await;
    let recorded = worker.record(&old, &worker.decide(&old, &outcome)).await.unwrap();

    assert_eq!(current.send_attempts, 2);
    assert_ne!(current.fencing_token, old.fencing_token);
    assert!(current.fencing_token > old.fencing_token, "tokens grow with every claim");
    assert_eq!(recorded, Recorded::LeaseLost, "the old worker's token is not the current one");
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Processing);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_worker_whose_token_was_replaced_cannot_record_even_an_uncertain_outcome(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/v1/charges")).respond_with(ResponseTemplate::new(503)).mount(&server).await;
    let accepted = accept(&pool, tenant(&pool).await, 500).await;
    let worker = drainer(&pool, &server.uri(), config("w1"));
    let claimed = worker.claim(1).await.unwrap().remove(0);
    let outcome = worker.send(&claimed).await;
    // Someone else holds the row now, under a newer token.
    sqlx::query!("UPDATE outbox SET fencing_token = nextval('outbox_fencing_token_seq')").execute(&pool).await.unwrap();

    let recorded = worker.record(&claimed, &worker.decide(&claimed, &outcome)).await.unwrap();

    assert_eq!(recorded, Recorded::LeaseLost);
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Processing);
    assert!(support::unknown_entry(&pool, accepted).await.is_none());
    assert!(support::outbox_row(&pool, accepted).await.is_some(), "the row stays with its new holder");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn every_resend_after_a_not_sent_failure_carries_the_key_derived_from_the_payment_id(pool: PgPool) {
    let server = MockServer::start().await;
    // Rate-limited twice (provably not sent), then charged.
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(429))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&server)
        .await;
    Charges::new().mount(&server).await;
    let accepted = accept(&pool, tenant(&pool).await, 500).await;
    let drainer = drainer(&pool, &server.uri(), config("w1"));

    let mut rounds = Vec::new();
    for _ in 0..3 {
        rounds.push(drainer.run_once().await.unwrap());
    }

    let retried = Counts { claimed: 1, retried: 1, ..Counts::default() };
    assert_eq!(rounds, [retried, retried, Counts { claimed: 1, succeeded: 1, ..Counts::default() }]);
    let keys: Vec<String> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.headers.get("Idempotency-Key").unwrap().to_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, vec![format!("oncepay-{}", accepted.payment_id); 3]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_settled_by_a_webhook_while_leased_keeps_its_state_and_loses_its_row(pool: PgPool) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let accepted = accept(&pool, tenant(&pool).await, 500).await;
    let worker = drainer(&pool, &server.uri(), config("w1"));
    let claimed = worker.claim(1).await.unwrap().remove(0);
    let outcome = worker.send(&claimed).await;
    // The provider's webhook beats the worker to it.
    support::settle_by_webhook(
        &pool,
        accepted,
        &Settlement::Succeeded {
            charge_id: "ch_from_webhook".into(),
            amount: Amount::new(500).unwrap(),
            currency: Currency::parse("EUR").unwrap(),
            charged_at: OffsetDateTime::now_utc(),
        },
    )
    .await;

    let recorded = worker.record(&claimed, &worker.decide(&claimed, &outcome)).await.unwrap();

    assert_eq!(recorded, Recorded::Superseded(PaymentStatus::Succeeded));
    assert!(support::outbox_row(&pool, accepted).await.is_none());
    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.provider_charge_id.as_deref(), Some("ch_from_webhook"));
    assert_eq!(fixtures::count(&pool, "ledger_entries").await, 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_that_may_have_reached_the_provider_is_not_resent_past_the_key_window(pool: PgPool) {
    let server = MockServer::start().await;
    let charges = Charges::new();
    charges.mount(&server).await;
    let accepted = accept(&pool, tenant(&pool).await, 500).await;
    // A worker claimed it and vanished; the sweeper released it inside the window ...
    drainer(&pool, &server.uri(), config("gone")).claim(1).await.unwrap();
    support::expire_leases(&pool).await;
    assert_eq!(sweep(&pool).await.released, 1);
    // ... but no worker claimed it again before the provider's key window had run out.
    support::age_first_send(&pool, accepted, Duration::from_secs(86_400 - 60)).await;

    let counts = drainer(&pool, &server.uri(), config("w1")).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, unknown: 1, ..Counts::default() });
    assert!(charges.requests().is_empty(), "a resend could have charged twice");
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Unknown);
    assert_eq!(support::unknown_entry(&pool, accepted).await.unwrap().0, "key_window_passed");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn running_out_of_attempts_after_a_lost_lease_is_unknown_not_failed(pool: PgPool) {
    let accepted = accept(&pool, tenant(&pool).await, 500).await;
    // A worker claimed it and vanished, maybe after reaching the provider.
    drainer(&pool, &support::refusing_url(), config("gone")).claim(1).await.unwrap();
    support::expire_leases(&pool).await;
    assert_eq!(sweep(&pool).await.released, 1);
    let mut config = config("w1");
    config.max_attempts = 2;

    // The provider is unreachable from now on: this second attempt is the last.
    let counts = drainer(&pool, &support::refusing_url(), config).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, unknown: 1, ..Counts::default() });
    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Unknown);
    assert_eq!(payment.failure_code, None);
    assert_eq!(support::unknown_entry(&pool, accepted).await.unwrap().0, "not_sent_but_may_be_charged");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_resend_after_a_lost_lease_that_the_provider_refuses_is_unknown_not_failed(pool: PgPool) {
    let server = MockServer::start().await;
    // Refused as a detached payment method would be: nothing about what the first send did.
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(400).set_body_json(serde_json::json!({
            "error": {"code": "resource_missing", "message": "No such payment method."}
        })))
        .mount(&server)
        .await;
    let accepted = accept(&pool, tenant(&pool).await, 500).await;
    // A worker claimed it and vanished, maybe after the provider charged it.
    drainer(&pool, &server.uri(), config("gone")).claim(1).await.unwrap();
    support::expire_leases(&pool).await;
    assert_eq!(sweep(&pool).await.released, 1);

    let counts = drainer(&pool, &server.uri(), config("w1")).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, unknown: 1, ..Counts::default() });
    let payment = support::payment(&pool, accepted).await;
    assert_eq!((payment.status, payment.failure_code), (PaymentStatus::Unknown, None));
    assert_eq!(support::unknown_entry(&pool, accepted).await.unwrap().0, "refused_after_possible_charge");
    let refusal = sqlx::query!(
        "SELECT refused_code, refused_message FROM unknown_payments WHERE tenant_id = $1 AND payment_id = $2",
        accepted.tenant_id.as_uuid(),
        accepted.payment_id.as_uuid(),
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        refusal.refused_code.as_deref(),
        Some("provider_rejected"),
        "kept to fail it with once a lookup finds nothing"
    );
    assert!(refusal.refused_message.is_some());
}
