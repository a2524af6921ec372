//! The poller against a real PostgreSQL and a wiremock provider: it settles `unknown` payments both
//! ways, resends only when the provider provably has nothing inside the key window, and
//! dead-letters what a failing provider never answers.

use std::time::Duration;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::ChargeStatus;
use oncepay_provider::http::HttpProvider;
use oncepay_provider::wire::{EventType, WebhookEvent};
use oncepay_reconciler::poller::{Counts, PaymentPoller};
use oncepay_reconciler::unknown::payments as unknown;
use oncepay_reconciler::webhooks;
use oncepay_store::fixtures::{self, tenant};
use serde_json::{Value, json};
use sqlx::PgPool;
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, charge, count_for, poller_config, status, unknown_payment};

const DAY: i64 = 86_400;

fn poller(pool: &PgPool, provider: &MockServer, max_attempts: u32) -> PaymentPoller<HttpProvider> {
    PaymentPoller::new(pool.clone(), fixtures::provider(&provider.uri()), poller_config(max_attempts))
}

/// The provider answers a lookup of the payment's key with `status` and `body`.
async fn answer_lookup(provider: &MockServer, payment_id: PaymentId, status: u16, body: Value) {
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(query_param("idempotency_key", payment_id.downstream_key().as_str()))
        .respond_with(ResponseTemplate::new(status).set_body_json(body))
        .mount(provider)
        .await;
}

fn listing(charges: &[oncepay_provider::Charge]) -> Value {
    json!({ "data": charges, "has_more": false })
}

/// A tenant's payment of 1999 cents left `unknown` a minute ago, for which the provider finds one
/// charge in `status`.
async fn unknown_with_one_charge(pool: &PgPool, provider: &MockServer, status: ChargeStatus) -> (TenantId, PaymentId) {
    let tenant_id = tenant(pool, "acme").await;
    let payment_id = unknown_payment(pool, tenant_id, "order-1", 1999, 60).await;
    let found = charge(tenant_id, payment_id, "ch_1", status, 1999);
    answer_lookup(provider, payment_id, 200, listing(&[found])).await;
    (tenant_id, payment_id)
}

async fn actors(pool: &PgPool, payment_id: PaymentId) -> Vec<(String, PaymentStatus)> {
    sqlx::query!(
        r#"SELECT actor, to_status AS "to_status: PaymentStatus" FROM payment_events WHERE payment_id = $1 ORDER BY seq"#, payment_id.as_uuid())
        .map(|row| (row.actor, row.to_status))
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_charge_found_at_the_provider_settles_the_payment_as_succeeded(pool: PgPool) {
    let provider = MockServer::start().await;
    let (tenant_id, payment_id) = unknown_with_one_charge(&pool, &provider, ChargeStatus::Succeeded).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, succeeded: 1, ..Counts::default() });
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded);
    assert_eq!(count_for(&pool, "ledger_entries", payment_id).await, 1);
    assert_eq!(count_for(&pool, "unknown_payments", payment_id).await, 0);
    assert_eq!(
        actors(&pool, payment_id).await.last().unwrap(),
        &("reconciler:poller".to_owned(), PaymentStatus::Succeeded)
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_declined_charge_found_at_the_provider_settles_the_payment_as_failed(pool: PgPool) {
    let provider = MockServer::start().await;
    let (tenant_id, payment_id) = unknown_with_one_charge(&pool, &provider, ChargeStatus::Failed).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, failed: 1, ..Counts::default() });
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Failed);
    assert_eq!(count_for(&pool, "ledger_entries", payment_id).await, 0);
    assert_eq!(count_for(&pool, "unknown_payments", payment_id).await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn no_charge_inside_the_key_window_sends_the_payment_again_with_the_same_key(pool: PgPool) {
    let provider = MockServer::start().await;
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = unknown_payment(&pool, tenant_id, "order-1", 1999, 60).await;
    answer_lookup(&provider, payment_id, 200, listing(&[])).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, resent: 1, ..Counts::default() });
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Pending);
    assert_eq!(count_for(&pool, "outbox", payment_id).await, 1);
    assert_eq!(count_for(&pool, "unknown_payments", payment_id).await, 0);
}

