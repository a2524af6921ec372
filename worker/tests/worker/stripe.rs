//! A worker configured for Stripe (`provider.kind = "stripe"`) charges through Stripe's PaymentIntents
//! API, against a real PostgreSQL and a `wiremock` Stripe.

use std::collections::BTreeMap;

use oncepay_domain::status::PaymentStatus;
use oncepay_provider::{ConfiguredProvider, ProviderSettings};
use oncepay_worker::{Counts, Drainer};
use serde_json::{Value, json};
use sqlx::PgPool;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, Accepted, accept, config, tenant};

/// The `[provider]` section a merchant would write for Stripe, read as the config loader reads it.
fn stripe_settings(base_url: &str) -> ProviderSettings {
    serde_json::from_value(json!({
        "kind": "stripe",
        "base_url": "http://127.0.0.1:1",
        "api_key": "unused",
        "stripe": {
            "mode": "direct",
            "secret_key": "sk_test_oncepay",
            "base_url": base_url,
            "api_version": "2024-06-20",
            "default_payment_method": "pm_card_visa",
            "request_timeout_ms": 1000
        }
    }))
    .unwrap()
}

async fn stripe_responding(status: u16, body: impl Fn(&str) -> Value + Send + Sync + 'static) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/payment_intents"))
        .respond_with(move |request: &wiremock::Request| {
            let form: BTreeMap<String, String> = serde_urlencoded::from_bytes(&request.body).unwrap();
            ResponseTemplate::new(status).set_body_json(body(&form["metadata[oncepay_payment_id]"]))
        })
        .mount(&server)
        .await;
    server
}

fn intent(payment_id: &str, status: &str) -> Value {
    json!({
        "id": "pi_3QwJ", "object": "payment_intent", "amount": 1999,
        "amount_received": if status == "succeeded" { 1999 } else { 0 },
        "created": 1_763_800_000, "currency": "eur", "status": status,
        "latest_charge": if status == "succeeded" { json!("ch_3QwJ") } else { Value::Null },
        "last_payment_error": null, "payment_method": "pm_card_visa",
        "metadata": {"oncepay_payment_id": payment_id}
    })
}

async fn drain_once(pool: &PgPool, server: &MockServer) -> (Accepted, Counts) {
    let accepted = accept(pool, tenant(pool).await, 1999).await;
    let provider = ConfiguredProvider::new(&stripe_settings(&server.uri())).unwrap();
    let counts = Drainer::new(pool.clone(), provider, config("w1")).run_once().await.unwrap();
    (accepted, counts)
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_succeeded_payment_intent_settles_the_payment_with_its_amount_in_the_ledger(pool: PgPool) {
    let server = stripe_responding(200, |payment_id| intent(payment_id, "succeeded")).await;

    let (accepted, counts) = drain_once(&pool, &server).await;

    assert_eq!(counts, Counts { claimed: 1, succeeded: 1, ..Counts::default() });
    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Succeeded);
    assert_eq!(payment.provider_charge_id.as_deref(), Some("pi_3QwJ"));
    assert_eq!(support::ledger_entry(&pool, accepted).await, Some(("pi_3QwJ".to_owned(), 1999, "EUR".to_owned())));
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    let key = accepted.payment_id.downstream_key();
    assert_eq!(sent.headers.get("idempotency-key").unwrap(), key.as_str());
    assert_eq!(sent.headers.get("stripe-version").unwrap(), "2024-06-20");
    assert_eq!(sent.headers.get("authorization").unwrap(), "Bearer sk_test_oncepay");
    let form: BTreeMap<String, String> = serde_urlencoded::from_bytes(&sent.body).unwrap();
    assert_eq!(form["amount"], "1999");
    assert_eq!(form["currency"], "eur");
    assert_eq!(form["confirm"], "true");
    assert_eq!(form["off_session"], "true");
    assert_eq!(form["payment_method"], "pm_card_visa");
    assert_eq!(form["metadata[oncepay_payment_id]"], accepted.payment_id.to_string());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_intent_still_processing_leaves_the_payment_unknown_for_the_reconciler(pool: PgPool) {
    let server = stripe_responding(200, |payment_id| intent(payment_id, "processing")).await;

    let (accepted, counts) = drain_once(&pool, &server).await;

    assert_eq!(counts.claimed, 1);
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Unknown);
    let (reason, _) = support::unknown_entry(&pool, accepted).await.expect("queued for the reconciler");
    assert_eq!(reason, "not_final");
    assert!(support::ledger_entry(&pool, accepted).await.is_none());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_card_declined_by_stripe_fails_the_payment_with_the_decline_code(pool: PgPool) {
    let server = stripe_responding(402, |_| {
        json!({"error": {
            "type": "card_error", "code": "card_declined", "decline_code": "insufficient_funds",
            "message": "Your card has insufficient funds."
        }})
    })
    .await;

    let (accepted, counts) = drain_once(&pool, &server).await;

    assert_eq!(counts, Counts { claimed: 1, failed: 1, ..Counts::default() });
    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Failed);
    assert_eq!(payment.failure_code.as_deref(), Some("insufficient_funds"));
    assert!(support::ledger_entry(&pool, accepted).await.is_none());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_charged_in_a_connected_account_is_sent_there_and_settled_from_there(pool: PgPool) {
    let server = stripe_responding(200, |payment_id| intent(payment_id, "succeeded")).await;
    let accepted = accept(&pool, tenant(&pool).await, 1999).await;
    sqlx::query!(
        "UPDATE payments SET provider_account = 'acct_merchant', payment_method = 'pm_card_visa' WHERE payment_id = $1",
        accepted.payment_id.as_uuid()
    )
    .execute(&pool)
    .await
    .unwrap();
    let provider = ConfiguredProvider::new(&stripe_settings(&server.uri())).unwrap();

    let counts = Drainer::new(pool.clone(), provider, config("w1")).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, succeeded: 1, ..Counts::default() });
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests[0].headers.get("stripe-account").unwrap(), "acct_merchant");
    assert_eq!(support::ledger_entry(&pool, accepted).await, Some(("pi_3QwJ".to_owned(), 1999, "EUR".to_owned())));
}
