//! The merchants' receiver in a chaos run: one HTTP server on 127.0.0.1, inside the harness's
//! process, for every endpoint the run subscribes, each at a path of its own
//! (`/endpoints/<name>`).
//!
//! It verifies each delivery's signature against its endpoint's secret, logs every verified request
//! in the order it arrived, and responds as the endpoint's [`Plan`] draws: 2xx, 500, 429 with
//! `Retry-After: 1`, a response that comes after the worker's timeout, no response at all, the
//! connection dropped once the body is read, or 410. The draws come from the run's seed; which
//! request gets which draw depends on the order requests arrive in. A request it cannot verify is
//! refused with 400 and kept as evidence. It records; it judges nothing (`events.rs` does).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use oncepay_webhook_signature::{self as signature, SignedHeaders, WebhookSecret};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};
use uuid::Uuid;

/// Where every endpoint's path starts.
const PATH_PREFIX: &str = "/endpoints/";

/// How long a hung request is held before its connection is closed, if the worker has not closed it
/// first: far past any timeout the run gives the worker.
const HANG_LIMIT: Duration = Duration::from_secs(30);

/// How the receiver responds to one verified request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Behaviour {
    /// 204: the delivery is taken.
    Accept,
    /// 500.
    ServerError,
    /// 429 with `Retry-After: 1`.
    RateLimited,
    /// 200, but only after the worker's timeout has passed.
    TooLate,
    /// No response; the connection stays open until the worker gives up.
    Hang,
    /// The body is read, then the connection is closed without a response.
    DropConnection,
    /// 410: the endpoint is gone, and the worker must disable it.
    Gone,
}

impl Behaviour {
    /// Every behaviour, in declaration order.
    pub const ALL: [Self; 7] = [
        Self::Accept,
        Self::ServerError,
        Self::RateLimited,
        Self::TooLate,
        Self::Hang,
        Self::DropConnection,
        Self::Gone,
    ];

    /// Whether the receiver responded 2xx, in time or not: only then may the worker record the
    /// delivery as delivered (a worker paused through its timeout may still read a late 2xx).
    pub const fn is_2xx(self) -> bool {
        matches!(self, Self::Accept | Self::TooLate)
    }
}

impl fmt::Display for Behaviour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Accept => "204",
            Self::ServerError => "500",
            Self::RateLimited => "429 with Retry-After: 1",
            Self::TooLate => "200 after the worker's timeout",
            Self::Hang => "no response",
            Self::DropConnection => "connection dropped after the body",
            Self::Gone => "410",
        })
    }
}

/// How one endpoint behaves: each request draws from `mix` by weight, and from its `gone_after`-th
/// request on, every request gets 410.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Behaviours and their weights.
    pub mix: Vec<(Behaviour, u32)>,
    /// How many requests are drawn from the mix before the endpoint is gone for good.
    pub gone_after: Option<usize>,
}

impl Plan {
    fn draw(&self, requests_before: usize, rng: &mut StdRng) -> Behaviour {
        if self.gone_after.is_some_and(|after| requests_before >= after) {
            return Behaviour::Gone;
        }
        let total: u32 = self.mix.iter().map(|(_, weight)| weight).sum();
        let mut roll = rng.random_range(0..total.max(1));
        for (behaviour, weight) in &self.mix {
            if roll < *weight {
                return *behaviour;
            }
            roll -= weight;
        }
        Behaviour::Accept
    }
}

/// One verified request, as it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// The endpoint's name (its path).
    pub endpoint: String,
    /// `webhook-id`: the event's id.
    pub webhook_id: Uuid,
    /// The body's `type`.
    pub event_type: String,
    /// The payment it is about (`data.id` of a payment's event, `data.payment_id` of a refund's).
    pub payment_id: Option<Uuid>,
    /// The refund it is about (`data.id` of a refund's event).
    pub refund_id: Option<Uuid>,
    /// `data.sequence`.
    pub sequence: Option<i64>,
    /// How the receiver responded.
    pub behaviour: Behaviour,
}

/// A request the receiver refused with 400: it could not verify it, or could not read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The path it was sent to.
    pub path: String,
    /// Why it was refused.
    pub reason: String,
}

/// An endpoint the receiver serves.
struct Endpoint {
    secret: WebhookSecret,
    plan: Plan,
    rng: StdRng,
    requests: usize,
}

#[derive(Default)]
struct State {
    endpoints: BTreeMap<String, Endpoint>,
    log: Vec<Logged>,
    refused: Vec<Refused>,
}

type Shared = Arc<Mutex<State>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The running receiver; dropping it stops the server and closes every connection.
pub struct Receiver {
    base_url: String,
    seed: u64,
    state: Shared,
    server: JoinHandle<()>,
}

