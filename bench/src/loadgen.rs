//! The HTTP load generator: N keep-alive HTTP/1.1 connections to the api over loopback, each
//! sending its next request as soon as it has read the previous answer (a closed loop), until just
//! after the end of the measured window. Requests answered inside the window count, with their latencies;
//! the warm-up before it only warms.
//!
//! It runs on one thread of its own (a current-thread tokio runtime), so on this 2-core machine it
//! can take at most one core from the api and PostgreSQL, and that thread's CPU time is measured on
//! its own (`cpu::ClientSource::Thread`). Requests are cheap to build: the body and the constant
//! headers are made once and shared; only the idempotency key is new per request. Nothing here
//! talks to PostgreSQL.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cpu;
use crate::dataset;
use crate::latency::Latencies;

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// How long a request may stay unanswered after the window before the connection gives up on it.
const STRAGGLER_GRACE: Duration = Duration::from_secs(5);

/// The load goes on this long after the window closes, so the machine is still under the same load
/// (and this thread still alive) when the window's closing CPU sample is taken.
const TAIL: Duration = Duration::from_millis(300);

/// What the requests do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// `POST /v1/payments` with a fresh key each time: expects 202.
    Accept,
    /// `POST /v1/payments` with one of the `stored_keys` keys of settled payments (same body):
    /// expects the stored 200 with `Idempotent-Replayed: true`.
    Replay {
        /// How many stored keys there are (`dataset::replay_key(0..stored_keys)`).
        stored_keys: u64,
    },
}

/// One load run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The api processes; connection `i` goes to `targets[i % len]`.
    pub targets: Vec<SocketAddr>,
    /// Concurrent connections.
    pub connections: usize,
    /// The tenant's API key.
    pub token: String,
    /// What to send.
    pub workload: Workload,
    /// Answers from here on count.
    pub measure_from: Instant,
    /// The window ends here; the load a moment later.
    pub measure_until: Instant,
}

/// What a load run measured inside its window.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Requests answered as expected.
    pub completed: u64,
    /// Their latencies, send to last byte of the answer.
    pub latencies: Latencies,
    /// Everything else, by kind (`status 503`, `transport`, `timeout`).
    pub unexpected: BTreeMap<String, u64>,
    /// The first such problem, described, for the log.
    pub first_problem: Option<String>,
}

impl Outcome {
    fn problem(&mut self, kind: String, detail: impl std::fmt::Display) {
        if self.first_problem.is_none() {
            self.first_problem = Some(format!("{kind}: {detail}"));
        }
        *self.unexpected.entry(kind).or_default() += 1;
    }

    fn merge(&mut self, other: Outcome) {
        self.completed += other.completed;
        self.latencies.merge(other.latencies);
        for (kind, count) in other.unexpected {
            *self.unexpected.entry(kind).or_default() += count;
        }
        if self.first_problem.is_none() {
            self.first_problem = other.first_problem;
        }
    }

    /// Requests that did not end as expected.
    pub fn errors(&self) -> u64 {
        self.unexpected.values().sum()
    }
}

/// The generator's thread, running a plan.
pub struct Generator {
    thread: std::thread::JoinHandle<anyhow::Result<Outcome>>,
    thread_id: i32,
}

impl Generator {
    /// Starts the generator's thread; the load begins at once.
    pub fn start(plan: Plan) -> anyhow::Result<Self> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("load-generator".into())
            .spawn(move || {
                let _ = sender.send(cpu::current_thread_id());
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                runtime.block_on(run(plan))
            })
            .context("cannot start the load generator's thread")?;
        let thread_id = receiver.recv().context("the load generator's thread died at start")?;
        Ok(Self { thread, thread_id })
    }

    /// The thread's id, for CPU accounting.
    pub fn thread_id(&self) -> i32 {
        self.thread_id
    }

    /// Waits for the end of the run.
    pub async fn finish(self) -> anyhow::Result<Outcome> {
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the load generator's thread panicked"))?
    }
}

