//! Ledger reconciliation against a seeded ledger in a real PostgreSQL and a wiremock provider whose
//! paginated listing has one planted discrepancy of every charge class: each is found, nothing else
//! is, and one window is reconciled by one run however many reconcilers ask. The refunds' classes are
//! in `recon_refunds.rs`; here the provider lists no refund.

use std::time::Duration;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_ops::operator_error::OperatorError;
use oncepay_ops::recon as commands;
use oncepay_ops::render::Report;
use oncepay_provider::http::HttpProvider;
use oncepay_provider::stripe::{StripeProvider, StripeSettings};
use oncepay_provider::{Charge, ChargeStatus, UnfinishedCharge};
use oncepay_reconciler::recon::runs;
use oncepay_reconciler::recon::unfinished;
use oncepay_reconciler::recon::{ReconConfig, Reconciled, Reconciliation};
use oncepay_store::fixtures::{self, count, tenant};
use oncepay_store::recon_runs::{Claim, Class, RunStatus, Trigger, Window};
use oncepay_store::transitions::{self, Settlement};
use serde_json::json;
use sqlx::PgPool;
use time::OffsetDateTime;
use time::macros::date;
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, accept, change, charge, claim};

const PAGE: usize = 3;

/// How old a running run's heartbeat may get before it is taken over.
const STALE_AFTER: Duration = Duration::from_secs(300);

fn window() -> Window {
    Window::day(date!(2026 - 01 - 10))
}

fn at(offset_secs: i64) -> OffsetDateTime {
    window().start + time::Duration::seconds(offset_secs)
}

fn reconciliation(pool: &PgPool, provider: &MockServer) -> Reconciliation<HttpProvider> {
    let config = ReconConfig {
        schedule: "0 0 2 * * *".into(),
        page_size: PAGE as u32,
        stale_after: STALE_AFTER,
        queue_interval: Duration::from_secs(1),
        catch_up_days: 1,
        connected_accounts: false,
    };
    Reconciliation::new(pool.clone(), fixtures::provider(&provider.uri()), config)
}

/// Reconciliation through a wiremock Stripe in `mode` (`direct` or `connect`), `page_size` intents a
/// page.
fn stripe_reconciliation(
    pool: &PgPool,
    stripe: &MockServer,
    mode: &str,
    page_size: u32,
) -> Reconciliation<StripeProvider> {
    let settings: StripeSettings = serde_json::from_value(json!({
        "mode": mode, "secret_key": "sk_test_oncepay", "base_url": stripe.uri(), "api_version": "2024-06-20",
        "list_page_size": page_size
    }))
    .unwrap();
    let config = ReconConfig {
        schedule: "0 0 2 * * *".into(),
        page_size,
        stale_after: STALE_AFTER,
        queue_interval: Duration::from_secs(1),
        catch_up_days: 1,
        connected_accounts: mode == "connect",
    };
    Reconciliation::new(pool.clone(), StripeProvider::new(&settings).unwrap(), config)
}

/// A payment settled as succeeded with `charge_id` for `amount`, charged at `charged_at`.
async fn booked(
    pool: &PgPool,
    tenant_id: TenantId,
    charge_id: &str,
    amount: i64,
    charged_at: OffsetDateTime,
) -> PaymentId {
    let payment_id = accept(pool, tenant_id, charge_id, amount).await;
    claim(pool, tenant_id, payment_id, 1).await;
    let settlement = Settlement::Succeeded {
        charge_id: charge_id.into(),
        amount: Amount::new(amount).unwrap(),
        currency: Currency::parse("EUR").unwrap(),
        charged_at,
    };
    let mut conn = pool.acquire().await.unwrap();
    transitions::settle(
        &mut conn,
        &change(tenant_id, payment_id, PaymentStatus::Processing, Transition::Charged),
        &settlement,
    )
    .await
    .unwrap();
    payment_id
}