impl Receiver {
    /// Starts the server on a free port of 127.0.0.1. `too_late` is how long a [`Behaviour::TooLate`]
    /// response waits: longer than the worker's timeout.
    pub async fn start(seed: u64, too_late: Duration) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("cannot bind the receiver's port")?;
        let base_url = format!("http://{}", listener.local_addr()?);
        let state = Shared::default();
        let server = tokio::spawn(serve(listener, state.clone(), too_late));
        Ok(Self { base_url, seed, state, server })
    }

    /// The URL of the endpoint called `name`.
    pub fn url(&self, name: &str) -> String {
        format!("{}{PATH_PREFIX}{name}", self.base_url)
    }

    /// Serves endpoint `name` from now on: its deliveries are verified with `secret`, and responded to
    /// as `plan` draws.
    pub fn register(&self, name: &str, secret: &str, plan: Plan) -> anyhow::Result<()> {
        let secret =
            WebhookSecret::parse(secret).map_err(|_| anyhow::anyhow!("the secret of {name} is not whsec_…"))?;
        let mut state = lock(&self.state);
        let rng = StdRng::seed_from_u64(self.seed ^ 0x0EC3_1FE5 ^ state.endpoints.len() as u64);
        state.endpoints.insert(name.to_owned(), Endpoint { secret, plan, rng, requests: 0 });
        Ok(())
    }

    /// Endpoint `name` responds as `plan` draws from now on.
    pub fn set_plan(&self, name: &str, plan: Plan) -> anyhow::Result<()> {
        let mut state = lock(&self.state);
        let endpoint = state.endpoints.get_mut(name).with_context(|| format!("no endpoint {name} is served"))?;
        endpoint.plan = plan;
        Ok(())
    }

    /// Every verified request so far, in the order they arrived.
    pub fn log(&self) -> Vec<Logged> {
        lock(&self.state).log.clone()
    }

    /// Every refused request so far.
    pub fn refused(&self) -> Vec<Refused> {
        lock(&self.state).refused.clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // The connections are tasks of the server's own: they go with it.
        self.server.abort();
    }
}

async fn serve(listener: TcpListener, state: Shared, too_late: Duration) {
    let mut connections = JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                connections.spawn(serve_connection(stream, state.clone(), too_late));
            }
            // Usually out of file descriptors: back off a little instead of spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
        while connections.try_join_next().is_some() {}
    }
}

/// Serves one connection. To drop it without a response, the handler notifies `dropped` and never
/// returns; this task then stops polling the connection, which closes the socket.
async fn serve_connection(stream: TcpStream, state: Shared, too_late: Duration) {
    let dropped = Arc::new(Notify::new());
    let service = {
        let dropped = dropped.clone();
        service_fn(move |request| {
            let (state, dropped) = (state.clone(), dropped.clone());
            async move {
                match respond(&state, request, too_late).await {
                    Some(response) => Ok::<_, Infallible>(response),
                    None => {
                        dropped.notify_one();
                        std::future::pending().await
                    }
                }
            }
        })
    };
    let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        // A worker that gives up (its timeout) ends its connection: not an error here.
        _ = connection => {}
        () = dropped.notified() => {}
    }
}

/// The response to one request, `None` to drop the connection without one.
async fn respond(state: &Shared, request: Request<Incoming>, too_late: Duration) -> Option<Response<Full<Bytes>>> {
    let path = request.uri().path().to_owned();
    let headers = request.headers().clone();
    // A body that breaks off: the worker gave up while sending it.
    let body = request.into_body().collect().await.ok()?.to_bytes();
    // Bound first: a guard in the scrutinee would be held through the arms.
    let taken = lock(state).take(&path, &headers, &body);
    let behaviour = match taken {
        Ok(behaviour) => behaviour,
        Err(reason) => {
            lock(state).refused.push(Refused { path, reason: reason.clone() });
            return Some(status(StatusCode::BAD_REQUEST, reason));
        }
    };
    match behaviour {
        Behaviour::Accept => Some(status(StatusCode::NO_CONTENT, String::new())),
        Behaviour::ServerError => Some(status(StatusCode::INTERNAL_SERVER_ERROR, "chaos: a server error".to_owned())),
        Behaviour::RateLimited => {
            let mut response = status(StatusCode::TOO_MANY_REQUESTS, "chaos: slow down".to_owned());
            response.headers_mut().insert(RETRY_AFTER, hyper::header::HeaderValue::from_static("1"));
            Some(response)
        }
        Behaviour::TooLate => {
            tokio::time::sleep(too_late).await;
            Some(status(StatusCode::OK, "chaos: taken, but late".to_owned()))
        }
        Behaviour::Hang => {
            tokio::time::sleep(HANG_LIMIT).await;
            None
        }
        Behaviour::DropConnection => None,
        Behaviour::Gone => Some(status(StatusCode::GONE, "chaos: this endpoint is gone".to_owned())),
    }
}

