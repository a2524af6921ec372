//! Trace continuity in the reconciler: an `unknown` payment's queue row keeps the trace it was given,
//! the sweeper hands on the outbox row's trace when it makes a payment `unknown`, and the poller's
//! lookup and the resend it decides continue that trace. A refund keeps the trace of the request
//! that asked for it, and its lookup and resend continue it.

use std::sync::OnceLock;
use std::time::Duration;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::refund_status::RefundStatus;
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_provider::KeyWindow;
use oncepay_reconciler::poller::{PaymentPoller, PollerConfig, RefundPoller};
use oncepay_reconciler::sweeper::{Sweeper, SweeperConfig};
use oncepay_service::backoff::Backoff;
use oncepay_service::config::{LogFormat, TelemetrySettings};
use oncepay_service::telemetry::{self, TelemetryGuard, TraceContext};
use oncepay_store::fixtures::{self, tenant};
use oncepay_store::{transitions, unknown_queue};
use serde_json::json;
use sqlx::PgPool;
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{
    accept, change, claim, lose_answer, poller_config, refund_in_trace, refund_status, status, succeeded_payment,
};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const WORKER_SPAN: &str = "00f067aa0ba902b7";

fn traced() {
    static TELEMETRY: OnceLock<TelemetryGuard> = OnceLock::new();
    TELEMETRY.get_or_init(|| {
        let settings =
            TelemetrySettings { log_format: LogFormat::Text, log_filter: "warn".into(), otlp_endpoint: None };
        telemetry::init("oncepay-reconciler-test", &settings).unwrap()
    });
}

fn worker_span() -> TraceContext {
    TraceContext { traceparent: format!("00-{TRACE_ID}-{WORKER_SPAN}-01"), tracestate: Some("vendor=1".into()) }
}

/// The trace id and span id of a `traceparent`.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    (parts[1].to_owned(), parts[2].to_owned())
}

