//! What every adapter that speaks to a provider over HTTP shares: the client with its timeouts
//! ([`client`]), the trace context every call carries ([`trace_headers`]), how a lookup's response
//! is read ([`read_json`]), and a response's `Retry-After` ([`retry_after`]).

use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};

use oncepay_domain::strict_json;
use oncepay_service::telemetry;

use crate::LookupError;

/// A client for a provider's API: TLS through rustls, and both timeouts on every call, so no call can
/// hang a worker.
pub(crate) fn client(connect_timeout_ms: u64, request_timeout_ms: u64) -> Result<reqwest::Client, reqwest::Error> {
    oncepay_service::tls::install_provider();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(connect_timeout_ms))
        .timeout(Duration::from_millis(request_timeout_ms))
        .build()
}

/// Sends a lookup and reads its JSON: anything but a 200 with a readable body is an error, never an
/// empty result. Read strictly: a body that names a member twice is unreadable, never last-wins.
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
) -> Result<T, LookupError> {
    let response = request.send().await.map_err(LookupError::Transport)?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(LookupError::Status(status));
    }
    let body = response.bytes().await.map_err(LookupError::Transport)?;
    strict_json::from_slice(&body).map_err(|e| LookupError::Unreadable(e.to_string()))
}

/// The current W3C trace context, as request headers.
pub(crate) fn trace_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in telemetry::current_trace_headers() {
        if let (Ok(name), Ok(value)) =
            (reqwest::header::HeaderName::from_bytes(name.as_bytes()), reqwest::header::HeaderValue::from_str(&value))
        {
            headers.insert(name, value);
        }
    }
    headers
}

/// A `Retry-After` in seconds, if the response carries one.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}
