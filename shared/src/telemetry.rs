//! Logs and traces: the `tracing` subscriber every binary installs, and W3C trace-context
//! propagation across processes.
//!
//! Every binary logs through `tracing` (JSON lines in production, readable text locally) and has an
//! OpenTelemetry tracer behind its spans, so each span has a real trace id that can be written into
//! an outbox row, sent as `traceparent` to the provider, and continued by another process. Spans are
//! exported over OTLP/HTTP only when an endpoint is configured; otherwise nothing leaves the process.
//! Nothing here ever records an API key, a secret, an idempotency key or a request body: callers
//! choose their span fields, and use `skip_all`.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::{Context, global};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{LogFormat, TelemetrySettings};

/// Keeps the tracer alive; dropping it flushes spans still buffered for export.
#[must_use = "dropping the guard shuts tracing down"]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("flushing traces failed: {error}");
        }
    }
}

/// Installs the global subscriber and tracer for `service` (e.g. `oncepay-api`).
pub fn init(service: &'static str, settings: &TelemetrySettings) -> anyhow::Result<TelemetryGuard> {
    crate::tls::install_provider();
    let resource = Resource::builder().with_service_name(service).build();
    let mut builder = SdkTracerProvider::builder().with_resource(resource);
    // An empty value (e.g. `OTLP_ENDPOINT=` in a compose file) means "no export", like an absent one.
    if let Some(endpoint) = settings.otlp_endpoint.as_deref().filter(|e| !e.trim().is_empty()) {
        let exporter =
            opentelemetry_otlp::SpanExporter::builder().with_http().with_endpoint(traces_url(endpoint)).build()?;
        builder = builder.with_batch_exporter(exporter);
    }
    let provider = builder.build();
    global::set_text_map_propagator(TraceContextPropagator::new());
    global::set_tracer_provider(provider.clone());

    // Spans feed traces and trace context (outbox rows, `traceparent`) whatever the log level, so
    // the log filter applies to the log layer only; the tracer sees every `info` span.
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer(service)).with_filter(LevelFilter::INFO);
    let log_filter = EnvFilter::try_new(&settings.log_filter)?;
    let registry = tracing_subscriber::registry().with(otel);
    match settings.log_format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_filter(log_filter),
            )
            .try_init()?,
        LogFormat::Text => {
            registry.with(tracing_subscriber::fmt::layer().compact().with_filter(log_filter)).try_init()?
        }
    }
    Ok(TelemetryGuard { provider })
}

fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") { base.to_owned() } else { format!("{base}/v1/traces") }
}

/// A W3C trace context, as carried in `traceparent` / `tracestate` headers and outbox rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `00-<trace id>-<span id>-<flags>`.
    pub traceparent: String,
    /// Vendor state, if any.
    pub tracestate: Option<String>,
}

/// The trace context of `span`, if it belongs to a valid trace.
pub fn trace_context_of(span: &Span) -> Option<TraceContext> {
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    let traceparent = carrier.remove("traceparent")?;
    let tracestate = carrier.remove("tracestate").filter(|s| !s.is_empty());
    Some(TraceContext { traceparent, tracestate })
}

/// The current span's trace context as HTTP headers (`traceparent`, `tracestate`).
pub fn current_trace_headers() -> Vec<(String, String)> {
    let mut carrier = HashMap::new();
    global::get_text_map_propagator(|propagator| propagator.inject_context(&Span::current().context(), &mut carrier));
    carrier.into_iter().collect()
}

/// Makes `span` a child of the remote span described by `context`; ignores a malformed one.
pub fn continue_trace(span: &Span, context: &TraceContext) {
    let mut carrier = HashMap::from([("traceparent".to_owned(), context.traceparent.clone())]);
    if let Some(state) = &context.tracestate {
        carrier.insert("tracestate".to_owned(), state.clone());
    }
    let parent: Context = TraceContextPropagator::new().extract(&carrier);
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// The current span's trace id in hex, for correlating a log line or an answer with a trace.
pub fn current_trace_id() -> Option<String> {
    let context = Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| span_context.trace_id().to_string())
}