/// What every request of a run shares.
struct Shared {
    plan: Plan,
    body: Bytes,
    authorization: HeaderValue,
    json: HeaderValue,
}

async fn run(plan: Plan) -> anyhow::Result<Outcome> {
    anyhow::ensure!(!plan.targets.is_empty() && plan.connections > 0, "nothing to load");
    let shared = Arc::new(Shared {
        body: Bytes::from_static(dataset::BODY.as_bytes()),
        authorization: HeaderValue::try_from(format!("Bearer {}", plan.token))?,
        json: HeaderValue::from_static("application/json"),
        plan,
    });
    let mut connections = JoinSet::new();
    for index in 0..shared.plan.connections {
        connections.spawn(connection(Arc::clone(&shared), index));
    }
    let mut outcome = Outcome::default();
    while let Some(finished) = connections.join_next().await {
        outcome.merge(finished?);
    }
    Ok(outcome)
}

/// One connection's closed loop; reconnects after a transport error.
async fn connection(shared: Arc<Shared>, index: usize) -> Outcome {
    let plan = &shared.plan;
    let target = plan.targets[index % plan.targets.len()];
    let host = HeaderValue::try_from(target.to_string()).unwrap_or_else(|_| HeaderValue::from_static("localhost"));
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    let mut outcome = Outcome::default();
    let stop = plan.measure_until + TAIL;
    while Instant::now() < stop {
        let mut sender = match connect(target).await {
            Ok(sender) => sender,
            Err(error) => {
                outcome.problem("connect".into(), format!("{error:#}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while Instant::now() < stop {
            let key = match plan.workload {
                Workload::Accept => rng.random_range(dataset::FRESH_KEYS).to_string(),
                Workload::Replay { stored_keys } => dataset::replay_key(rng.random_range(0..stored_keys.max(1))),
            };
            let request = Request::builder()
                .method(Method::POST)
                .uri(dataset::PATH)
                .header(HOST, host.clone())
                .header(AUTHORIZATION, shared.authorization.clone())
                .header(CONTENT_TYPE, shared.json.clone())
                .header(IDEMPOTENCY_KEY, key)
                .body(Full::new(shared.body.clone()));
            let Ok(request) = request else {
                outcome.problem("request".into(), "could not build a request");
                return outcome;
            };
            let sent = Instant::now();
            let answer = tokio::time::timeout_at(stop + STRAGGLER_GRACE, exchange(&mut sender, request));
            let (status, replayed) = match answer.await {
                Ok(Ok(answer)) => answer,
                Ok(Err(error)) => {
                    outcome.problem("transport".into(), format!("{error:#}"));
                    break;
                }
                Err(_) => {
                    outcome.problem("timeout".into(), "no answer long after the window");
                    return outcome;
                }
            };
            let done = Instant::now();
            if done < plan.measure_from || done >= plan.measure_until {
                continue;
            }
            let expected = match plan.workload {
                Workload::Accept => status == StatusCode::ACCEPTED,
                Workload::Replay { .. } => status == StatusCode::OK && replayed,
            };
            if expected {
                outcome.completed += 1;
                outcome.latencies.record(done - sent);
            } else {
                outcome.problem(
                    format!("status {}{}", status.as_u16(), if replayed { " (replayed)" } else { "" }),
                    target,
                );
            }
        }
    }
    outcome
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(target: SocketAddr) -> anyhow::Result<Sender> {
    let stream = TcpStream::connect(target).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        // Ends when the sender is dropped or the server closes; either way the loop notices.
        let _ = connection.await;
    });
    Ok(sender)
}

/// Sends one request and reads its whole answer (so the connection can carry the next one).
async fn exchange(sender: &mut Sender, request: Request<Full<Bytes>>) -> anyhow::Result<(StatusCode, bool)> {
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let replayed = response.headers().get(IDEMPOTENT_REPLAYED).is_some_and(|value| value == "true");
    response.into_body().collect().await?;
    Ok((status, replayed))
}