fn listed(
    tenant_id: TenantId,
    payment_id: PaymentId,
    id: &str,
    status: ChargeStatus,
    amount: i64,
    created: OffsetDateTime,
) -> Charge {
    Charge { created: created.unix_timestamp(), ..charge(tenant_id, payment_id, id, status, amount) }
}

/// Serves `charges` (created in the window) as the provider's paginated listing, oldest first.
async fn serve_listing(provider: &MockServer, mut charges: Vec<Charge>) {
    charges.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
    let pages: Vec<&[Charge]> = charges.chunks(PAGE).collect();
    for (i, page) in pages.iter().enumerate() {
        let body = json!({ "data": page, "has_more": i + 1 < pages.len() });
        let mock = Mock::given(method("GET"))
            .and(path("/v1/charges"))
            .and(query_param("created_gte", window().start.unix_timestamp().to_string()))
            .and(query_param("created_lt", window().end.unix_timestamp().to_string()))
            .and(query_param("limit", PAGE.to_string()));
        let mock = match i {
            0 => mock.and(query_param_is_missing("starting_after")),
            _ => mock.and(query_param("starting_after", pages[i - 1].last().unwrap().id.as_str())),
        };
        mock.respond_with(ResponseTemplate::new(200).set_body_json(body)).expect(1).mount(provider).await;
    }
}

/// The provider's listing of the window's refunds: none.
async fn serve_no_refunds(provider: &MockServer) {
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param("created_gte", window().start.unix_timestamp().to_string()))
        .and(query_param("created_lt", window().end.unix_timestamp().to_string()))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [], "has_more": false})))
        .expect(1)
        .mount(provider)
        .await;
}

/// The run's discrepancies as (class, charge id), sorted.
async fn found(pool: &PgPool, run_id: uuid::Uuid) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = sqlx::query!(
        r#"SELECT class, provider_charge_id AS "provider_charge_id!" FROM recon_discrepancies WHERE run_id = $1"#,
        run_id
    )
    .map(|row| (row.class, row.provider_charge_id))
    .fetch_all(pool)
    .await
    .unwrap();
    found.sort();
    found
}

