//! A payment's method reaches the provider with every send of it: the first, and a resend after the
//! reconciler queued the payment again. A payment without one is sent exactly as before the field
//! existed.

// Helpers outside `#[test]` functions unwrap too: a failure there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use oncepay_domain::status::PaymentStatus;
use serde_json::Value;
use sqlx::PgPool;
use support::{Charges, accept, accept_paying_with, config, drainer, tenant};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_provider_is_asked_to_charge_the_payments_method_and_nothing_when_it_names_none(pool: PgPool) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let tenant_id = tenant(&pool).await;
    let with_method = accept_paying_with(&pool, tenant_id, 1999, "pm_card_visa").await;
    let without = accept(&pool, tenant_id, 1999).await;

    drainer(&pool, &server.uri(), config("w1")).run_once().await.unwrap();

    let sent: Value = support::requests_for(&server, with_method).await[0].body_json().unwrap();
    assert_eq!(sent["payment_method"], "pm_card_visa");
    let sent: Value = support::requests_for(&server, without).await[0].body_json().unwrap();
    assert_eq!(sent.get("payment_method"), None, "{sent}");
    for accepted in [with_method, without] {
        assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Succeeded);
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_resend_after_the_payment_was_queued_again_carries_its_method(pool: PgPool) {
    let accepted = accept_paying_with(&pool, tenant(&pool).await, 1999, "pm_card_mastercard").await;
    let failing = MockServer::start().await;
    Mock::given(method("POST")).and(path("/v1/charges")).respond_with(ResponseTemplate::new(500)).mount(&failing).await;
    drainer(&pool, &failing.uri(), config("w1")).run_once().await.unwrap();
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Unknown);
    // As the poller does; an operator's retry queues the payment into the same outbox, read by the same claim.
    support::requeue_unknown(&pool, accepted).await;
    let provider = MockServer::start().await;
    Charges::new().mount(&provider).await;

    drainer(&pool, &provider.uri(), config("w2")).run_once().await.unwrap();

    let first: Value = failing.received_requests().await.unwrap()[0].body_json().unwrap();
    let resent: Value = support::requests_for(&provider, accepted).await[0].body_json().unwrap();
    assert_eq!(first["payment_method"], "pm_card_mastercard");
    assert_eq!(resent, first, "a resend asks for exactly what the first send asked for");
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Succeeded);
}
