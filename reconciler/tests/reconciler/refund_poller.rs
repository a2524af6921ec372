//! The refund poller against a real PostgreSQL and a wiremock provider speaking the simulator's
//! protocol (`GET /v1/refunds?charge=&idempotency_key=`): it settles `unknown` refunds both ways,
//! resends inside the key window, waits past it while a send may still land, fails a refund the
//! provider never made once every send is a key window old, and dead-letters what contradicts the
//! refund or what a failing provider never answers.

use std::time::Duration;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::refund_status::RefundStatus;
use oncepay_provider::http::HttpProvider;
use oncepay_provider::{Refund, RefundState};
use oncepay_reconciler::poller::{Counts, PollerConfig, RefundPoller};
use oncepay_reconciler::unknown::refunds as unknown;
use oncepay_service::backoff::Backoff;
use oncepay_store::fixtures::{self, tenant};
use serde_json::{Value, json};
use sqlx::PgPool;
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{count_for_refund, poller_config, refund_status, refunded, succeeded_payment, unknown_refund};

const DAY: i64 = 86_400;

fn poller(pool: &PgPool, provider: &MockServer, max_attempts: u32) -> RefundPoller<HttpProvider> {
    RefundPoller::new(pool.clone(), fixtures::provider(&provider.uri()), poller_config(max_attempts))
}

/// A refund of `ch_order-1` under `refund_id`'s key, as the simulator reports it.
fn provider_refund(refund_id: RefundId, id: &str, status: RefundState, amount: i64) -> Refund {
    oncepay_provider::fixtures::refund(refund_id, id, "ch_order-1", status, amount)
}

/// The provider answers a lookup of the refund's key, of the payment's charge, with `status` and
/// `body`.
async fn answer_lookup(provider: &MockServer, refund_id: RefundId, status: u16, body: Value) {
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param("charge", "ch_order-1"))
        .and(query_param("idempotency_key", refund_id.downstream_key().as_str()))
        .respond_with(ResponseTemplate::new(status).set_body_json(body))
        .mount(provider)
        .await;
}

/// The provider holds one succeeded refund of 500 under the refund's key, `re_1`.
async fn shows_succeeded(provider: &MockServer, refund_id: RefundId) {
    answer_lookup(
        provider,
        refund_id,
        200,
        listing(&[provider_refund(refund_id, "re_1", RefundState::Succeeded, 500)]),
    )
    .await;
}

fn listing(refunds: &[Refund]) -> Value {
    json!({ "data": refunds, "has_more": false })
}

/// A tenant's payment of 1999 cents, charged as `ch_order-1`, and a refund of 500 of it that a worker
/// sent `sent_secs_ago` and left `unknown`.
async fn unknown_refund_of_a_payment(pool: &PgPool, sent_secs_ago: i64) -> (TenantId, PaymentId, RefundId) {
    let tenant_id = tenant(pool, "acme").await;
    let payment_id = succeeded_payment(pool, tenant_id, "order-1", 1999).await;
    let refund_id = unknown_refund(pool, tenant_id, payment_id, "refund-1", 500, sent_secs_ago).await;
    (tenant_id, payment_id, refund_id)
}

