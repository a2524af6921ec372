//! Sending refunds: each provider answer lands the refund in the right state, with the money booked
//! on its payment as the answer says, against a real PostgreSQL and a wiremock provider speaking the
//! simulator's protocol.

use std::time::Duration;

use oncepay_domain::refund_status::{RefundStatus, RefundTransition};
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::http::HttpProvider;
use oncepay_provider::wire::CreateRefund;
use oncepay_service::backoff::Backoff;
use oncepay_service::config::{LogFormat, TelemetrySettings};
use oncepay_service::telemetry::{self, TraceContext};
use oncepay_store::fixtures::RefundSubmission;
use oncepay_store::refunds::intake::{self, RefundIntake};
use oncepay_store::refunds::settling::{self, RefundChange};
use oncepay_store::refunds::{self, Refund};
use oncepay_store::transitions::Recorded;
use oncepay_worker::refunds::{Recording, RefundSender};
use serde_json::json;
use sqlx::PgPool;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{
    self, Accepted, Charges, accept, config, drainer, provider_settings, refund, refund_traced, tenant,
};

/// A payment of 1999 EUR cents, charged by the worker against a provider that charges it.
async fn charged_payment(pool: &PgPool) -> (Accepted, String) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let accepted = accept(pool, tenant(pool).await, 1999).await;
    drainer(pool, &server.uri(), config("w0")).run_once().await.unwrap();
    let payment = support::payment(pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Succeeded);
    (accepted, payment.provider_charge_id.unwrap())
}

fn sender(pool: &PgPool, server: &MockServer, max_attempts: u32) -> RefundSender<HttpProvider> {
    let provider = HttpProvider::new(&provider_settings(&server.uri())).unwrap();
    let config = oncepay_worker::DrainerConfig {
        max_attempts,
        backoff: Backoff { base: Duration::ZERO, max: Duration::ZERO },
        ..config("w1")
    };
    RefundSender::new(pool.clone(), provider, config)
}

async fn answering(template: ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/v1/refunds")).respond_with(template).mount(&server).await;
    server
}

fn provider_refund(refund: &Refund, charge: &str, status: &str, amount: i64) -> serde_json::Value {
    json!({
        "id": "re_1",
        "status": status,
        "charge": charge,
        "amount": amount,
        "currency": "EUR",
        "idempotency_key": refund.refund_id.downstream_key().as_str(),
        "created": 1_763_800_000,
        "metadata": {},
    })
}

async fn stored(pool: &PgPool, refund: &Refund) -> Refund {
    let mut conn = pool.acquire().await.unwrap();
    refunds::find(&mut conn, refund.tenant_id, refund.refund_id).await.unwrap().unwrap()
}

