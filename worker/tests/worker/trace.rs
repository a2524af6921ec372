//! Trace continuity: the provider call of a payment carries the trace of the request that created
//! it, read back from its outbox row.

use oncepay_service::config::{LogFormat, TelemetrySettings};
use oncepay_service::telemetry::{self, TraceContext};
use sqlx::PgPool;
use wiremock::MockServer;

use crate::support::{self, Charges, accept_traced, config, drainer, tenant};

const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_provider_call_continues_the_trace_of_the_accepting_request(pool: PgPool) {
    let _telemetry = telemetry::init(
        "oncepay-worker-test",
        &TelemetrySettings { log_format: LogFormat::Text, log_filter: "info".into(), otlp_endpoint: None },
    )
    .unwrap();
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let api_span = TraceContext { traceparent: format!("00-{TRACE_ID}-b7ad6b7169203331-01"), tracestate: None };
    let accepted = accept_traced(&pool, tenant(&pool).await, 100, Some(&api_span)).await;

    drainer(&pool, &server.uri(), config("w1")).run_once().await.unwrap();

    let requests = support::requests_for(&server, accepted).await;
    let traceparent = requests[0].headers.get("traceparent").expect("a traceparent header").to_str().unwrap();
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts[1], TRACE_ID, "the same trace: {traceparent}");
    assert_ne!(parts[2], "b7ad6b7169203331", "a span of the worker's own: {traceparent}");
}