async fn stored_trace(pool: &PgPool, table: &str, payment_id: PaymentId) -> (Option<String>, Option<String>) {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT traceparent, tracestate FROM {table} WHERE payment_id = $1")))
        .bind(payment_id.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A payment the worker sent a minute ago and recorded `unknown` inside `trace`.
async fn unknown_in_trace(pool: &PgPool, tenant_id: TenantId, trace: &TraceContext) -> PaymentId {
    let payment_id = accept(pool, tenant_id, "order-1", 1999).await;
    claim(pool, tenant_id, payment_id, 60).await;
    let mut tx = pool.begin().await.unwrap();
    transitions::apply(&mut tx, &change(tenant_id, payment_id, PaymentStatus::Processing, Transition::Uncertain))
        .await
        .unwrap();
    unknown_queue::enqueue(&mut tx, tenant_id, payment_id, "timeout", json!({}), Some(trace), None).await.unwrap();
    tx.commit().await.unwrap();
    payment_id
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_poll_and_the_resend_it_decides_continue_the_payments_trace(pool: PgPool) {
    traced();
    let provider = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [], "has_more": false})))
        .mount(&provider)
        .await;
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = unknown_in_trace(&pool, tenant_id, &worker_span()).await;
    let poller = PaymentPoller::new(
        pool.clone(),
        fixtures::provider(&provider.uri()),
        PollerConfig {
            interval: Duration::from_millis(10),
            batch_size: 10,
            concurrency: 1,
            lease: Duration::from_secs(60),
            backoff: Backoff { base: Duration::ZERO, max: Duration::ZERO },
            max_attempts: 5,
            max_age: Duration::from_secs(86_400),
            key_window: KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3600) },
        },
    );

    let counts = poller.run_once().await.unwrap();

    assert_eq!(counts.resent, 1, "{counts:?}");
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Pending);
    let lookup = &provider.received_requests().await.unwrap()[0];
    let (lookup_trace, lookup_span) = ids(lookup.headers.get("traceparent").expect("a traceparent").to_str().unwrap());
    assert_eq!(lookup_trace, TRACE_ID, "the lookup is in the payment's trace");
    assert_ne!(lookup_span, WORKER_SPAN, "from a span of the poller's own");
    let (queued, _) = stored_trace(&pool, "outbox", payment_id).await;
    let (queued_trace, queued_span) = ids(&queued.expect("the resend is queued in a trace"));
    assert_eq!(queued_trace, TRACE_ID, "the resend continues the payment's trace");
    assert_ne!(queued_span, WORKER_SPAN, "from the poll's span");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_lease_swept_past_the_key_window_hands_the_outbox_rows_trace_to_the_unknown_queue(pool: PgPool) {
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = accept(&pool, tenant_id, "order-1", 1999).await;
    let request = worker_span();
    // The api's row, claimed by a worker a day and a half ago, whose lease has expired.
    sqlx::query!(
        "UPDATE outbox SET traceparent = $2, tracestate = $3, locked_by = 'w', fencing_token = 1, attempts = 1,
                locked_until = now() - interval '1 minute'
         WHERE payment_id = $1",
        payment_id.as_uuid(),
        &request.traceparent,
        request.tracestate.as_deref()
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query!(
        "UPDATE payments SET send_attempts = 1, first_sent_at = now() - interval '36 hours' WHERE payment_id = $1",
        payment_id.as_uuid()
    )
    .execute(&pool)
    .await
    .unwrap();
    transitions::apply(
        &mut pool.acquire().await.unwrap(),
        &change(tenant_id, payment_id, PaymentStatus::Pending, Transition::Claim),
    )
    .await
    .unwrap();
    let key_window = KeyWindow { window: Duration::from_secs(86_400), safety_margin: Duration::from_secs(3_600) };
    let sweeper =
        Sweeper::new(pool.clone(), SweeperConfig { interval: Duration::from_secs(1), batch_size: 10, key_window });

    let counts = sweeper.run_once().await.unwrap();

    assert_eq!(counts.payments.uncertain, 1, "{counts:?}");
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Unknown);
    assert_eq!(
        stored_trace(&pool, "unknown_payments", payment_id).await,
        (Some(request.traceparent), request.tracestate)
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refunds_lookup_and_the_resend_it_decides_continue_the_trace_of_the_request_that_asked_for_it(pool: PgPool) {
    traced();
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = succeeded_payment(&pool, tenant_id, "order-1", 1999).await;
    let request = worker_span();
    let refund_id = refund_in_trace(&pool, tenant_id, payment_id, "refund-1", 500, Some(request.clone())).await;
    // Sent a minute ago, well inside the key window.
    lose_answer(&pool, tenant_id, refund_id, 60).await;
    let provider = MockServer::start().await;
    // The provider holds no refund under the key, inside the key window: the poller resends.
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param("idempotency_key", refund_id.downstream_key().as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [], "has_more": false})))
        .mount(&provider)
        .await;
    let poller = RefundPoller::new(pool.clone(), fixtures::provider(&provider.uri()), poller_config(5));

    let counts = poller.run_once().await.unwrap();

    assert_eq!(counts.resent, 1, "{counts:?}");
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Pending);
    let lookup = &provider.received_requests().await.unwrap()[0];
    let (lookup_trace, lookup_span) = ids(lookup.headers.get("traceparent").expect("a traceparent").to_str().unwrap());
    assert_eq!(lookup_trace, TRACE_ID, "the lookup is in the trace of the request that asked for the refund");
    assert_ne!(lookup_span, WORKER_SPAN, "from a span of the poller's own");
    let queued: (Option<String>, Option<String>) =
        sqlx::query_as("SELECT traceparent, tracestate FROM refund_outbox WHERE refund_id = $1")
            .bind(refund_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(queued, (Some(request.traceparent), request.tracestate), "the resend continues the same trace");
}