/// The refund's audit trail: (actor, to_status, reason, detail), oldest first.
async fn history(pool: &PgPool, refund_id: RefundId) -> Vec<(String, RefundStatus, String, Option<Value>)> {
    sqlx::query!(
        r#"SELECT actor, to_status AS "to_status: RefundStatus", reason, detail FROM refund_events
           WHERE refund_id = $1 ORDER BY seq"#,
        refund_id.as_uuid()
    )
    .map(|row| (row.actor, row.to_status, row.reason, row.detail))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The refund's failure: (code, message).
async fn failure(pool: &PgPool, refund_id: RefundId) -> (Option<String>, Option<String>) {
    sqlx::query!("SELECT failure_code, failure_message FROM refunds WHERE refund_id = $1", refund_id.as_uuid())
        .map(|row| (row.failure_code, row.failure_message))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_the_provider_shows_succeeded_settles_with_its_ledger_entry_and_the_money_on_the_payment(
    pool: PgPool,
) {
    let provider = MockServer::start().await;
    let (_, payment_id, refund_id) = unknown_refund_of_a_payment(&pool, 60).await;
    shows_succeeded(&provider, refund_id).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, succeeded: 1, ..Counts::default() });
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Succeeded);
    let (booked, amount): (String, i64) = sqlx::query!(
        "SELECT provider_refund_id, amount FROM refund_ledger_entries WHERE refund_id = $1",
        refund_id.as_uuid()
    )
    .map(|row| (row.provider_refund_id, row.amount))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((booked.as_str(), amount), ("re_1", 500));
    assert_eq!(refunded(&pool, payment_id).await, (500, 500));
    let (actor, to, _, detail) = history(&pool, refund_id).await.pop().unwrap();
    assert_eq!((actor.as_str(), to), ("reconciler:poller", RefundStatus::Succeeded));
    assert_eq!(detail.unwrap()["refund"]["id"], "re_1");
    let stored: Option<i16> =
        sqlx::query_scalar!("SELECT response_status FROM refund_keys WHERE refund_id = $1", refund_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, Some(200), "a replay of the refund's key finds its final response");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_the_provider_shows_failed_fails_and_gives_its_reservation_back(pool: PgPool) {
    let provider = MockServer::start().await;
    let (_, payment_id, refund_id) = unknown_refund_of_a_payment(&pool, 60).await;
    answer_lookup(&provider, refund_id, 200, listing(&[provider_refund(refund_id, "re_1", RefundState::Failed, 500)]))
        .await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, failed: 1, ..Counts::default() });
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Failed);
    assert_eq!(failure(&pool, refund_id).await.0.as_deref(), Some("refund_failed"));
    assert_eq!(refunded(&pool, payment_id).await, (0, 0));
    assert_eq!(count_for_refund(&pool, "refund_ledger_entries", refund_id).await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn no_refund_inside_the_key_window_sends_the_refund_again_with_the_same_key(pool: PgPool) {
    let provider = MockServer::start().await;
    let (_, payment_id, refund_id) = unknown_refund_of_a_payment(&pool, 60).await;
    answer_lookup(&provider, refund_id, 200, listing(&[])).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, resent: 1, ..Counts::default() });
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Pending);
    assert_eq!(count_for_refund(&pool, "refund_outbox", refund_id).await, 1, "queued for a worker");
    assert_eq!(refunded(&pool, payment_id).await, (500, 0), "still reserved");
    // A refund that is no longer `unknown` is not looked up again.
    assert_eq!(poller(&pool, &provider, 5).run_once().await.unwrap(), Counts::default());
}

