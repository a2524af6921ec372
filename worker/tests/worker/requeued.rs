//! A payment sent again after an uncertain send remembers that it may already have been charged:
//! it is never resent past the provider's key window, and never failed as "no charge was made".

use std::time::Duration;

use oncepay_domain::status::PaymentStatus;
use sqlx::PgPool;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, Accepted, accept, config, drainer, tenant};

/// A payment whose first send ended in a 500 (so it may have charged), then re-queued by the
/// reconciler because the provider's lookup found no charge.
async fn requeued_after_an_uncertain_send(pool: &PgPool) -> Accepted {
    let accepted = accept(pool, tenant(pool).await, 1999).await;
    let failing = MockServer::start().await;
    Mock::given(method("POST")).and(path("/v1/charges")).respond_with(ResponseTemplate::new(500)).mount(&failing).await;
    drainer(pool, &failing.uri(), config("w1")).run_once().await.unwrap();
    assert_eq!(support::status(pool, accepted).await, PaymentStatus::Unknown);
    support::requeue_unknown(pool, accepted).await;
    accepted
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_requeued_payment_claimed_past_the_key_window_is_not_sent_again(pool: PgPool) {
    let accepted = requeued_after_an_uncertain_send(&pool).await;
    support::age_first_send(&pool, accepted, Duration::from_secs(23 * 3_600 + 1)).await;
    let provider = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(201))
        .mount(&provider)
        .await;

    drainer(&pool, &provider.uri(), config("w2")).run_once().await.unwrap();

    assert!(provider.received_requests().await.unwrap().is_empty(), "a resend past the key window could charge twice");
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Unknown);
    let (reason, _) = support::unknown_entry(&pool, accepted).await.unwrap();
    assert_eq!(reason, "key_window_passed");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_requeued_payment_that_never_reaches_the_provider_again_is_unknown_not_failed(pool: PgPool) {
    let accepted = requeued_after_an_uncertain_send(&pool).await;
    let refusing = drainer(&pool, &support::refusing_url(), config("w2"));

    for _ in 0..config("w2").max_attempts {
        refusing.run_once().await.unwrap();
    }

    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Unknown, "the first send may have charged: {payment:?}");
    assert!(support::unknown_entry(&pool, accepted).await.is_some());
}
