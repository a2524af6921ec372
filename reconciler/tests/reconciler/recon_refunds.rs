//! The nightly reconciliation of refunds, against refunds accepted and settled as oncepay does in a
//! real PostgreSQL: a paginated listing of the simulator's protocol with one planted discrepancy of
//! every refund class, each found once and nothing else; a Stripe refund still pending when its day
//! is reconciled, read again until it is final; Stripe's refunds listed in every connected account;
//! and the simulator itself, whose refunds are listed as oncepay's client reads them.

use std::collections::BTreeMap;
use std::time::Duration;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_ops::recon as commands;
use oncepay_ops::render::Report;
use oncepay_provider::http::HttpProvider;
use oncepay_provider::stripe::{StripeProvider, StripeSettings};
use oncepay_provider::{
    ChargeRequest, PaymentProvider, ProviderSettings, Refund, RefundOutcome, RefundRequest, RefundState, SendOutcome,
    metadata_keys,
};
use oncepay_reconciler::recon::{ReconConfig, Reconciled, Reconciliation, Summary};
use oncepay_store::fixtures::{self, tenant};
use oncepay_store::recon_runs::{Class, Trigger, Window};
use oncepay_store::transitions::{self, Recorded, Settlement};
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;
use time::macros::date;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, accept, change, claim, settle_succeeded, succeeded_payment, unknown_refund};

const PAGE: usize = 3;

fn window() -> Window {
    Window::day(date!(2026 - 01 - 10))
}

fn at(offset_secs: i64) -> OffsetDateTime {
    window().start + time::Duration::seconds(offset_secs)
}

fn config(page_size: u32, connected_accounts: bool) -> ReconConfig {
    ReconConfig {
        schedule: "0 0 2 * * *".into(),
        page_size,
        stale_after: Duration::from_secs(300),
        queue_interval: Duration::from_secs(1),
        catch_up_days: 1,
        connected_accounts,
    }
}

/// Reconciliation through a wiremock Stripe in `mode` (`direct` or `connect`).
fn stripe_reconciliation(pool: &PgPool, stripe: &MockServer, mode: &str) -> Reconciliation<StripeProvider> {
    let settings: StripeSettings = serde_json::from_value(json!({
        "mode": mode, "secret_key": "sk_test_oncepay", "base_url": stripe.uri(), "api_version": "2024-06-20",
        "list_page_size": 10
    }))
    .unwrap();
    Reconciliation::new(pool.clone(), StripeProvider::new(&settings).unwrap(), config(10, mode == "connect"))
}

/// A refund of `amount` of a fresh succeeded payment of `tenant_id`, made at the provider as
/// `provider_refund_id` at `refunded_at` and booked in the refund ledger. Returns the payment, whose
/// charge is `ch_<key>`, and the refund.
async fn booked_refund(
    pool: &PgPool,
    tenant_id: TenantId,
    key: &str,
    amount: i64,
    provider_refund_id: &str,
    refunded_at: OffsetDateTime,
) -> (PaymentId, RefundId) {
    let (payment_id, refund_id) = unbooked_refund(pool, tenant_id, key, amount).await;
    settle_succeeded(pool, tenant_id, refund_id, provider_refund_id, refunded_at).await;
    (payment_id, refund_id)
}

/// A refund of `amount` of a fresh succeeded payment of `tenant_id` whose send ended uncertain:
/// `unknown`, nothing booked.
async fn unbooked_refund(pool: &PgPool, tenant_id: TenantId, key: &str, amount: i64) -> (PaymentId, RefundId) {
    let payment_id = succeeded_payment(pool, tenant_id, key, 1_000).await;
    let refund_id = unknown_refund(pool, tenant_id, payment_id, key, amount, 1).await;
    (payment_id, refund_id)
}

