//! Logs and traces: the `tracing` subscriber every binary installs, and W3C trace-context
//! propagation between processes.
//!
//! Every span belongs to an OpenTelemetry trace, exported or not, so its context can go into an
//! outbox row or a `traceparent` header and be continued by another process.
//!
//! Nothing here records an API key, a secret, an idempotency key or a request body: callers choose
//! their span fields and use `skip_all`. Span fields and events go both to the exported trace (events
//! as span events) and to the logs, so that one rule covers both.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TraceFlags, TracerProvider as _};
use opentelemetry::{Context, global};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::dispatcher::WeakDispatch;
use tracing::span::Record;
use tracing::{Dispatch, Event, Span, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::{Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
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
    // Spans are exported over OTLP/HTTP only when an endpoint is configured; otherwise nothing leaves
    // the process. An empty value (e.g. `OTLP_ENDPOINT=` in a compose file) counts as none.
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
    //
    // A span carries the fields oncepay names, its target and its trace context, and nothing the layer
    // would add by default: no source location and no thread (allocated attributes on every span), no
    // busy and idle times (two clock reads on every poll of an instrumented future), and no
    // OpenTelemetry context made current on entry (nothing here reads `Context::current`; a span's
    // context is asked of its `tracing` span, `OpenTelemetrySpanExt::context`).
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(service))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
        .with_filter(LevelFilter::INFO);
    let log_filter = EnvFilter::try_new(&settings.log_filter)?;
    let dispatch = DispatchCell::default();
    let registry = tracing_subscriber::registry().with(otel).with(dispatch.clone());
    match settings.log_format {
        LogFormat::Json => {
            let json = tracing_subscriber::fmt::format().json().flatten_event(true).with_current_span(false);
            registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .fmt_fields(AppendingJsonFields)
                        .event_format(JsonWithTraceIds { json, dispatch })
                        .with_filter(log_filter),
                )
                .try_init()?;
        }
        LogFormat::Text => {
            registry.with(tracing_subscriber::fmt::layer().compact().with_filter(log_filter)).try_init()?
        }
    }
    Ok(TelemetryGuard { provider })
}

/// Span fields as a JSON object, as `tracing_subscriber`'s `JsonFields` writes them, except that a
/// field recorded later is appended to the object instead of the whole object being parsed and
/// written again.
///
/// The api's request span records several fields after it is created (route, status, duration,
/// tenant, payment), and parsing and rewriting the object for each cost noticeable CPU on every
/// request, even when no line is logged in the span (see BENCHMARKS.md). A field recorded twice
/// appears twice in the object; JSON readers keep the later value.
struct AppendingJsonFields;

impl<'writer> FormatFields<'writer> for AppendingJsonFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> std::fmt::Result {
        JsonFields::new().format_fields(writer, fields)
    }

    fn add_fields(&self, current: &'writer mut FormattedFields<Self>, fields: &Record<'_>) -> std::fmt::Result {
        let mut added = String::new();
        JsonFields::new().format_fields(Writer::new(&mut added), fields)?;
        let Some(added) = added.strip_prefix('{').and_then(|rest| rest.strip_suffix('}')) else {
            return Err(std::fmt::Error);
        };
        if added.is_empty() {
            return Ok(());
        }
        match current.fields.strip_suffix('}') {
            Some("{") => current.fields.truncate(1),
            Some(object) => {
                let length = object.len();
                current.fields.truncate(length);
                current.fields.push(',');
            }
            None => current.fields.push('{'),
        }
        current.fields.push_str(added);
        current.fields.push('}');
        Ok(())
    }
}

/// Remembers the dispatcher the subscriber is registered with, so the log formatter can ask the
/// OpenTelemetry layer for a span's ids (a formatter runs inside the dispatcher and cannot look it up).
#[derive(Clone, Default)]
struct DispatchCell(Arc<OnceLock<WeakDispatch>>);

impl<S: Subscriber> Layer<S> for DispatchCell {
    fn on_register_dispatch(&self, dispatch: &Dispatch) {
        let _ = self.0.set(dispatch.downgrade());
    }
}

/// JSON lines, each with the `trace_id` and `span_id` of the span it was logged in (if traced), so a
/// log line leads to its trace and a trace to its log lines.
struct JsonWithTraceIds {
    json: Format<Json>,
    dispatch: DispatchCell,
}

