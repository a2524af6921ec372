//! The span of each request, and the per-route latency histogram.
//!
//! Every request runs inside one `http.request` span carrying its method, route pattern, final
//! status and duration, plus the tenant, payment, refund and webhook endpoint ids once a handler
//! knows them ([`of`]).
//!
//! Invariants: the span never records a header value other than the trace context, never an API
//! key, an idempotency key or a body; metric labels are the route *pattern* (never a path with an
//! id in it) and a known method, so their cardinality is fixed.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::http::header::HeaderMap;
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpRequest};
use oncepay_service::telemetry::{self, TraceContext};
use tracing::field::Empty;
use tracing::{Instrument, Span};

/// The request's span, kept in the request's extensions for handlers.
#[derive(Clone)]
struct RequestSpan(Span);

/// The span of the request being served (a disabled span outside the middleware, e.g. in unit tests).
pub fn of(request: &HttpRequest) -> Span {
    request.extensions().get::<RequestSpan>().map_or_else(Span::none, |span| span.0.clone())
}

/// Middleware: runs the rest of the app inside the request's span and records its outcome.
pub async fn trace_request(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody + 'static>, actix_web::Error> {
    let method = method_label(request.method());
    let span = tracing::info_span!(
        "http.request",
        otel.kind = "server",
        http.method = method,
        http.route = Empty,
        http.status = Empty,
        duration_ms = Empty,
        tenant.id = Empty,
        payment.id = Empty,
        refund.id = Empty,
        endpoint.id = Empty,
    );
    // The caller's trace becomes the span's parent, so intake's outbox row, written with this
    // span's context, joins that trace.
    if let Some(parent) = incoming_trace(request.headers()) {
        telemetry::continue_trace(&span, &parent);
    }
    request.extensions_mut().insert(RequestSpan(span.clone()));

    let started = Instant::now();
    let result = next.call(request).instrument(span.clone()).await;
    let elapsed = started.elapsed();

    let (status, route) = match &result {
        Ok(response) => (response.status(), response.request().match_pattern()),
        Err(error) => (error.as_response_error().status_code(), None),
    };
    let route = route.unwrap_or_else(|| "unmatched".to_owned());
    span.record("http.route", route.as_str());
    span.record("http.status", status.as_u16());
    span.record("duration_ms", u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
    metrics::histogram!(crate::metrics::REQUEST_DURATION, "route" => route, "method" => method)
        .record(elapsed.as_secs_f64());
    tracing::debug!(parent: &span, "request served");
    result
}

/// The caller's W3C trace context (`traceparent`, `tracestate`), if it sent one.
fn incoming_trace(headers: &HeaderMap) -> Option<TraceContext> {
    let traceparent = headers.get("traceparent")?.to_str().ok()?;
    Some(TraceContext::received(traceparent, headers.get("tracestate").and_then(|v| v.to_str().ok())))
}

/// A method as a label: one of the standard ones, else `other`.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;

    #[test]
    fn the_trace_context_is_read_from_traceparent_and_tracestate() {
        let mut headers = HeaderMap::new();
        assert_eq!(incoming_trace(&headers), None);

        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        headers.insert(HeaderName::from_static("traceparent"), HeaderValue::from_static(traceparent));
        headers.insert(HeaderName::from_static("tracestate"), HeaderValue::from_static("vendor=1"));

        assert_eq!(
            incoming_trace(&headers),
            Some(TraceContext { traceparent: traceparent.into(), tracestate: Some("vendor=1".into()) })
        );
    }

    #[test]
    fn unusual_methods_share_one_label() {
        assert_eq!(method_label(&Method::POST), "POST");
        assert_eq!(method_label(&Method::from_bytes(b"BREW").unwrap()), "other");
    }
}