/// A refund as the simulator's protocol reports it: of `ch_<key>`, made at `created` for oncepay's
/// refund `ours` (with oncepay's metadata and key), or for nobody at oncepay.
fn listed(
    ours: Option<(TenantId, PaymentId, RefundId)>,
    key: &str,
    id: &str,
    status: RefundState,
    amount: i64,
    created: OffsetDateTime,
) -> Refund {
    let charge = format!("ch_{key}");
    let refund = match ours {
        Some((tenant_id, payment_id, refund_id)) => {
            let mut metadata = oncepay_provider::fixtures::metadata(tenant_id, payment_id);
            metadata.insert(metadata_keys::REFUND_ID.to_owned(), refund_id.to_string());
            Refund { metadata, ..oncepay_provider::fixtures::refund(refund_id, id, &charge, status, amount) }
        }
        None => Refund {
            idempotency_key: Some(format!("dashboard-{id}")),
            ..oncepay_provider::fixtures::refund(RefundId::generate(), id, &charge, status, amount)
        },
    };
    Refund { created: created.unix_timestamp(), ..refund }
}

/// Serves the window's charges (none) and `refunds` as the simulator's paginated listings, oldest
/// first.
async fn serve_listings(provider: &MockServer, mut refunds: Vec<Refund>) {
    let window_of = |mock: wiremock::MockBuilder| {
        mock.and(query_param("created_gte", window().start.unix_timestamp().to_string()))
            .and(query_param("created_lt", window().end.unix_timestamp().to_string()))
            .and(query_param("limit", PAGE.to_string()))
    };
    window_of(Mock::given(method("GET")).and(path("/v1/charges")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [], "has_more": false})))
        .expect(1)
        .mount(provider)
        .await;
    refunds.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
    let pages: Vec<&[Refund]> = refunds.chunks(PAGE).collect();
    for (i, page) in pages.iter().enumerate() {
        let body = json!({ "data": page, "has_more": i + 1 < pages.len() });
        let mock = window_of(Mock::given(method("GET")).and(path("/v1/refunds")));
        let mock = match i {
            0 => mock.and(query_param_is_missing("starting_after")),
            _ => mock.and(query_param("starting_after", pages[i - 1].last().unwrap().id.as_str())),
        };
        mock.respond_with(ResponseTemplate::new(200).set_body_json(body)).expect(1).mount(provider).await;
    }
}

/// The run's discrepancies as (class, provider refund id), sorted.
async fn found(pool: &PgPool, run_id: uuid::Uuid) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = sqlx::query!(
        r#"SELECT class, provider_refund_id AS "provider_refund_id!" FROM recon_discrepancies WHERE run_id = $1"#,
        run_id
    )
    .map(|row| (row.class, row.provider_refund_id))
    .fetch_all(pool)
    .await
    .unwrap();
    found.sort();
    found
}

fn pair(class: &str, id: &str) -> (String, String) {
    (class.to_owned(), id.to_owned())
}

fn completed(reconciled: Reconciled) -> Summary {
    match reconciled {
        Reconciled::Completed(summary) => summary,
        other => panic!("the window was free: {other:?}"),
    }
}

