//! A payment's method reaches the provider with every send of it: the first, and a resend after the
//! reconciler queued the payment again. A payment without one is sent exactly as before the field
//! existed. Against the real simulator, a method it declines ends the payment `failed` with the
//! decline code.

use oncepay_domain::status::PaymentStatus;
use oncepay_provider::ChargeStatus;
use oncepay_provider::ProviderSettings;
use oncepay_provider::http::HttpProvider;
use oncepay_simulator::Simulator;
use oncepay_simulator::client::SimulatorClient;
use oncepay_simulator::config::Settings;
use oncepay_worker::{Counts, Drainer};
use secrecy::ExposeSecret;
use serde_json::Value;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, Charges, accept, accept_paying_with, config, drainer, tenant};

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

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_method_the_simulator_declines_ends_the_payment_failed_with_its_decline_code(pool: PgPool) {
    let mut settings = Settings::load(None).unwrap();
    settings.http.port = 0;
    settings.simulator.seed = Some(7);
    let simulator = Simulator::start(settings.clone(), CancellationToken::new()).await.unwrap();
    let provider = HttpProvider::new(&ProviderSettings {
        api_key: settings.simulator.api_key.expose_secret().to_owned().into(),
        ..support::provider_settings(&simulator.base_url())
    })
    .unwrap();
    let tenant_id = tenant(&pool).await;
    let declined = accept_paying_with(&pool, tenant_id, 1999, "pm_card_chargeDeclined").await;
    let no_funds = accept_paying_with(&pool, tenant_id, 1999, "pm_card_chargeDeclinedInsufficientFunds").await;
    let visa = accept_paying_with(&pool, tenant_id, 1999, "pm_card_visa").await;

    let counts = Drainer::new(pool.clone(), provider, config("w1")).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 3, succeeded: 1, failed: 2, ..Counts::default() });
    for (accepted, code) in [(declined, "card_declined"), (no_funds, "insufficient_funds")] {
        let payment = support::payment(&pool, accepted).await;
        assert_eq!(payment.status, PaymentStatus::Failed);
        assert_eq!(payment.failure_code.as_deref(), Some(code));
        assert!(support::ledger_entry(&pool, accepted).await.is_none());
    }
    assert_eq!(support::status(&pool, visa).await, PaymentStatus::Succeeded);
    let truth = SimulatorClient::new(&simulator.base_url()).ground_truth().await.unwrap();
    let mut charged: Vec<_> = truth.charges.iter().map(|c| (c.payment_method.as_deref(), c.status)).collect();
    charged.sort_by_key(|(method, _)| *method);
    assert_eq!(
        charged,
        [
            (Some("pm_card_chargeDeclined"), ChargeStatus::Failed),
            (Some("pm_card_chargeDeclinedInsufficientFunds"), ChargeStatus::Failed),
            (Some("pm_card_visa"), ChargeStatus::Succeeded),
        ]
    );
}