/// A payment whose resend the provider refused, the worker having found it may already be charged.
async fn refused_resend(pool: &PgPool, tenant_id: TenantId, key: &str) -> PaymentId {
    let payment_id = unknown_payment(pool, tenant_id, key, 1999, 60).await;
    sqlx::query!(
        "UPDATE unknown_payments SET reason = 'refused_after_possible_charge', refused_code = 'provider_rejected', \
         refused_message = 'The provider refused the request as invalid.' WHERE payment_id = $1",
        payment_id.as_uuid()
    )
    .execute(pool)
    .await
    .unwrap();
    payment_id
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refused_resend_is_not_failed_by_an_empty_lookup_while_an_earlier_send_may_still_land(pool: PgPool) {
    let provider = MockServer::start().await;
    let tenant_id = tenant(&pool, "acme").await;
    // The first send's answer was lost a minute ago and its resend was refused: the first send may
    // still reach the provider, which holds nothing for the key yet.
    let payment_id = refused_resend(&pool, tenant_id, "order-1").await;
    answer_lookup(&provider, payment_id, 200, listing(&[])).await;
    let poller = poller(&pool, &provider, 5);

    let first = poller.run_once().await.unwrap();
    let after_the_empty_lookup = status(&pool, tenant_id, payment_id).await;
    // The first send lands: the provider now holds its charge.
    provider.reset().await;
    let landed = charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 1999);
    answer_lookup(&provider, payment_id, 200, listing(&[landed])).await;
    let second = poller.run_once().await.unwrap();

    assert_eq!(first, Counts { claimed: 1, inconclusive: 1, ..Counts::default() });
    assert_eq!(after_the_empty_lookup, PaymentStatus::Unknown, "an empty lookup proves nothing was charged so far");
    assert_eq!(second, Counts { claimed: 1, succeeded: 1, ..Counts::default() });
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded, "the first send did charge");
    assert_eq!(count_for(&pool, "ledger_entries", payment_id).await, 1);
    assert_eq!(count_for(&pool, "outbox", payment_id).await, 0, "never resent to be refused again");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refused_resend_whose_lookups_find_nothing_goes_to_an_operator_and_is_never_failed(pool: PgPool) {
    let provider = MockServer::start().await;
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = refused_resend(&pool, tenant_id, "order-1").await;
    answer_lookup(&provider, payment_id, 200, listing(&[])).await;
    let poller = poller(&pool, &provider, 2);

    let first = poller.run_once().await.unwrap();
    let second = poller.run_once().await.unwrap();

    assert_eq!(first, Counts { claimed: 1, inconclusive: 1, ..Counts::default() });
    assert_eq!(second, Counts { claimed: 1, dead_lettered: 1, ..Counts::default() });
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::DeadLettered);
    let failure: Option<String> =
        sqlx::query_scalar!("SELECT failure_code FROM payments WHERE payment_id = $1", payment_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(failure, None, "never reported as no charge made");
    let (kind, _) = open_dead_letter(&pool, payment_id).await.unwrap();
    assert_eq!(kind, "unresolved");
    let evidence: Value = sqlx::query_scalar!(
        "SELECT evidence FROM dead_letters WHERE payment_id = $1 AND resolved_at IS NULL",
        payment_id.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(evidence.to_string().contains("provider_rejected"), "the refusal is evidence for the operator: {evidence}");
    assert_eq!(count_for(&pool, "outbox", payment_id).await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn no_charge_past_the_key_window_proves_nothing_and_never_resends(pool: PgPool) {
    let provider = MockServer::start().await;
    let tenant_id = tenant(&pool, "acme").await;
    // First sent 23 h 30 min ago: inside the provider's 24 h, but inside the one-hour margin too.
    let payment_id = unknown_payment(&pool, tenant_id, "order-1", 1999, DAY - 1800).await;
    answer_lookup(&provider, payment_id, 200, listing(&[])).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, inconclusive: 1, ..Counts::default() });
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Unknown);
    assert_eq!(count_for(&pool, "outbox", payment_id).await, 0);
    let (attempts, evidence) = support::queue_entry(&pool, payment_id).await;
    assert_eq!(attempts, 1);
    assert_eq!(evidence.as_array().unwrap().len(), 2, "the worker's entry and the poll's: {evidence}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_provider_that_keeps_failing_ends_in_the_dead_letter_table_with_the_evidence(pool: PgPool) {
    let provider = MockServer::start().await;
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = unknown_payment(&pool, tenant_id, "order-1", 1999, 60).await;
    Mock::given(method("GET")).respond_with(ResponseTemplate::new(503)).expect(3).mount(&provider).await;
    let poller = poller(&pool, &provider, 3);

    let mut passes = Vec::new();
    while status(&pool, tenant_id, payment_id).await == PaymentStatus::Unknown && passes.len() < 10 {
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
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::DeadLettered);
    assert_eq!(count_for(&pool, "unknown_payments", payment_id).await, 0);
    assert_eq!(count_for(&pool, "outbox", payment_id).await, 0);
    let (kind, attempts, evidence): (String, i32, Value) = sqlx::query!(
        "SELECT kind, attempts, evidence FROM dead_letters WHERE payment_id = $1 AND resolved_at IS NULL",
        payment_id.as_uuid()
    )
    .map(|row| (row.kind, row.attempts, row.evidence))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((kind.as_str(), attempts), ("unresolved", 3));
    let sources: Vec<&str> = evidence.as_array().unwrap().iter().map(|e| e["source"].as_str().unwrap()).collect();
    assert_eq!(sources, ["worker", "poll", "poll", "poll"]);
    assert!(evidence[3]["result"].as_str().unwrap().contains("503"), "{evidence}");
    // A dead-lettered payment is no longer polled.
    assert_eq!(poller.run_once().await.unwrap(), Counts::default());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_claimed_by_one_poller_is_not_looked_up_by_another_while_the_lease_holds(pool: PgPool) {
    let provider = MockServer::start().await;
    let tenant_id = tenant(&pool, "acme").await;
    unknown_payment(&pool, tenant_id, "order-1", 1999, 60).await;
    Mock::given(method("GET")).respond_with(ResponseTemplate::new(503)).expect(0).mount(&provider).await;
    let mut conn = pool.acquire().await.unwrap();
    let claimed = unknown::claim_due(&mut conn, 10, Duration::from_secs(60), Duration::from_secs(3600)).await.unwrap();

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(claimed.len(), 1);
    assert_eq!(counts, Counts::default());
}

/// Each claim statement takes one tenant's payments (one shard under Citus); a batch is shared out
/// between the tenants with due payments, so one tenant's pile of `unknown` payments does not hold
/// another's back.
#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_batch_is_shared_between_the_tenants_with_due_payments(pool: PgPool) {
    let (busy, quiet) = (tenant(&pool, "busy").await, tenant(&pool, "quiet").await);
    for order in 0..6 {
        unknown_payment(&pool, busy, &format!("busy-{order}"), 1999, 60).await;
    }
    let quiet_one = unknown_payment(&pool, quiet, "quiet-0", 1999, 60).await;
    let mut conn = pool.acquire().await.unwrap();

    let claimed = unknown::claim_due(&mut conn, 4, Duration::from_secs(60), Duration::from_secs(3600)).await.unwrap();

    let by_tenant = |tenant_id| claimed.iter().filter(|c| c.tenant_id == tenant_id).count();
    assert_eq!((by_tenant(busy), by_tenant(quiet)), (3, 1), "{claimed:?}");
    assert!(claimed.iter().any(|c| c.payment_id == quiet_one));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn every_due_payment_in_a_batch_is_settled_in_one_pass(pool: PgPool) {
    let provider = MockServer::start().await;
    let tenant_id = tenant(&pool, "acme").await;
    let mut payments = Vec::new();
    for i in 0..6 {
        let payment_id = unknown_payment(&pool, tenant_id, &format!("order-{i}"), 100 + i, 60).await;
        let outcome = if i % 2 == 0 { ChargeStatus::Succeeded } else { ChargeStatus::Failed };
        let charge = charge(tenant_id, payment_id, &format!("ch_{i}"), outcome, 100 + i);
        answer_lookup(&provider, payment_id, 200, listing(&[charge])).await;
        payments.push((payment_id, outcome));
    }

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 6, succeeded: 3, failed: 3, ..Counts::default() });
    for (payment_id, outcome) in payments {
        let expected =
            if outcome == ChargeStatus::Succeeded { PaymentStatus::Succeeded } else { PaymentStatus::Failed };
        assert_eq!(status(&pool, tenant_id, payment_id).await, expected);
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_webhook_recorded_while_the_payment_was_being_sent_settles_it_once_unknown_without_asking(pool: PgPool) {
    let provider = MockServer::start().await;
    Mock::given(method("GET")).respond_with(ResponseTemplate::new(503)).expect(0).mount(&provider).await;
    let tenant_id = tenant(&pool, "acme").await;
    // Sent two days ago: the provider may well have forgotten the key by now.
    let payment_id = support::accept(&pool, tenant_id, "order-1", 1999).await;
    support::claim(&pool, tenant_id, payment_id, 2 * DAY).await;
    let data = charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 1999);
    let event = WebhookEvent { event_type: EventType::ChargeSucceeded, created: data.created, data };
    let recorded = webhooks::apply(&pool, "msg_1", &event).await.unwrap();
    support::uncertain(&pool, tenant_id, payment_id).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(recorded.label(), "not_unknown");
    assert_eq!(counts, Counts { claimed: 1, succeeded: 1, ..Counts::default() });
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded);
    assert_eq!(count_for(&pool, "ledger_entries", payment_id).await, 1);
    let detail: Value = sqlx::query_scalar!(
        r#"SELECT detail AS "detail!" FROM payment_events WHERE payment_id = $1 AND to_status = 'succeeded'"#,
        payment_id.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(detail["source"], "webhook_recorded");
}

/// The open dead letter of a payment: (kind, reason).
async fn open_dead_letter(pool: &PgPool, payment_id: PaymentId) -> Option<(String, String)> {
    sqlx::query!(
        "SELECT kind, reason FROM dead_letters WHERE payment_id = $1 AND resolved_at IS NULL",
        payment_id.as_uuid()
    )
    .map(|row| (row.kind, row.reason))
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_charge_found_for_another_amount_is_never_booked_and_goes_to_an_operator(pool: PgPool) {
    let provider = MockServer::start().await;
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = unknown_payment(&pool, tenant_id, "order-1", 1999, 60).await;
    let found = charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 1500);
    answer_lookup(&provider, payment_id, 200, listing(&[found])).await;

    let counts = poller(&pool, &provider, 5).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, dead_lettered: 1, ..Counts::default() });
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::DeadLettered);
    assert_eq!(count_for(&pool, "ledger_entries", payment_id).await, 0);
    let (kind, reason) = open_dead_letter(&pool, payment_id).await.unwrap();
    assert_eq!(kind, "conflict");
    assert!(reason.contains("1500") && reason.contains("1999"), "{reason}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_charge_the_ledger_cannot_book_counts_as_an_inconclusive_lookup_until_dead_lettered(pool: PgPool) {
    let provider = MockServer::start().await;
    let tenant_id = tenant(&pool, "acme").await;
    let unbookable: [fn(&mut oncepay_provider::Charge); 3] =
        [|c| c.amount = 0, |c| c.currency = "eur".into(), |c| c.id = String::new()];
    for (i, spoil) in unbookable.into_iter().enumerate() {
        let payment_id = unknown_payment(&pool, tenant_id, &format!("order-{i}"), 1999, 60).await;
        let mut found = charge(tenant_id, payment_id, &format!("ch_{i}"), ChargeStatus::Succeeded, 1999);
        spoil(&mut found);
        answer_lookup(&provider, payment_id, 200, listing(&[found])).await;
    }
    let poller = poller(&pool, &provider, 3);

    let mut passes = Vec::new();
    for _ in 0..3 {
        passes.push(poller.run_once().await.map_err(|e| format!("{e:#}")));
    }

    assert_eq!(
        passes,
        [
            Ok(Counts { claimed: 3, inconclusive: 3, ..Counts::default() }),
            Ok(Counts { claimed: 3, inconclusive: 3, ..Counts::default() }),
            Ok(Counts { claimed: 3, dead_lettered: 3, ..Counts::default() }),
        ]
    );
    let dead_lettered: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM payments WHERE status = 'dead_lettered'"#)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dead_lettered, 3);
    assert_eq!(fixtures::count(&pool, "ledger_entries").await, 0);
}