impl JsonWithTraceIds {
    /// The OpenTelemetry ids of the innermost span around `ctx`'s event.
    fn ids<S, N>(&self, ctx: &FmtContext<'_, S, N>) -> Option<(String, String)>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'w> FormatFields<'w> + 'static,
    {
        let dispatch = self.dispatch.0.get()?.upgrade()?;
        let id = ctx.event_scope()?.next()?.id();
        let context = tracing_opentelemetry::get_otel_context(&id, &dispatch)?;
        let span = context.span();
        let span_context = span.span_context();
        span_context.is_valid().then(|| (span_context.trace_id().to_string(), span_context.span_id().to_string()))
    }
}

impl<S, N> FormatEvent<S, N> for JsonWithTraceIds
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> std::fmt::Result {
        let mut line = String::new();
        self.json.format_event(ctx, Writer::new(&mut line), event)?;
        // The line is one JSON object: the ids go in before its closing brace.
        match (self.ids(ctx), line.trim_end().strip_suffix('}')) {
            (Some((trace_id, span_id)), Some(object)) => {
                writeln!(writer, r#"{object},"trace_id":"{trace_id}","span_id":"{span_id}"}}"#)
            }
            _ => writer.write_str(&line),
        }
    }
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

impl TraceContext {
    /// The context a caller sent in its `traceparent` and `tracestate` headers (an HTTP request's or
    /// a broker message's): trimmed, and an empty `tracestate` is none.
    pub fn received(traceparent: &str, tracestate: Option<&str>) -> Self {
        let tracestate = tracestate.map(str::trim).filter(|state| !state.is_empty()).map(str::to_owned);
        Self { traceparent: traceparent.trim().to_owned(), tracestate }
    }
}

/// The trace context of `span`, if it belongs to a valid trace: what the W3C propagator would write
/// (version 00, only the sampled flag). Formatted here rather than by the propagator, since the api
/// asks for it on every request that reaches the store.
pub fn trace_context_of(span: &Span) -> Option<TraceContext> {
    let context = span.context();
    let span = context.span();
    let span_context = span.span_context();
    if !span_context.is_valid() {
        return None;
    }
    let flags = (span_context.trace_flags() & TraceFlags::SAMPLED).to_u8();
    let traceparent = format!("00-{}-{}-{flags:02x}", span_context.trace_id(), span_context.span_id());
    let tracestate = Some(span_context.trace_state().header()).filter(|state| !state.is_empty());
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

/// Links `span` to `linked`'s span, e.g. the delivery that caused work done in another trace, so a
/// trace viewer can jump from one to the other. Nothing happens if `linked` has no valid context.
pub fn link(span: &Span, linked: &Span) {
    span.add_link(linked.context().span().span_context().clone());
}

/// The current span's trace id in hex, to match a log line or a response with its trace.
pub fn current_trace_id() -> Option<String> {
    let context = Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| span_context.trace_id().to_string())
}

/// An error and its sources joined by `: `, for one log field (`error = %error_chain(&e)`), so a log
/// line carries the whole cause without a multi-line dump.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    chain
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;

    use tracing::field::Empty;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Log lines written to memory.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_spans_trace_context_is_written_as_the_w3c_propagator_writes_it() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));

        tracing::subscriber::with_default(subscriber, || {
            let parent = tracing::info_span!("parent");
            let remote = TraceContext {
                traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
                tracestate: Some("vendor=1,other=2".into()),
            };
            continue_trace(&parent, &remote);
            let child = parent.in_scope(|| tracing::info_span!("child"));
            for span in [&parent, &child, &tracing::info_span!("root")] {
                let mut carrier = HashMap::new();
                TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);

                let ours = trace_context_of(span).unwrap();

                assert_eq!(Some(&ours.traceparent), carrier.get("traceparent"));
                assert_eq!(ours.tracestate.as_ref(), carrier.get("tracestate").filter(|s| !s.is_empty()));
            }
            let child = trace_context_of(&child).unwrap();
            assert!(child.traceparent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{child:?}");
            assert_eq!(child.tracestate.as_deref(), Some("vendor=1,other=2"));
        });
        assert_eq!(trace_context_of(&Span::none()), None);
    }

    #[test]
    fn fields_recorded_after_a_span_starts_appear_in_its_log_lines_as_json() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(AppendingJsonFields)
                .event_format(tracing_subscriber::fmt::format().json().flatten_event(true).with_current_span(false))
                .with_writer(move || writer.clone()),
        );

        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("outer", late = Empty);
            outer.record("late", "only");
            let _outer = outer.enter();
            let span = tracing::info_span!("request", method = "POST", route = Empty, status = Empty, note = Empty);
            span.record("route", "/v1/payments");
            span.record("status", 202);
            span.record("note", "say \"hi\", {ok}");
            span.record("status", 200);
            let _inner = span.enter();
            tracing::info!(status = 42, "served");
        });

        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let spans = line["spans"].as_array().unwrap();
        assert_eq!(spans[0]["late"], "only", "{line}");
        let request = &spans[1];
        assert_eq!(request["method"], "POST", "{line}");
        assert_eq!(request["route"], "/v1/payments");
        assert_eq!(request["note"], "say \"hi\", {ok}");
        assert_eq!(request["status"], 200, "the later value of a field recorded twice");
        assert_eq!(line["status"], 42);
    }
}