/// The provider refunds still open in `recon_unfinished_refunds`.
async fn open_refunds(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar!(
        "SELECT provider_refund_id FROM recon_unfinished_refunds WHERE settled_run_id IS NULL ORDER BY 1"
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn every_planted_refund_discrepancy_is_found_once_and_nothing_else(pool: PgPool) {
    let provider = MockServer::start().await;
    let t = tenant(&pool, "acme").await;
    let (ok_p, ok) = booked_refund(&pool, t, "ok", 100, "re_ok", at(10)).await;
    let (money_p, money) = booked_refund(&pool, t, "money", 100, "re_money", at(20)).await;
    let (twice_p, twice) = booked_refund(&pool, t, "twice", 100, "re_twice_1", at(30)).await;
    booked_refund(&pool, t, "gone", 100, "re_gone", at(40)).await;
    // Booked a few seconds before the window, made by the provider inside it: matched, not reported.
    let (edge_p, edge) = booked_refund(&pool, t, "edge", 100, "re_edge", at(-5)).await;
    // Booked the day before, and rightly absent from this day's listing.
    booked_refund(&pool, t, "yesterday", 100, "re_yesterday", at(-3_600)).await;
    let (unbooked_p, unbooked) = unbooked_refund(&pool, t, "unbooked", 100).await;
    let (pending_p, pending) = unbooked_refund(&pool, t, "pending", 100).await;
    let (declined_p, declined) = unbooked_refund(&pool, t, "declined", 100).await;
    let (keyed_p, keyed) = unbooked_refund(&pool, t, "keyed", 100).await;
    // A provider that dropped the metadata: only the refund's key names it.
    let keyed_only = Refund {
        metadata: BTreeMap::new(),
        ..listed(Some((t, keyed_p, keyed)), "keyed", "re_keyed", RefundState::Succeeded, 100, at(65))
    };
    serve_listings(
        &provider,
        vec![
            listed(Some((t, ok_p, ok)), "ok", "re_ok", RefundState::Succeeded, 100, at(10)),
            listed(Some((t, money_p, money)), "money", "re_money", RefundState::Succeeded, 90, at(20)),
            listed(Some((t, twice_p, twice)), "twice", "re_twice_1", RefundState::Succeeded, 100, at(30)),
            listed(Some((t, twice_p, twice)), "twice", "re_twice_2", RefundState::Succeeded, 100, at(35)),
            listed(Some((t, edge_p, edge)), "edge", "re_edge", RefundState::Succeeded, 100, at(5)),
            listed(Some((t, unbooked_p, unbooked)), "unbooked", "re_unbooked", RefundState::Succeeded, 100, at(50)),
            listed(Some((t, pending_p, pending)), "pending", "re_pending", RefundState::Pending, 100, at(55)),
            listed(Some((t, declined_p, declined)), "declined", "re_declined", RefundState::Failed, 100, at(60)),
            listed(None, "ok", "re_dashboard", RefundState::Succeeded, 7, at(70)),
            keyed_only,
        ],
    )
    .await;
    let reconciliation =
        Reconciliation::new(pool.clone(), fixtures::provider(&provider.uri()), config(PAGE as u32, false));

    let summary = completed(reconciliation.run_window(window(), Trigger::Operator).await.unwrap());

    assert_eq!((summary.provider_charges, summary.ledger_entries), (0, 0));
    assert_eq!((summary.provider_refunds, summary.refund_ledger_entries), (9, 4), "the pending refund is not final");
    let found_of = |class: Class| match class {
        Class::RefundMissingInLedger => 2,
        Class::RefundMissingAtProvider
        | Class::RefundAmountOrCurrencyMismatch
        | Class::DuplicateRefund
        | Class::UnrequestedRefund
        | Class::RefundUnfinished => 1,
        _ => 0,
    };
    assert_eq!(summary.by_class, Class::ALL.map(|class| (class, found_of(class))));
    assert_eq!(
        found(&pool, summary.run_id).await,
        [
            pair("duplicate_refund", "re_twice_1"),
            pair("refund_amount_or_currency_mismatch", "re_money"),
            pair("refund_missing_at_provider", "re_gone"),
            pair("refund_missing_in_ledger", "re_keyed"),
            pair("refund_missing_in_ledger", "re_unbooked"),
            pair("refund_unfinished", "re_pending"),
            pair("unrequested_refund", "re_dashboard"),
        ]
    );
    assert_eq!(open_refunds(&pool).await, ["re_pending"], "kept, to be read again");

    // Operators read the same findings, by class, naming the refunds.
    let mut conn = pool.acquire().await.unwrap();
    let detail = commands::show(&mut conn, summary.run_id).await.unwrap();
    let unbooked_found =
        detail.discrepancies.iter().find(|d| d.provider_refund_id.as_deref() == Some("re_unbooked")).unwrap();
    assert_eq!(
        (unbooked_found.tenant_id, unbooked_found.payment_id, unbooked_found.refund_id),
        (Some(t), Some(unbooked_p), Some(unbooked))
    );
    assert_eq!(unbooked_found.provider_charge_id.as_deref(), Some("ch_unbooked"));
    let mut text = Vec::new();
    detail.human(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    for expected in [
        "9 provider refunds, 4 refund ledger entries",
        "refund_missing_in_ledger (2)",
        "refund_missing_at_provider (1)",
        "refund_amount_or_currency_mismatch (1)",
        "duplicate_refund (1)",
        "unrequested_refund (1)",
        "refund_unfinished (1)",
        "re_twice_2",
        &unbooked.to_string(),
    ] {
        assert!(text.contains(expected), "{expected} in\n{text}");
    }
}

/// A Stripe Refund as the list returns it, of `payment_intent`, for oncepay's refund `ours`.
fn stripe_refund(
    ours: (TenantId, PaymentId, RefundId),
    id: &str,
    status: &str,
    payment_intent: &str,
    amount: i64,
    created: OffsetDateTime,
) -> Value {
    let (tenant_id, payment_id, refund_id) = ours;
    json!({
        "id": id, "object": "refund", "amount": amount, "charge": "ch_3Mt", "created": created.unix_timestamp(),
        "currency": "eur", "payment_intent": payment_intent, "status": status, "reason": null,
        "metadata": {
            "oncepay_tenant_id": tenant_id.to_string(), "oncepay_payment_id": payment_id.to_string(),
            "oncepay_refund_id": refund_id.to_string()
        }
    })
}

/// Stripe's list of `what` (`payment_intents` or `refunds`) created on `day` (in `account`, if
/// given): one page, asked for once.
async fn stripe_lists(stripe: &MockServer, what: &str, day: Window, account: Option<&str>, data: Vec<Value>) {
    let body = json!({"object": "list", "url": format!("/v1/{what}"), "data": data, "has_more": false});
    let mock = Mock::given(method("GET"))
        .and(path(format!("/v1/{what}")))
        .and(query_param("created[gte]", day.start.unix_timestamp().to_string()))
        .and(query_param("created[lt]", day.end.unix_timestamp().to_string()));
    let mock = match account {
        Some(account) => mock.and(header("Stripe-Account", account)),
        None => mock,
    };
    mock.respond_with(ResponseTemplate::new(200).set_body_json(body)).expect(1).mount(stripe).await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_pending_when_its_day_is_reconciled_is_read_again_until_it_is_final(pool: PgPool) {
    let stripe = MockServer::start().await;
    let t = tenant(&pool, "acme").await;
    // Sent, never recorded: the refund finishes after its day was reconciled, and gives the money back.
    let (payment, late) = unbooked_refund(&pool, t, "late", 100).await;
    let (first, second, third) = (window(), Window::day(date!(2026 - 01 - 11)), Window::day(date!(2026 - 01 - 12)));
    let ours = (t, payment, late);
    for day in [first, second, third] {
        stripe_lists(&stripe, "payment_intents", day, None, vec![]).await;
    }
    stripe_lists(&stripe, "refunds", first, None, vec![stripe_refund(ours, "re_late", "pending", "pi_1", 100, at(20))])
        .await;
    stripe_lists(&stripe, "refunds", second, None, vec![]).await;
    stripe_lists(&stripe, "refunds", third, None, vec![]).await;
    Mock::given(method("GET"))
        .and(path("/v1/refunds/re_late"))
        .respond_with(ResponseTemplate::new(200).set_body_json(stripe_refund(
            ours,
            "re_late",
            "succeeded",
            "pi_1",
            100,
            at(20),
        )))
        .expect(1)
        .mount(&stripe)
        .await;
    let reconciliation = stripe_reconciliation(&pool, &stripe, "direct");

    let mut runs = Vec::new();
    let mut open = Vec::new();
    for day in [first, second, third] {
        let summary = completed(reconciliation.run_window(day, Trigger::Schedule).await.unwrap());
        runs.push(found(&pool, summary.run_id).await);
        open.push(open_refunds(&pool).await);
    }

    assert_eq!(runs[0], [pair("refund_unfinished", "re_late")], "reported, not left out");
    assert_eq!(open[0], ["re_late"]);
    assert_eq!(runs[1], [pair("refund_missing_in_ledger", "re_late")], "read again the next night, now final");
    assert_eq!(runs[2], [], "settled: never read again");
    assert_eq!((open[1].len(), open[2].len()), (0, 0));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn in_connect_mode_refunds_are_listed_in_every_account_refunded_in_the_window(pool: PgPool) {
    let stripe = MockServer::start().await;
    let (acme, globex) = (tenant(&pool, "acme").await, tenant(&pool, "globex").await);
    for (tenant, account) in [(acme, "acct_A"), (globex, "acct_B")] {
        sqlx::query!("UPDATE tenants SET provider_account = $2 WHERE tenant_id = $1", tenant.as_uuid(), account)
            .execute(&pool)
            .await
            .unwrap();
    }
    let (a_payment, a_refund) = booked_refund(&pool, acme, "a", 100, "re_a", at(10)).await;
    // Charged, and refunded, in an account globex had before an operator connected it to acct_B.
    let (old_payment, old_refund) = booked_refund(&pool, globex, "old", 100, "re_old", at(20)).await;
    for (payment, account) in [(a_payment, "acct_A"), (old_payment, "acct_old")] {
        sqlx::query!("UPDATE payments SET provider_account = $2 WHERE payment_id = $1", payment.as_uuid(), account)
            .execute(&pool)
            .await
            .unwrap();
    }
    let mut dashboard =
        stripe_refund((globex, old_payment, old_refund), "re_dashboard", "succeeded", "pi_b", 7, at(30));
    dashboard["metadata"] = json!({});
    for (account, refunds) in [
        ("acct_A", vec![stripe_refund((acme, a_payment, a_refund), "re_a", "succeeded", "pi_a", 100, at(10))]),
        // A refund made on globex's dashboard: no metadata of oncepay's.
        ("acct_B", vec![dashboard]),
        (
            "acct_old",
            vec![stripe_refund((globex, old_payment, old_refund), "re_old", "succeeded", "pi_o", 100, at(20))],
        ),
    ] {
        stripe_lists(&stripe, "payment_intents", window(), Some(account), vec![]).await;
        stripe_lists(&stripe, "refunds", window(), Some(account), refunds).await;
    }
    let reconciliation = stripe_reconciliation(&pool, &stripe, "connect");

    let summary = completed(reconciliation.run_window(window(), Trigger::Operator).await.unwrap());

    assert_eq!((summary.provider_refunds, summary.refund_ledger_entries), (3, 2));
    assert_eq!(found(&pool, summary.run_id).await, [pair("unrequested_refund", "re_dashboard")]);
    let theirs: Value =
        sqlx::query_scalar!(r#"SELECT theirs AS "theirs!" FROM recon_discrepancies WHERE run_id = $1"#, summary.run_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((theirs["account"].as_str(), theirs["amount"].as_i64()), (Some("acct_B"), Some(7)));
    let requests = stripe.received_requests().await.unwrap();
    assert_eq!(requests.len(), 6, "one list of intents and one of refunds per account, none of the platform's");
}

/// The simulator in this process, on a free port, with no faults and no webhooks.
async fn simulator() -> (oncepay_simulator::Simulator, HttpProvider, ProviderSettings) {
    let mut settings = oncepay_simulator::config::Settings::load(None).unwrap();
    settings.http.port = 0;
    settings.simulator.seed = Some(7);
    let simulator = oncepay_simulator::Simulator::start(settings, CancellationToken::new()).await.unwrap();
    let provider_settings = ProviderSettings {
        api_key: "sk_test_oncepay_simulator".to_owned().into(),
        ..fixtures::provider_settings(&simulator.base_url())
    };
    (simulator, HttpProvider::new(&provider_settings).unwrap(), provider_settings)
}

/// Charges a fresh payment of `amount` at the simulator and books it as the worker would. Returns the
/// payment and its charge.
async fn charged(pool: &PgPool, provider: &HttpProvider, tenant_id: TenantId, amount: i64) -> (PaymentId, String) {
    let payment_id = accept(pool, tenant_id, "charged", amount).await;
    claim(pool, tenant_id, payment_id, 1).await;
    let eur = Currency::parse("EUR").unwrap();
    let request = ChargeRequest::for_payment(
        tenant_id,
        payment_id,
        Amount::new(amount).unwrap(),
        eur,
        "cus_1".into(),
        &BTreeMap::new(),
    );
    let SendOutcome::Charged(charge) = provider.create_charge(&request).await else { panic!("not charged") };
    let settlement = Settlement::Succeeded {
        charge_id: charge.id.clone(),
        amount: Amount::new(charge.amount).unwrap(),
        currency: eur,
        charged_at: OffsetDateTime::from_unix_timestamp(charge.created).unwrap(),
    };
    let change = change(tenant_id, payment_id, PaymentStatus::Processing, Transition::Charged);
    let settled = transitions::settle(&mut pool.acquire().await.unwrap(), &change, &settlement).await;
    assert!(matches!(settled, Ok(Recorded::Moved(_))), "{settled:?}");
    (payment_id, charge.id)
}

/// Refunds `amount` of `charge_id` at the simulator for oncepay's refund `refund_id`.
async fn refunded_at_the_provider(
    provider: &HttpProvider,
    tenant_id: TenantId,
    payment_id: PaymentId,
    refund_id: RefundId,
    charge_id: &str,
    amount: i64,
) -> Refund {
    let request = RefundRequest::for_refund(
        tenant_id,
        payment_id,
        refund_id,
        charge_id.to_owned(),
        Amount::new(amount).unwrap(),
        Currency::parse("EUR").unwrap(),
        None,
        &BTreeMap::new(),
    );
    match provider.create_refund(&request).await {
        RefundOutcome::Refunded(refund) => refund,
        other => panic!("not refunded: {other:?}"),
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn against_the_simulator_an_unbooked_refund_and_one_nobody_asked_for_are_found(pool: PgPool) {
    let (simulator, provider, settings) = simulator().await;
    let t = tenant(&pool, "acme").await;
    let (payment, charge) = charged(&pool, &provider, t, 1_000).await;
    let booked = support::unknown_refund(&pool, t, payment, "booked", 100, 1).await;
    let made = refunded_at_the_provider(&provider, t, payment, booked, &charge, 100).await;
    settle_succeeded(&pool, t, booked, &made.id, OffsetDateTime::from_unix_timestamp(made.created).unwrap()).await;
    let unbooked = support::unknown_refund(&pool, t, payment, "unbooked", 200, 1).await;
    let unbooked_made = refunded_at_the_provider(&provider, t, payment, unbooked, &charge, 200).await;
    // Refunded by someone else, under a key of their own and with no metadata of oncepay's.
    let by_hand = reqwest::Client::new()
        .post(format!("{}/v1/refunds", simulator.base_url()))
        .bearer_auth("sk_test_oncepay_simulator")
        .header("Idempotency-Key", "refunded-by-hand-1")
        .json(&json!({"charge": charge, "amount": 50}))
        .send()
        .await
        .unwrap();
    assert_eq!(by_hand.status(), 201);
    let by_hand: Refund = by_hand.json().await.unwrap();
    let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let window = Window::new(now - time::Duration::HOUR, now + time::Duration::HOUR).unwrap();
    let reconciliation = Reconciliation::new(pool.clone(), HttpProvider::new(&settings).unwrap(), config(2, false));

    let summary = completed(reconciliation.run_window(window, Trigger::Operator).await.unwrap());

    assert_eq!((summary.provider_charges, summary.ledger_entries), (1, 1), "the charge matches its entry");
    assert_eq!((summary.provider_refunds, summary.refund_ledger_entries), (3, 1));
    let mut expected = [pair("refund_missing_in_ledger", &unbooked_made.id), pair("unrequested_refund", &by_hand.id)];
    expected.sort();
    assert_eq!(found(&pool, summary.run_id).await, expected);
    simulator.stop().await.unwrap();
}