/// A refund first claimed long ago (that attempt never reached the provider) and sent again just
/// now, whose answer was lost: the provider may still be making it, so an empty list proves nothing
/// yet. Seen in a chaos run, where the refund was failed and then made.
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn no_refund_yet_after_a_send_that_may_still_land_keeps_the_refund_unknown_until_it_appears(pool: PgPool) {
    let provider = MockServer::start().await;
    // First sent 23 h 30 min ago, past the resend horizon; `unknown` since a moment ago.
    let (_, payment_id, refund_id) = unknown_refund_of_a_payment(&pool, DAY - 1800).await;
    answer_lookup(&provider, refund_id, 200, listing(&[])).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, inconclusive: 1, ..Counts::default() });
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Unknown);
    assert_eq!(refunded(&pool, payment_id).await, (500, 0), "still reserved");
    assert_eq!(count_for_refund(&pool, "refund_outbox", refund_id).await, 0, "never resent");

    // The send lands at the provider; the next lookup finds its refund.
    provider.reset().await;
    shows_succeeded(&provider, refund_id).await;
    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, succeeded: 1, ..Counts::default() });
    assert_eq!(refunded(&pool, payment_id).await, (500, 500));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn no_refund_past_the_key_window_fails_the_refund_as_never_made(pool: PgPool) {
    let provider = MockServer::start().await;
    // First sent 25 h ago and `unknown` for 25 h, so every send is older than the provider's 24 h.
    let (_, payment_id, refund_id) = unknown_refund_of_a_payment(&pool, DAY + 3600).await;
    sqlx::query!(
        "UPDATE refunds SET created_at = created_at - interval '25 hours', updated_at = now() - interval '25 hours'
         WHERE refund_id = $1",
        refund_id.as_uuid()
    )
    .execute(&pool)
    .await
    .unwrap();
    answer_lookup(&provider, refund_id, 200, listing(&[])).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, not_made: 1, ..Counts::default() });
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Failed);
    let (code, message) = failure(&pool, refund_id).await;
    assert_eq!(code.as_deref(), Some("refund_not_made"));
    assert!(message.unwrap().contains("holds no refund under this refund's key"));
    assert_eq!(count_for_refund(&pool, "refund_outbox", refund_id).await, 0, "never resent");
    assert_eq!(refunded(&pool, payment_id).await, (0, 0));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_for_another_amount_is_never_booked_and_dead_letters_the_refund_with_the_evidence(pool: PgPool) {
    let provider = MockServer::start().await;
    let (_, payment_id, refund_id) = unknown_refund_of_a_payment(&pool, 60).await;
    answer_lookup(
        &provider,
        refund_id,
        200,
        listing(&[provider_refund(refund_id, "re_1", RefundState::Succeeded, 450)]),
    )
    .await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, dead_lettered: 1, ..Counts::default() });
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::DeadLettered);
    assert_eq!(count_for_refund(&pool, "refund_ledger_entries", refund_id).await, 0);
    assert_eq!(refunded(&pool, payment_id).await, (500, 0), "money may have moved: still reserved");
    let (_, to, reason, detail) = history(&pool, refund_id).await.pop().unwrap();
    assert_eq!(to, RefundStatus::DeadLettered);
    assert!(reason.contains("450") && reason.contains("500"), "{reason}");
    assert_eq!(detail.unwrap()["refunds"][0]["amount"], 450);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn two_refunds_under_one_key_dead_letter_the_refund_with_both(pool: PgPool) {
    let provider = MockServer::start().await;
    let (_, _, refund_id) = unknown_refund_of_a_payment(&pool, 60).await;
    let both = [
        provider_refund(refund_id, "re_1", RefundState::Succeeded, 500),
        provider_refund(refund_id, "re_2", RefundState::Succeeded, 500),
    ];
    answer_lookup(&provider, refund_id, 200, listing(&both)).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, dead_lettered: 1, ..Counts::default() });
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::DeadLettered);
    assert_eq!(count_for_refund(&pool, "refund_ledger_entries", refund_id).await, 0);
    let (_, _, reason, detail) = history(&pool, refund_id).await.pop().unwrap();
    assert!(reason.contains("re_1, re_2"), "{reason}");
    assert_eq!(detail.unwrap()["refunds"].as_array().unwrap().len(), 2);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_unfinished_refund_is_counted_as_a_lookup_and_looked_up_again_after_the_backoff(pool: PgPool) {
    let provider = MockServer::start().await;
    let (_, _, refund_id) = unknown_refund_of_a_payment(&pool, 60).await;
    answer_lookup(&provider, refund_id, 200, listing(&[provider_refund(refund_id, "re_1", RefundState::Pending, 500)]))
        .await;
    let config = PollerConfig {
        backoff: Backoff { base: Duration::from_secs(60), max: Duration::from_secs(60) },
        ..poller_config(5)
    };
    let poller = RefundPoller::new(pool.clone(), fixtures::provider(&provider.uri()), config);

    let first = poller.run_once().await.unwrap();
    let second = poller.run_once().await.unwrap();

    assert_eq!(first, Counts { claimed: 1, inconclusive: 1, ..Counts::default() });
    assert_eq!(second, Counts::default(), "not due again before its backoff");
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Unknown);
    let (lookups, wait_secs): (i32, f64) = sqlx::query!(
        r#"SELECT lookups, extract(epoch FROM next_lookup_at - now())::float8 AS "wait_secs!" FROM refunds
           WHERE refund_id = $1"#,
        refund_id.as_uuid()
    )
    .map(|row| (row.lookups, row.wait_secs))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(lookups, 1);
    assert!(wait_secs > 0.0, "the next lookup is planned, {wait_secs} s from now");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_provider_that_keeps_failing_dead_letters_the_refund_after_the_last_lookup(pool: PgPool) {
    let provider = MockServer::start().await;
    let (_, payment_id, refund_id) = unknown_refund_of_a_payment(&pool, 60).await;
    Mock::given(method("GET")).respond_with(ResponseTemplate::new(503)).expect(3).mount(&provider).await;
    let poller = poller(&pool, &provider, 3);

    let mut passes = Vec::new();
    while refund_status(&pool, refund_id).await == RefundStatus::Unknown && passes.len() < 10 {
        passes.push(poller.run_once().await.unwrap());
    }

    assert_eq!(
        passes,
        [
            Counts { claimed: 1, inconclusive: 1, ..Counts::default() },
            Counts { claimed: 1, inconclusive: 1, ..Counts::default() },
            Counts { claimed: 1, dead_lettered: 1, ..Counts::default() },
        ]
    );
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::DeadLettered);
    assert_eq!(refunded(&pool, payment_id).await, (500, 0));
    let (actor, _, reason, detail) = history(&pool, refund_id).await.pop().unwrap();
    assert_eq!(actor, "reconciler:poller");
    assert!(reason.contains("after 3 lookups"), "{reason}");
    let detail = detail.unwrap();
    assert!(detail["result"].as_str().unwrap().contains("503"));
    // The two inconclusive lookups before it are kept with the last, as a payment's are.
    let earlier: Vec<&Value> = detail["earlier_lookups"].as_array().unwrap().iter().collect();
    assert_eq!(earlier.iter().map(|lookup| lookup["attempt"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2]);
    assert!(earlier.iter().all(|lookup| lookup["result"].as_str().unwrap().contains("503")), "{earlier:?}");
    // A dead-lettered refund is no longer looked up.
    assert_eq!(poller.run_once().await.unwrap(), Counts::default());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_claimed_by_one_poller_is_not_looked_up_by_another_while_the_lease_holds(pool: PgPool) {
    let provider = MockServer::start().await;
    Mock::given(method("GET")).respond_with(ResponseTemplate::new(503)).expect(0).mount(&provider).await;
    unknown_refund_of_a_payment(&pool, 60).await;
    let mut conn = pool.acquire().await.unwrap();
    let claimed = unknown::claim_due(&mut conn, 10, Duration::from_secs(60), Duration::from_secs(3600)).await.unwrap();

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(claimed.len(), 1);
    assert_eq!(counts, Counts::default());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_batch_of_refunds_is_shared_between_the_tenants_with_due_refunds(pool: PgPool) {
    let (busy, quiet) = (tenant(&pool, "busy").await, tenant(&pool, "quiet").await);
    let busy_payment = succeeded_payment(&pool, busy, "busy", 1999).await;
    for order in 0..6 {
        unknown_refund(&pool, busy, busy_payment, &format!("busy-{order}"), 100, 60).await;
    }
    let quiet_payment = succeeded_payment(&pool, quiet, "quiet", 1999).await;
    let quiet_one = unknown_refund(&pool, quiet, quiet_payment, "quiet-0", 100, 60).await;
    let mut conn = pool.acquire().await.unwrap();

    let claimed = unknown::claim_due(&mut conn, 4, Duration::from_secs(60), Duration::from_secs(3600)).await.unwrap();

    let by_tenant = |tenant_id| claimed.iter().filter(|c| c.tenant_id() == tenant_id).count();
    assert_eq!((by_tenant(busy), by_tenant(quiet)), (3, 1), "{claimed:?}");
    assert!(claimed.iter().any(|c| c.refund_id() == quiet_one));
}