/// `(refunds_reserved, refunded)` of the payment.
async fn booked(pool: &PgPool, payment: Accepted) -> (i64, i64) {
    sqlx::query_as("SELECT refunds_reserved, refunded FROM payments WHERE tenant_id = $1 AND payment_id = $2")
        .bind(payment.tenant_id.as_uuid())
        .bind(payment.payment_id.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn queued(pool: &PgPool, refund: &Refund) -> bool {
    sqlx::query_scalar("SELECT count(*) = 1 FROM refund_outbox WHERE tenant_id = $1 AND refund_id = $2")
        .bind(refund.tenant_id.as_uuid())
        .bind(refund.refund_id.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_refund_the_provider_makes_succeeds_and_is_booked_once(pool: PgPool) {
    let (payment, charge) = charged_payment(&pool).await;
    let asked = refund(&pool, payment, 500).await;
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/refunds"))
        .respond_with(ResponseTemplate::new(201).set_body_json(provider_refund(&asked, &charge, "succeeded", 500)))
        .expect(1)
        .mount(&server)
        .await;

    let recorded = sender(&pool, &server, 3).run_once().await.unwrap();

    assert_eq!(recorded, [Recording::Moved(RefundStatus::Succeeded)]);
    let refund = stored(&pool, &asked).await;
    assert_eq!(refund.provider_refund_id.as_deref(), Some("re_1"));
    assert_eq!(booked(&pool, payment).await, (500, 500));
    assert!(!queued(&pool, &asked).await);
    let ledger: (String, i64) = sqlx::query_as(
        "SELECT provider_refund_id, amount FROM refund_ledger_entries WHERE tenant_id = $1 AND refund_id = $2",
    )
    .bind(asked.tenant_id.as_uuid())
    .bind(asked.refund_id.as_uuid())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(ledger, ("re_1".to_owned(), 500));
    let stored_response: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT response_body FROM refund_keys WHERE tenant_id = $1 AND refund_id = $2")
            .bind(asked.tenant_id.as_uuid())
            .bind(asked.refund_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored_response.unwrap()["status"], "succeeded");

    let sent = &server.received_requests().await.unwrap()[0];
    assert_eq!(sent.headers["idempotency-key"], asked.refund_id.downstream_key().as_str());
    let body: CreateRefund = sent.body_json().unwrap();
    assert_eq!((body.charge.as_str(), body.amount), (charge.as_str(), 500));
    assert_eq!(body.metadata["oncepay_refund_id"], asked.refund_id.to_string());

    assert!(sender(&pool, &server, 3).run_once().await.unwrap().is_empty(), "a settled refund is never sent again");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_refund_the_provider_fails_gives_its_amount_back_to_the_payment(pool: PgPool) {
    let (payment, _) = charged_payment(&pool).await;
    let asked = refund(&pool, payment, 700).await;
    let server = answering(ResponseTemplate::new(402).set_body_json(json!({
        "error": {"code": "insufficient_funds", "message": "Not enough balance.", "refund": "re_9"}
    })))
    .await;

    let recorded = sender(&pool, &server, 3).run_once().await.unwrap();

    assert_eq!(recorded, [Recording::Moved(RefundStatus::Failed)]);
    let refund = stored(&pool, &asked).await;
    assert_eq!(refund.failure_code.as_deref(), Some("insufficient_funds"));
    assert_eq!(refund.provider_refund_id.as_deref(), Some("re_9"));
    assert_eq!(booked(&pool, payment).await, (0, 0), "a failed refund reserves nothing");
}

#[sqlx::test(migrations = "../migrations")]
async fn an_uncertain_answer_leaves_the_refund_unknown_and_never_resent_by_a_worker(pool: PgPool) {
    let (payment, _) = charged_payment(&pool).await;
    let asked = refund(&pool, payment, 300).await;
    let server = answering(ResponseTemplate::new(503)).await;

    let recorded = sender(&pool, &server, 3).run_once().await.unwrap();

    assert_eq!(recorded, [Recording::Moved(RefundStatus::Unknown)]);
    let refund = stored(&pool, &asked).await;
    assert!(refund.may_have_moved);
    assert_eq!(booked(&pool, payment).await, (300, 0), "an unknown refund keeps its reservation");
    assert!(sender(&pool, &server, 3).run_once().await.unwrap().is_empty());
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

/// Sends an `unknown` refund back to its outbox as the refund poller does when the provider holds
/// no refund under its key inside the key window.
async fn requeue_unknown(pool: &PgPool, refund: &Refund) {
    let change = RefundChange {
        tenant_id: refund.tenant_id,
        refund_id: refund.refund_id,
        from: RefundStatus::Unknown,
        transition: RefundTransition::ProviderHasNoRefund,
        actor: "reconciler:refund-poller",
        reason: "the provider holds no refund under the refund's key",
        detail: None,
    };
    let mut tx = pool.begin().await.unwrap();
    let requeued = settling::apply(&mut tx, &change, None, time::OffsetDateTime::now_utc()).await.unwrap();
    assert!(matches!(requeued, Recorded::Moved(_)), "{requeued:?}");
    tx.commit().await.unwrap();
}

/// Makes the refund's first send `age` old.
async fn age_first_send(pool: &PgPool, refund: &Refund, age: Duration) {
    sqlx::query!(
        "UPDATE refunds SET first_sent_at = now() - make_interval(secs => $3) WHERE tenant_id = $1 AND refund_id = $2",
        refund.tenant_id.as_uuid(),
        refund.refund_id.as_uuid(),
        age.as_secs_f64()
    )
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrations = "../migrations")]
async fn a_refund_that_may_have_moved_money_is_not_resent_past_the_key_window(pool: PgPool) {
    let (payment, charge) = charged_payment(&pool).await;
    let asked = refund(&pool, payment, 300).await;
    // The first send's answer is lost: it may have reached the provider.
    sender(&pool, &answering(ResponseTemplate::new(503)).await, 3).run_once().await.unwrap();
    // The refund poller's lookup finds no refund under the key inside the key window, so the refund
    // is queued to be sent again ...
    requeue_unknown(&pool, &asked).await;
    // ... but no worker claims it before the provider's key window has run out, and by then the
    // first send has reached the provider, which no longer remembers the key: a resend would be a
    // second refund.
    age_first_send(&pool, &asked, Duration::from_secs(86_400 - 60)).await;
    let late = provider_refund(&asked, &charge, "succeeded", 300);
    let provider = answering(ResponseTemplate::new(200).set_body_json(late)).await;

    let recorded = sender(&pool, &provider, 3).run_once().await.unwrap();

    assert!(provider.received_requests().await.unwrap().is_empty(), "a resend past the key window could refund twice");
    assert_eq!(recorded, [Recording::Moved(RefundStatus::Unknown)]);
    let refund = stored(&pool, &asked).await;
    assert_eq!(refund.status, RefundStatus::Unknown);
    assert!(refund.may_have_moved);
    assert_eq!(booked(&pool, payment).await, (300, 0), "an unknown refund keeps its reservation");
    let why: Option<String> = sqlx::query_scalar(
        "SELECT detail->>'reason' FROM refund_events WHERE refund_id = $1 ORDER BY seq DESC LIMIT 1",
    )
    .bind(asked.refund_id.as_uuid())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(why.as_deref(), Some(oncepay_worker::verdict::KEY_WINDOW_PASSED), "the same code as a payment's");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_refund_that_may_have_moved_money_is_resent_with_its_key_inside_the_key_window(pool: PgPool) {
    let (payment, charge) = charged_payment(&pool).await;
    let asked = refund(&pool, payment, 300).await;
    // The first send's answer is lost: it may have reached the provider.
    sender(&pool, &answering(ResponseTemplate::new(503)).await, 3).run_once().await.unwrap();
    // The refund poller's lookup finds no refund under the key, and the provider still remembers
    // the key: sending again with it returns the first refund, or makes the only one.
    requeue_unknown(&pool, &asked).await;
    let made = provider_refund(&asked, &charge, "succeeded", 300);
    let provider = answering(ResponseTemplate::new(200).set_body_json(made)).await;

    let recorded = sender(&pool, &provider, 3).run_once().await.unwrap();

    let sent = provider.received_requests().await.unwrap();
    assert_eq!(sent.len(), 1, "a refund queued again inside the key window is sent again");
    assert_eq!(sent[0].headers["idempotency-key"], asked.refund_id.downstream_key().as_str());
    assert_eq!(recorded, [Recording::Moved(RefundStatus::Succeeded)]);
    assert_eq!(booked(&pool, payment).await, (300, 300));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_refund_the_provider_has_not_finished_is_unknown_with_its_id(pool: PgPool) {
    let (payment, charge) = charged_payment(&pool).await;
    let asked = refund(&pool, payment, 300).await;
    let server =
        answering(ResponseTemplate::new(201).set_body_json(provider_refund(&asked, &charge, "pending", 300))).await;

    let recorded = sender(&pool, &server, 3).run_once().await.unwrap();

    assert_eq!(recorded, [Recording::Moved(RefundStatus::Unknown)]);
    assert_eq!(stored(&pool, &asked).await.provider_refund_id.as_deref(), Some("re_1"));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_refund_of_other_money_is_never_booked(pool: PgPool) {
    let (payment, charge) = charged_payment(&pool).await;
    let asked = refund(&pool, payment, 300).await;
    let server =
        answering(ResponseTemplate::new(201).set_body_json(provider_refund(&asked, &charge, "succeeded", 301))).await;

    let recorded = sender(&pool, &server, 3).run_once().await.unwrap();

    assert_eq!(recorded, [Recording::Moved(RefundStatus::Unknown)]);
    assert_eq!(booked(&pool, payment).await, (300, 0));
    let ledger: i64 = sqlx::query_scalar("SELECT count(*) FROM refund_ledger_entries").fetch_one(&pool).await.unwrap();
    assert_eq!(ledger, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_provider_that_cannot_be_reached_is_retried_then_the_refund_fails_with_its_money_back(pool: PgPool) {
    let (payment, _) = charged_payment(&pool).await;
    let asked = refund(&pool, payment, 400).await;
    let provider = HttpProvider::new(&provider_settings(&support::refusing_url())).unwrap();
    let config = oncepay_worker::DrainerConfig {
        max_attempts: 2,
        backoff: Backoff { base: Duration::ZERO, max: Duration::ZERO },
        ..config("w1")
    };
    let sender = RefundSender::new(pool.clone(), provider, config);

    assert_eq!(sender.run_once().await.unwrap(), [Recording::Moved(RefundStatus::Pending)]);
    assert!(queued(&pool, &asked).await, "a refund not sent stays queued");
    assert_eq!(sender.run_once().await.unwrap(), [Recording::Moved(RefundStatus::Failed)]);

    let refund = stored(&pool, &asked).await;
    assert_eq!(refund.failure_code.as_deref(), Some("provider_unreachable"));
    assert_eq!(refund.send_attempts, 2);
    assert_eq!(booked(&pool, payment).await, (0, 0));
    assert!(!queued(&pool, &asked).await);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_result_after_the_lease_was_taken_back_is_not_recorded(pool: PgPool) {
    let (payment, charge) = charged_payment(&pool).await;
    let asked = refund(&pool, payment, 200).await;
    let server =
        answering(ResponseTemplate::new(201).set_body_json(provider_refund(&asked, &charge, "succeeded", 200))).await;
    let sender = sender(&pool, &server, 3);
    let mut conn = pool.acquire().await.unwrap();
    let config = config("w1");
    let claimed = oncepay_store::refunds::sending::claim(
        &mut conn,
        asked.tenant_id,
        1,
        "w1",
        Duration::from_secs(60),
        config.key_window,
    )
    .await
    .unwrap()
    .pop()
    .unwrap();
    // The sweeper takes the lease back (the worker seemed dead) and the refund is queued again.
    sqlx::query("UPDATE refund_outbox SET locked_until = now() - interval '1 second'").execute(&pool).await.unwrap();
    oncepay_store::refunds::sending::sweep(&mut conn, "sweeper", config.key_window, 10).await.unwrap();
    assert_eq!(stored(&pool, &asked).await.status, RefundStatus::Pending);

    let verdict = oncepay_worker::refunds::RefundVerdict::Uncertain {
        code: "timeout",
        reason: "late".to_owned(),
        provider_refund_id: None,
    };
    assert_eq!(sender.record(&claimed, &verdict).await.unwrap(), Recording::LeaseLost);

    assert_eq!(stored(&pool, &asked).await.status, RefundStatus::Pending, "the stale worker wrote nothing");
    assert!(queued(&pool, &asked).await);
}

#[sqlx::test(migrations = "../migrations")]
async fn refunds_never_add_up_to_more_than_the_charge(pool: PgPool) {
    let (payment, _) = charged_payment(&pool).await;
    refund(&pool, payment, 1500).await;
    let submission = RefundSubmission::new("second", payment.payment_id, &json!({"amount": 500}));
    let new = submission.for_payment(payment.tenant_id, payment.payment_id, None);
    let mut conn = pool.acquire().await.unwrap();

    let refused = intake::accept(&mut conn, &new).await.unwrap();

    assert!(
        matches!(refused, RefundIntake::Refused(intake::Refusal::TooMuch { asked: 500, left: 499, .. })),
        "{refused:?}"
    );
    assert_eq!(booked(&pool, payment).await, (1500, 0));
}

#[sqlx::test(migrations = "../migrations")]
async fn one_pass_never_sends_more_refunds_than_the_worker_may_have_in_flight(pool: PgPool) {
    let (payment, charge) = charged_payment(&pool).await;
    let mut asked = Vec::new();
    for _ in 0..5 {
        asked.push(refund(&pool, payment, 100).await);
    }
    let server =
        answering(ResponseTemplate::new(201).set_body_json(provider_refund(&asked[0], &charge, "pending", 100))).await;
    let config = oncepay_worker::DrainerConfig { max_in_flight: 2, ..config("w1") };
    let provider = HttpProvider::new(&provider_settings(&server.uri())).unwrap();
    let sender = RefundSender::new(pool.clone(), provider, config);

    let first = sender.run_once().await.unwrap();

    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
    let mut sent = first.len();
    while sent < asked.len() {
        let pass = sender.run_once().await.unwrap();
        assert!(!pass.is_empty() && pass.len() <= 2, "{pass:?}");
        sent += pass.len();
    }
    assert_eq!(server.received_requests().await.unwrap().len(), 5, "each refund sent once");
}

#[sqlx::test(migrations = "../migrations")]
async fn the_refund_call_continues_the_trace_of_the_request_that_asked_for_it(pool: PgPool) {
    let _telemetry = telemetry::init(
        "oncepay-worker-test",
        &TelemetrySettings { log_format: LogFormat::Text, log_filter: "info".into(), otlp_endpoint: None },
    )
    .unwrap();
    const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
    let (payment, charge) = charged_payment(&pool).await;
    let api_span = TraceContext { traceparent: format!("00-{TRACE_ID}-b7ad6b7169203331-01"), tracestate: None };
    let asked = refund_traced(&pool, payment, 500, Some(api_span)).await;
    let server =
        answering(ResponseTemplate::new(201).set_body_json(provider_refund(&asked, &charge, "succeeded", 500))).await;

    sender(&pool, &server, 3).run_once().await.unwrap();

    let sent = &server.received_requests().await.unwrap()[0];
    let traceparent = sent.headers.get("traceparent").expect("a traceparent header").to_str().unwrap();
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts[1], TRACE_ID, "the same trace: {traceparent}");
    assert_ne!(parts[2], "b7ad6b7169203331", "a span of the worker's own: {traceparent}");
}
