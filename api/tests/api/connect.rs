//! Stripe Connect at intake: each payment is charged in its tenant's connected account, fixed when
//! it is accepted; a tenant without one is refused; and a stored key replays whatever the provider's
//! rules or the tenant's account say since.

use oncepay_api::Settings;
use oncepay_api::provider_intake::StripeIntakeSettings;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_provider::ProviderKind;
use oncepay_provider::stripe::StripeMode;
use oncepay_store::tenants;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::helpers::{Rows, TestApp, assert_problem, body};

/// Stripe in `mode`, with every API key read from the database on every request, so an operator's
/// change to a tenant shows at once.
fn stripe(mode: StripeMode) -> impl FnOnce(&mut Settings) {
    move |settings| {
        settings.provider.kind = ProviderKind::Stripe;
        settings.provider.stripe = Some(StripeIntakeSettings { mode });
        settings.auth.cache_ttl_secs = 0;
    }
}

fn paid_with_a_card() -> Value {
    json!({"amount": 1999, "currency": "EUR", "customer_id": "cus_42", "payment_method": "pm_card_visa"})
}

async fn connect(db: &PgPool, tenant_id: TenantId, account: Option<&str>) {
    let account = account.map(|a| ProviderAccount::parse(a).unwrap());
    let mut conn = db.acquire().await.unwrap();
    assert!(tenants::set_provider_account(&mut conn, tenant_id, account.as_ref()).await.unwrap());
}

async fn account_of(db: &PgPool, tenant_id: TenantId, payment_id: PaymentId) -> Option<String> {
    sqlx::query_scalar!(
        "SELECT provider_account FROM payments WHERE tenant_id = $1 AND payment_id = $2",
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_one(db)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn in_connect_mode_a_tenant_without_a_connected_account_is_refused_and_nothing_is_written(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn_with(options, stripe(StripeMode::Connect)).await;

    let response = app.post_payment("order-1", &paid_with_a_card()).send().await.unwrap();

    let (_, problem) = assert_problem(response, StatusCode::BAD_REQUEST, "no-provider-account").await;
    assert!(problem["detail"].as_str().unwrap().contains("no Stripe account connected"), "{problem}");
    assert_eq!(app.rows().await, Rows { payments: 0, keys: 0, outbox: 0, events: 0 });
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn in_connect_mode_each_payment_keeps_the_account_its_tenant_had_when_it_was_accepted(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn_with(options, stripe(StripeMode::Connect)).await;
    connect(&app.db, app.tenant.id, Some("acct_first")).await;
    let first = TestApp::payment_id(app.post_payment("order-1", &paid_with_a_card()).send().await.unwrap()).await;

    connect(&app.db, app.tenant.id, Some("acct_second")).await;
    let second = TestApp::payment_id(app.post_payment("order-2", &paid_with_a_card()).send().await.unwrap()).await;

    assert_eq!(account_of(&app.db, app.tenant.id, first).await.as_deref(), Some("acct_first"));
    assert_eq!(account_of(&app.db, app.tenant.id, second).await.as_deref(), Some("acct_second"));
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn in_connect_mode_a_payment_must_name_its_payment_method(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn_with(options, stripe(StripeMode::Connect)).await;
    connect(&app.db, app.tenant.id, Some("acct_first")).await;

    let response = app.post_payment("order-1", &body()).send().await.unwrap();

    let (_, problem) = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
    assert_eq!(problem["errors"][0]["field"], "payment_method", "{problem}");
    assert_eq!(app.rows().await, Rows { payments: 0, keys: 0, outbox: 0, events: 0 });
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn in_direct_mode_every_payment_is_charged_in_oncepays_own_account(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn_with(options, stripe(StripeMode::Direct)).await;
    connect(&app.db, app.tenant.id, Some("acct_unused")).await;

    let response = app.post_payment("order-1", &paid_with_a_card()).send().await.unwrap();

    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let payment = TestApp::payment_id(response).await;
    assert_eq!(account_of(&app.db, app.tenant.id, payment).await, None);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_retry_replays_its_payment_after_the_tenant_lost_its_connected_account(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn_with(options, stripe(StripeMode::Connect)).await;
    connect(&app.db, app.tenant.id, Some("acct_first")).await;
    let accepted = TestApp::payment_id(app.post_payment("order-1", &paid_with_a_card()).send().await.unwrap()).await;
    connect(&app.db, app.tenant.id, None).await;

    let retry = app.post_payment("order-1", &paid_with_a_card()).send().await.unwrap();
    let reused = app.post_payment("order-1", &json!({"amount": 5, "currency": "EUR", "customer_id": "c"})).send().await;
    let new = app.post_payment("order-2", &paid_with_a_card()).send().await.unwrap();

    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(TestApp::payment_id(retry).await, accepted);
    assert_problem(reused.unwrap(), StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    assert_problem(new, StatusCode::BAD_REQUEST, "no-provider-account").await;
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_retry_replays_its_payment_after_the_providers_limits_changed(_: PgPoolOptions, options: PgConnectOptions) {
    let before = TestApp::spawn(options.clone()).await;
    let small = json!({"amount": 10, "currency": "EUR", "customer_id": "cus_42"});
    let accepted = TestApp::payment_id(before.post_payment("order-1", &small).send().await.unwrap()).await;
    // The same database, now with intake checking Stripe's minimum charge in EUR.
    let after = before
        .spawn_beside(options, |settings| {
            stripe(StripeMode::Direct)(settings);
            settings.provider.stripe_settlement_currency = Some("EUR".into());
        })
        .await;

    let retry = after.post_payment("order-1", &small).send().await.unwrap();
    let new = after.post_payment("order-2", &small).send().await.unwrap();

    assert_eq!(retry.status(), StatusCode::ACCEPTED, "a stored key replays, whatever the limits say now");
    assert_eq!(TestApp::payment_id(retry).await, accepted);
    let (_, problem) = assert_problem(new, StatusCode::BAD_REQUEST, "invalid-request").await;
    assert_eq!(problem["errors"][0]["field"], "amount");
    after.stop().await;
    before.stop().await;
}