fn status(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response
}

impl State {
    /// Verifies a request to `path`, logs it and draws the endpoint's behaviour; why it is refused
    /// otherwise.
    fn take(&mut self, path: &str, headers: &HeaderMap, body: &[u8]) -> Result<Behaviour, String> {
        let name = path.strip_prefix(PATH_PREFIX).unwrap_or_default();
        let endpoint = self.endpoints.get_mut(name).ok_or_else(|| format!("no endpoint is served at {path}"))?;
        let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
        let signed = SignedHeaders {
            id: header("webhook-id"),
            timestamp: header("webhook-timestamp"),
            signature: header("webhook-signature"),
        };
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        signature::verify(std::slice::from_ref(&endpoint.secret), signed, body, now, signature::DEFAULT_TOLERANCE_SECS)
            .map_err(|error| format!("{error}"))?;
        let webhook_id = signed
            .id
            .and_then(|id| Uuid::parse_str(id).ok())
            .ok_or_else(|| format!("the webhook-id {:?} is not an event id", signed.id))?;
        let event: Value = serde_json::from_slice(body).map_err(|error| format!("the body is not JSON: {error}"))?;
        let event_type = event["type"].as_str().ok_or("the body has no type")?.to_owned();
        let data = &event["data"];
        let id = || data["id"].as_str().and_then(|id| Uuid::parse_str(id).ok());
        let (payment_id, refund_id) = if event_type.starts_with("refund.") {
            (data["payment_id"].as_str().and_then(|id| Uuid::parse_str(id).ok()), id())
        } else if event_type.starts_with("payment.") {
            (id(), None)
        } else {
            (None, None)
        };
        let behaviour = endpoint.plan.draw(endpoint.requests, &mut endpoint.rng);
        endpoint.requests += 1;
        self.log.push(Logged {
            endpoint: name.to_owned(),
            webhook_id,
            event_type,
            payment_id,
            refund_id,
            sequence: data["sequence"].as_i64(),
            behaviour,
        });
        Ok(behaviour)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(secret: &str, id: &str, body: &[u8]) -> HeaderMap {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let signature = WebhookSecret::parse(secret).unwrap().sign(id, now, body);
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", id.parse().unwrap());
        headers.insert("webhook-timestamp", now.to_string().parse().unwrap());
        headers.insert("webhook-signature", signature.parse().unwrap());
        headers
    }

    fn state(secret: &str, plan: Plan) -> State {
        let endpoint = Endpoint {
            secret: WebhookSecret::parse(secret).unwrap(),
            plan,
            rng: StdRng::seed_from_u64(1),
            requests: 0,
        };
        State { endpoints: BTreeMap::from([("main-0".to_owned(), endpoint)]), ..State::default() }
    }

    #[test]
    fn a_verified_request_is_logged_with_its_subject_and_a_forged_one_is_refused() {
        let secret = WebhookSecret::generate();
        let always = Plan { mix: vec![(Behaviour::ServerError, 1)], gone_after: None };
        let mut state = state(&secret, always);
        let (id, payment, refund) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let body = serde_json::json!({"type": "refund.succeeded", "timestamp": "2026-01-01T00:00:00Z",
            "data": {"id": refund, "payment_id": payment, "status": "succeeded", "sequence": 3}})
        .to_string();
        let headers = signed(&secret, &id.to_string(), body.as_bytes());
        let forged = signed(&WebhookSecret::generate(), &id.to_string(), body.as_bytes());

        let taken = state.take("/endpoints/main-0", &headers, body.as_bytes());
        let refused = state.take("/endpoints/main-0", &forged, body.as_bytes());
        let elsewhere = state.take("/endpoints/main-9", &headers, body.as_bytes());

        assert_eq!(taken, Ok(Behaviour::ServerError));
        assert!(refused.is_err() && elsewhere.is_err());
        assert_eq!(
            state.log,
            [Logged {
                endpoint: "main-0".to_owned(),
                webhook_id: id,
                event_type: "refund.succeeded".to_owned(),
                payment_id: Some(payment),
                refund_id: Some(refund),
                sequence: Some(3),
                behaviour: Behaviour::ServerError,
            }]
        );
    }

    #[test]
    fn an_endpoint_is_gone_for_good_after_its_first_requests() {
        let plan = Plan { mix: vec![(Behaviour::Accept, 1)], gone_after: Some(2) };
        let mut rng = StdRng::seed_from_u64(7);

        let drawn: Vec<Behaviour> = (0..4).map(|n| plan.draw(n, &mut rng)).collect();

        assert_eq!(drawn, [Behaviour::Accept, Behaviour::Accept, Behaviour::Gone, Behaviour::Gone]);
    }
}