/// The seeded world: one planted discrepancy of each class among charges and entries that agree.
async fn seed(pool: &PgPool, provider: &MockServer) {
    let t = tenant(pool, "acme").await;
    let ok = booked(pool, t, "ch_ok", 100, at(10)).await;
    let money = booked(pool, t, "ch_money", 100, at(20)).await;
    let twice = booked(pool, t, "ch_twice_1", 100, at(30)).await;
    booked(pool, t, "ch_gone", 100, at(40)).await;
    // Booked a few seconds before the window, created by the provider inside it: matched, not reported.
    let edge = booked(pool, t, "ch_edge", 100, at(-5)).await;
    // Booked the day before and rightly absent from this day's listing.
    booked(pool, t, "ch_yesterday", 100, at(-3600)).await;
    let unbooked = support::unknown_payment(pool, t, "unbooked", 100, 60).await;
    let declined = accept(pool, t, "declined", 100).await;

    serve_listing(
        provider,
        vec![
            listed(t, ok, "ch_ok", ChargeStatus::Succeeded, 100, at(10)),
            listed(t, money, "ch_money", ChargeStatus::Succeeded, 90, at(20)),
            listed(t, twice, "ch_twice_1", ChargeStatus::Succeeded, 100, at(30)),
            listed(t, twice, "ch_twice_2", ChargeStatus::Succeeded, 100, at(35)),
            listed(t, unbooked, "ch_unbooked", ChargeStatus::Succeeded, 100, at(50)),
            listed(t, edge, "ch_edge", ChargeStatus::Succeeded, 100, at(5)),
            listed(t, declined, "ch_declined", ChargeStatus::Failed, 100, at(60)),
        ],
    )
    .await;
    serve_no_refunds(provider).await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn every_planted_discrepancy_is_found_once_and_nothing_else(pool: PgPool) {
    let provider = MockServer::start().await;
    seed(&pool, &provider).await;

    let reconciled = reconciliation(&pool, &provider).run_window(window(), Trigger::Operator).await.unwrap();

    let Reconciled::Completed(summary) = reconciled else { panic!("{reconciled:?}") };
    assert_eq!((summary.provider_charges, summary.ledger_entries), (7, 4));
    assert_eq!((summary.provider_refunds, summary.refund_ledger_entries), (0, 0));
    // The simulator's protocol has no unfinished charges: one of every other charge class.
    let one_of =
        [Class::MissingInLedger, Class::MissingAtProvider, Class::AmountOrCurrencyMismatch, Class::DuplicateCharge];
    assert_eq!(summary.by_class, Class::ALL.map(|class| (class, usize::from(one_of.contains(&class)))));
    assert_eq!(
        found(&pool, summary.run_id).await,
        [
            ("amount_or_currency_mismatch".to_owned(), "ch_money".to_owned()),
            ("duplicate_charge".to_owned(), "ch_twice_1".to_owned()),
            ("missing_at_provider".to_owned(), "ch_gone".to_owned()),
            ("missing_in_ledger".to_owned(), "ch_unbooked".to_owned()),
        ]
    );
    let (status, discrepancies): (String, i32) = sqlx::query!(
        r#"SELECT status::text AS "status!", discrepancies AS "discrepancies!" FROM recon_runs WHERE run_id = $1"#,
        summary.run_id
    )
    .map(|row| (row.status, row.discrepancies))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), discrepancies), ("completed", 4));

    // Operators read the same findings, by class.
    let mut conn = pool.acquire().await.unwrap();
    let detail = commands::show(&mut conn, summary.run_id).await.unwrap();
    let mut text = Vec::new();
    detail.human(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    for expected in [
        "missing_in_ledger (1)",
        "missing_at_provider (1)",
        "amount_or_currency_mismatch (1)",
        "duplicate_charge (1)",
        "ch_twice_2",
    ] {
        assert!(text.contains(expected), "{expected} in\n{text}");
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn two_reconcilers_asking_for_one_window_at_once_make_one_run(pool: PgPool) {
    let provider = MockServer::start().await;
    seed(&pool, &provider).await;
    let (a, b) = (reconciliation(&pool, &provider), reconciliation(&pool, &provider));

    let (first, second) =
        tokio::join!(a.run_window(window(), Trigger::Schedule), b.run_window(window(), Trigger::Schedule));

    let results = [first.unwrap(), second.unwrap()];
    let completed: Vec<_> = results.iter().filter(|o| matches!(o, Reconciled::Completed(_))).collect();
    let skipped: Vec<_> = results.iter().filter(|o| matches!(o, Reconciled::AlreadyClaimed { .. })).collect();
    assert_eq!((completed.len(), skipped.len()), (1, 1), "{results:?}");
    assert_eq!(count(&pool, "recon_runs").await, 1);
    assert_eq!(count(&pool, "recon_discrepancies").await, 4);
    // Asking again later finds the completed run.
    let again = a.run_window(window(), Trigger::Operator).await.unwrap();
    assert!(matches!(again, Reconciled::AlreadyClaimed { status: RunStatus::Completed, .. }), "{again:?}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_operators_run_is_queued_and_the_next_reconciler_to_look_runs_it(pool: PgPool) {
    let provider = MockServer::start().await;
    seed(&pool, &provider).await;
    let recon = reconciliation(&pool, &provider);
    let mut conn = pool.acquire().await.unwrap();

    let queued = commands::queue(&mut conn, "2026-01-10", "2026-01-11", STALE_AFTER).await.unwrap();
    let queued_again = commands::queue(&mut conn, "2026-01-10", "2026-01-11", STALE_AFTER).await;
    let nightly = recon.run_window(window(), Trigger::Schedule).await.unwrap();
    let first_look = recon.run_queued().await.unwrap();
    let second_look = recon.run_queued().await.unwrap();

    assert_eq!((queued.status, queued.trigger), (RunStatus::Queued, Trigger::Operator));
    assert_eq!((queued.window_start, queued.window_end), (window().start, window().end));
    assert!(matches!(queued_again, Err(OperatorError::Refused(_))), "{queued_again:?}");
    // The nightly job leaves a window an operator queued to that run.
    assert_eq!(nightly, Reconciled::AlreadyClaimed { run_id: queued.run_id, status: RunStatus::Queued });
    assert!(first_look && !second_look);
    let detail = commands::show(&mut conn, queued.run_id).await.unwrap();
    assert_eq!((detail.run.status, detail.run.discrepancies), (RunStatus::Completed, Some(4)));
    assert_eq!(count(&pool, "recon_runs").await, 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_operator_may_queue_a_window_whose_running_run_stopped_proving_it_is_alive(pool: PgPool) {
    let provider = MockServer::start().await;
    seed(&pool, &provider).await;
    let recon = reconciliation(&pool, &provider);
    let alive = plant_running_run(&pool, 10).await;
    let mut conn = pool.acquire().await.unwrap();

    let while_alive = commands::queue(&mut conn, "2026-01-10", "2026-01-11", STALE_AFTER).await;
    sqlx::query!("UPDATE recon_runs SET heartbeat_at = now() - interval '1 hour' WHERE run_id = $1", alive)
        .execute(&pool)
        .await
        .unwrap();
    let after_it_stopped = commands::queue(&mut conn, "2026-01-10", "2026-01-11", STALE_AFTER).await;
    let ran = recon.run_queued().await.unwrap();

    assert!(matches!(while_alive, Err(OperatorError::Refused(_))), "{while_alive:?}");
    let queued = after_it_stopped.unwrap();
    assert_eq!(queued.status, RunStatus::Queued);
    assert!(ran);
    let abandoned = commands::show(&mut conn, alive).await.unwrap().run;
    assert_eq!(abandoned.status, RunStatus::Failed);
    assert!(abandoned.error.unwrap().contains("abandoned"));
    assert_eq!(commands::show(&mut conn, queued.run_id).await.unwrap().run.status, RunStatus::Completed);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_queued_window_that_is_not_a_window_is_refused_and_queues_nothing(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();

    let backwards = commands::queue(&mut conn, "2026-01-11", "2026-01-10", STALE_AFTER).await;
    let not_a_date = commands::queue(&mut conn, "yesterday", "2026-01-10", STALE_AFTER).await;

    assert!(matches!(backwards, Err(OperatorError::Invalid(_))), "{backwards:?}");
    assert!(matches!(not_a_date, Err(OperatorError::Invalid(_))), "{not_a_date:?}");
    assert_eq!(count(&pool, "recon_runs").await, 0);
}

async fn plant_running_run(pool: &PgPool, heartbeat_secs_ago: i64) -> uuid::Uuid {
    let run_id = uuid::Uuid::now_v7();
    sqlx::query!(
        "INSERT INTO recon_runs (run_id, window_start, window_end, trigger, status, heartbeat_at)
         VALUES ($1, $2, $3, 'schedule', 'running', now() - make_interval(secs => $4))",
        run_id,
        window().start,
        window().end,
        heartbeat_secs_ago as f64
    )
    .execute(pool)
    .await
    .unwrap();
    run_id
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_running_run_is_left_alone_while_alive_and_taken_over_once_its_heartbeat_stops(pool: PgPool) {
    let provider = MockServer::start().await;
    seed(&pool, &provider).await;
    let recon = reconciliation(&pool, &provider);
    let alive = plant_running_run(&pool, 10).await;

    let while_alive = recon.run_window(window(), Trigger::Operator).await.unwrap();
    sqlx::query!("UPDATE recon_runs SET heartbeat_at = now() - interval '1 hour' WHERE run_id = $1", alive)
        .execute(&pool)
        .await
        .unwrap();
    let after_it_stopped = recon.run_window(window(), Trigger::Operator).await.unwrap();

    assert_eq!(while_alive, Reconciled::AlreadyClaimed { run_id: alive, status: RunStatus::Running });
    assert!(matches!(after_it_stopped, Reconciled::Completed(_)), "{after_it_stopped:?}");
    let (status, error): (String, Option<String>) =
        sqlx::query!(r#"SELECT status::text AS "status!", error FROM recon_runs WHERE run_id = $1"#, alive)
            .map(|row| (row.status, row.error))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(status, "failed");
    assert!(error.unwrap().contains("abandoned"));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_run_the_provider_fails_is_marked_failed_and_the_window_can_be_run_again(pool: PgPool) {
    let provider = MockServer::start().await;
    Mock::given(method("GET")).respond_with(ResponseTemplate::new(503)).up_to_n_times(1).mount(&provider).await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [], "has_more": false})))
        .mount(&provider)
        .await;
    let recon = reconciliation(&pool, &provider);

    let failed = recon.run_window(window(), Trigger::Operator).await;
    let retried = recon.run_window(window(), Trigger::Operator).await.unwrap();

    assert!(format!("{:#}", failed.unwrap_err()).contains("503"));
    assert!(matches!(retried, Reconciled::Completed(_)), "{retried:?}");
    let statuses: Vec<String> =
        sqlx::query_scalar!(r#"SELECT status::text AS "status!" FROM recon_runs ORDER BY started_at"#)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(statuses, ["failed", "completed"]);
}

/// Stripe's list of refunds, empty for every window, asked for `times` times.
async fn stripe_lists_no_refunds(stripe: &MockServer, times: u64) {
    let body = json!({"object": "list", "url": "/v1/refunds", "data": [], "has_more": false});
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param_is_missing("payment_intent"))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .expect(times)
        .mount(stripe)
        .await;
}

/// A PaymentIntent as Stripe's list returns it, made for `payment_id`.
fn intent(
    tenant_id: TenantId,
    payment_id: PaymentId,
    id: &str,
    amount: i64,
    created: OffsetDateTime,
) -> serde_json::Value {
    json!({
        "id": id, "object": "payment_intent", "amount": amount, "amount_received": amount,
        "created": created.unix_timestamp(), "currency": "eur", "status": "succeeded",
        "latest_charge": format!("ch_{id}"), "last_payment_error": null, "payment_method": "pm_card_visa",
        "metadata": {"oncepay_payment_id": payment_id.to_string(), "oncepay_tenant_id": tenant_id.to_string()}
    })
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_nightly_run_reads_stripes_list_newest_first_page_by_page(pool: PgPool) {
    let stripe = MockServer::start().await;
    let t = tenant(&pool, "acme").await;
    let ok = booked(&pool, t, "pi_ok", 100, at(10)).await;
    let money = booked(&pool, t, "pi_money", 100, at(20)).await;
    booked(&pool, t, "pi_gone", 100, at(30)).await;
    let unbooked = support::unknown_payment(&pool, t, "unbooked", 100, 60).await;
    // Newest first, as Stripe lists: two pages of two, the second asked for after the first's last.
    let pages = [
        vec![intent(t, unbooked, "pi_unbooked", 100, at(50)), intent(t, money, "pi_money", 90, at(20))],
        vec![intent(t, ok, "pi_ok", 100, at(10))],
    ];
    for (i, page) in pages.iter().enumerate() {
        let mock = Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .and(query_param("created[gte]", window().start.unix_timestamp().to_string()))
            .and(query_param("created[lt]", window().end.unix_timestamp().to_string()));
        let mock = match i {
            0 => mock.and(query_param_is_missing("starting_after")),
            _ => mock.and(query_param("starting_after", "pi_money")),
        };
        let body = json!({"object": "list", "url": "/v1/payment_intents", "data": page, "has_more": i == 0});
        mock.respond_with(ResponseTemplate::new(200).set_body_json(body)).expect(1).mount(&stripe).await;
    }
    stripe_lists_no_refunds(&stripe, 1).await;
    let reconciliation = stripe_reconciliation(&pool, &stripe, "direct", 2);

    let reconciled = reconciliation.run_window(window(), Trigger::Operator).await.unwrap();

    let Reconciled::Completed(summary) = reconciled else { panic!("{reconciled:?}") };
    assert_eq!((summary.provider_charges, summary.ledger_entries), (3, 3));
    assert_eq!(
        found(&pool, summary.run_id).await,
        [
            ("amount_or_currency_mismatch".to_owned(), "pi_money".to_owned()),
            ("missing_at_provider".to_owned(), "pi_gone".to_owned()),
            ("missing_in_ledger".to_owned(), "pi_unbooked".to_owned()),
        ]
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn in_connect_mode_the_nightly_run_reads_every_account_charged_in_the_window(pool: PgPool) {
    let stripe = MockServer::start().await;
    let (acme, globex) = (tenant(&pool, "acme").await, tenant(&pool, "globex").await);
    let in_account = |payment_id: PaymentId, account: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query!(
                "UPDATE payments SET provider_account = $2 WHERE payment_id = $1",
                payment_id.as_uuid(),
                account
            )
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let a = booked(&pool, acme, "pi_a", 100, at(10)).await;
    in_account(a, "acct_A").await;
    let b = booked(&pool, globex, "pi_b", 100, at(20)).await;
    in_account(b, "acct_B").await;
    // Charged in an account globex had before an operator connected it to acct_B.
    let old = booked(&pool, globex, "pi_old", 100, at(30)).await;
    in_account(old, "acct_old").await;
    for (tenant, account) in [(acme, "acct_A"), (globex, "acct_B")] {
        sqlx::query!("UPDATE tenants SET provider_account = $2 WHERE tenant_id = $1", tenant.as_uuid(), account)
            .execute(&pool)
            .await
            .unwrap();
    }
    for (account, listed) in [
        ("acct_A", intent(acme, a, "pi_a", 100, at(10))),
        ("acct_B", intent(globex, b, "pi_b", 100, at(20))),
        ("acct_old", intent(globex, old, "pi_old", 100, at(30))),
    ] {
        let body = json!({"object": "list", "url": "/v1/payment_intents", "data": [listed], "has_more": false});
        Mock::given(method("GET"))
            .and(path("/v1/payment_intents"))
            .and(wiremock::matchers::header("Stripe-Account", account))
            .respond_with(ResponseTemplate::new(200).set_body_json(body))
            .expect(1)
            .mount(&stripe)
            .await;
        let body = json!({"object": "list", "url": "/v1/refunds", "data": [], "has_more": false});
        Mock::given(method("GET"))
            .and(path("/v1/refunds"))
            .and(wiremock::matchers::header("Stripe-Account", account))
            .respond_with(ResponseTemplate::new(200).set_body_json(body))
            .expect(1)
            .mount(&stripe)
            .await;
    }
    let reconciliation = stripe_reconciliation(&pool, &stripe, "connect", 10);

    let reconciled = reconciliation.run_window(window(), Trigger::Operator).await.unwrap();

    let Reconciled::Completed(summary) = reconciled else { panic!("{reconciled:?}") };
    assert_eq!((summary.provider_charges, summary.ledger_entries), (3, 3));
    assert_eq!(found(&pool, summary.run_id).await, [], "each account's charges match its ledger entries");
    let requests = stripe.received_requests().await.unwrap();
    assert_eq!(
        requests.len(),
        6,
        "one list of intents and one of refunds per account, and none of the platform's own account"
    );
}

/// Stripe's list of the intents created on `day`, one page, newest first.
async fn stripe_lists(stripe: &MockServer, day: Window, intents: Vec<serde_json::Value>) {
    let body = json!({"object": "list", "url": "/v1/payment_intents", "data": intents, "has_more": false});
    Mock::given(method("GET"))
        .and(path("/v1/payment_intents"))
        .and(query_param("created[gte]", day.start.unix_timestamp().to_string()))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .expect(1)
        .mount(stripe)
        .await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_intent_unfinished_when_its_day_is_reconciled_is_read_again_until_it_is_final(pool: PgPool) {
    let stripe = MockServer::start().await;
    let t = tenant(&pool, "acme").await;
    let ok = booked(&pool, t, "pi_ok", 100, at(10)).await;
    // Sent, never recorded: the intent finishes after its day was reconciled, and takes the money.
    let late = support::unknown_payment(&pool, t, "late", 100, 60).await;
    let processing = json!({"status": "processing", "amount_received": 0, "latest_charge": null});
    let mut unfinished = intent(t, late, "pi_late", 100, at(20));
    unfinished.as_object_mut().unwrap().extend(processing.as_object().unwrap().clone());
    let (first, second, third) = (window(), Window::day(date!(2026 - 01 - 11)), Window::day(date!(2026 - 01 - 12)));
    stripe_lists(&stripe, first, vec![unfinished, intent(t, ok, "pi_ok", 100, at(10))]).await;
    stripe_lists(&stripe, second, vec![]).await;
    stripe_lists(&stripe, third, vec![]).await;
    stripe_lists_no_refunds(&stripe, 3).await;
    Mock::given(method("GET"))
        .and(path("/v1/payment_intents/pi_late"))
        .respond_with(ResponseTemplate::new(200).set_body_json(intent(t, late, "pi_late", 100, at(20))))
        .expect(1)
        .mount(&stripe)
        .await;
    let reconciliation = stripe_reconciliation(&pool, &stripe, "direct", 10);

    let mut runs = Vec::new();
    for day in [first, second, third] {
        let Reconciled::Completed(summary) = reconciliation.run_window(day, Trigger::Schedule).await.unwrap() else {
            panic!("the window was free");
        };
        runs.push(found(&pool, summary.run_id).await);
    }

    let pair = |class: &str, id: &str| (class.to_owned(), id.to_owned());
    assert_eq!(runs[0], [pair("unfinished", "pi_late")], "reported, not left out");
    assert_eq!(runs[1], [pair("missing_in_ledger", "pi_late")], "read again the next night, now final: money moved");
    assert_eq!(runs[2], [], "settled: never read again");
    let open: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM recon_unfinished_charges WHERE settled_run_id IS NULL"#
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(open, 0);
}

/// A run of the day `day`, started.
async fn started_run(pool: &PgPool, day: time::Date) -> uuid::Uuid {
    let mut conn = pool.acquire().await.unwrap();
    match runs::claim(&mut conn, &Window::day(day), Trigger::Operator, Duration::from_secs(3_600)).await.unwrap() {
        Claim::Won(run_id) => run_id,
        taken => panic!("{taken:?}"),
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_charge_read_final_and_then_seen_unfinished_again_is_read_again(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    let (first, second, third) = (
        started_run(&pool, date!(2026 - 01 - 10)).await,
        started_run(&pool, date!(2026 - 01 - 11)).await,
        started_run(&pool, date!(2026 - 01 - 12)).await,
    );
    let intent = UnfinishedCharge {
        id: "pi_1".into(),
        status: "processing".into(),
        amount: 1999,
        currency: "EUR".into(),
        created: 1_768_000_000,
        metadata: Default::default(),
        account: None,
    };

    unfinished::record(&mut conn, first, std::slice::from_ref(&intent), &[]).await.unwrap();
    unfinished::record(&mut conn, second, &[], &["pi_1".to_owned()]).await.unwrap();
    // Read final, then unfinished again: a failed intent confirmed once more, say.
    unfinished::record(&mut conn, third, std::slice::from_ref(&intent), &[]).await.unwrap();

    let open: Vec<String> = unfinished::open(&mut conn).await.unwrap().into_iter().map(|o| o.last_seen.id).collect();
    assert_eq!(open, ["pi_1"], "read again until it is final once more");
}
