//! HTTP routing: maps each request to its handler ([`protocol`] for `/v1`, [`control`] for `/_sim`,
//! [`ops`] for the operations endpoints) and renders JSON responses.
//!
//! Invariants: every response is JSON (`ErrorBody` for errors) except the plain-text ops endpoints;
//! bodies are read up to [`MAX_BODY_BYTES`]; a handler may ask for the connection to be dropped
//! without a response ([`Reply::DropConnection`]), which only the server can carry out. Nothing
//! here logs a credential, an idempotency key or a body.

pub mod control;
pub mod ops;
pub mod protocol;

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use metrics_exporter_prometheus::PrometheusHandle;
use secrecy::SecretString;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::faults::SharedFaults;
use crate::provider::{Provider, error_body};
use crate::webhooks::Destination;

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// What the handlers share.
pub struct App {
    /// The provider.
    pub provider: Arc<Provider>,
    /// The faults in force.
    pub faults: SharedFaults,
    /// Where webhooks go.
    pub destination: Destination,
    /// The Bearer credential `/v1` accepts.
    pub api_key: SecretString,
    /// The process's metrics.
    pub metrics: PrometheusHandle,
    /// Charge and refund requests run here, detached from their connection, so shutdown can wait
    /// for them.
    pub work: TaskTracker,
    /// Cancelled when the simulator shuts down.
    pub shutdown: CancellationToken,
}

/// A handler's outcome.
pub enum Reply {
    /// Send this response.
    Respond(Response<Full<Bytes>>),
    /// Close the connection without a word.
    DropConnection,
}

impl From<Response<Full<Bytes>>> for Reply {
    fn from(response: Response<Full<Bytes>>) -> Self {
        Self::Respond(response)
    }
}

impl From<Refusal> for Reply {
    fn from(refusal: Refusal) -> Self {
        Self::Respond(refusal.into_response())
    }
}

impl From<Result<Response<Full<Bytes>>, Refusal>> for Reply {
    fn from(result: Result<Response<Full<Bytes>>, Refusal>) -> Self {
        result.unwrap_or_else(Refusal::into_response).into()
    }
}

/// A request refused with an error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The status code.
    pub status: StatusCode,
    /// The stable error code.
    pub code: &'static str,
    /// For humans.
    pub message: String,
}

impl Refusal {
    /// A refusal.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }

    /// The `ErrorBody` response; a 401 also names the scheme it wants.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = error(self.status, self.code, &self.message);
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Routes one request.
pub async fn handle(app: Arc<App>, request: Request<Incoming>) -> Reply {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let span = tracing::debug_span!(
        "http.request",
        http.request.method = %method,
        url.path = %path,
        http.response.status_code = tracing::field::Empty,
    );
    async move {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let reply = match (segments.as_slice(), &method) {
            (["healthz"], &Method::GET) => ops::healthz().into(),
            (["readyz"], &Method::GET) => ops::readyz(&app).into(),
            (["metrics"], &Method::GET) => ops::metrics(&app).into(),
            (["v1", "charges"], &Method::POST) => protocol::create_charge(&app, request).await,
            (["v1", "charges"], &Method::GET) => protocol::list_charges(&app, &request).await.into(),
            (["v1", "charges", id], &Method::GET) => protocol::get_charge(&app, &request, id).await.into(),
            (["v1", "refunds"], &Method::POST) => protocol::create_refund(&app, request).await,
            (["v1", "refunds"], &Method::GET) => protocol::list_refunds(&app, &request).await.into(),
            (["v1", "refunds", id], &Method::GET) => protocol::get_refund(&app, &request, id).await.into(),
            (["_sim", "charges"], &Method::GET) => control::ground_truth(&app).into(),
            (["_sim", "refunds"], &Method::GET) => control::refund_truth(&app).into(),
            (["_sim", "charges"], &Method::POST) => control::plant_charge(&app, request).await.into(),
            (["_sim", "faults"], &Method::GET) => control::faults(&app).into(),
            (["_sim", "faults"], &Method::POST) => control::change_faults(&app, request).await.into(),
            (["_sim", "keys", "expire"], &Method::POST) => control::expire_keys(&app).into(),
            (["_sim", "webhook"], &Method::GET) => control::webhook_target(&app).into(),
            (["_sim", "webhook"], &Method::POST) => control::change_webhook_target(&app, request).await.into(),
            (
                ["healthz" | "readyz" | "metrics"]
                | ["v1", "charges" | "refunds"]
                | ["v1", "charges" | "refunds", _]
                | ["_sim", "charges" | "refunds" | "faults" | "webhook"]
                | ["_sim", "keys", "expire"],
                _,
            ) => error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "This method is not allowed here.").into(),
            _ => error(StatusCode::NOT_FOUND, "not_found", "Nothing here.").into(),
        };
        match &reply {
            Reply::Respond(response) => {
                tracing::Span::current().record("http.response.status_code", response.status().as_u16());
            }
            Reply::DropConnection => tracing::debug!("dropping the connection without a response"),
        }
        tracing::debug!("request handled");
        reply
    }
    .instrument(span)
    .await
}

/// A JSON response.
pub fn json(status: StatusCode, value: &impl Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(body) => raw_json(status, body.into()),
        Err(cause) => {
            tracing::error!(error = %cause, "cannot encode a response");
            raw_json(StatusCode::INTERNAL_SERVER_ERROR, Bytes::from_static(b"{}"))
        }
    }
}

/// A response whose body is already JSON.
pub fn raw_json(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The protocol's error response.
pub fn error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    json(status, &error_body(code, message, None))
}

/// Reads a JSON body of at most [`MAX_BODY_BYTES`].
pub async fn read_json<T: DeserializeOwned>(request: Request<Incoming>) -> Result<T, Refusal> {
    let body = match Limited::new(request.into_body(), MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(cause) if cause.is::<http_body_util::LengthLimitError>() => {
            return Err(Refusal::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "The body is over 64 KiB."));
        }
        Err(_) => return Err(Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", "The body could not be read.")),
    };
    serde_json::from_slice(&body).map_err(|cause| {
        // serde's message names the field and what was wrong with it.
        Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", format!("The body is not valid: {cause}"))
    })
}
