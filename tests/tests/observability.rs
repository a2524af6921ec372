//! Observability across the real processes: one payment is one trace from the api's request through
//! the worker's provider call to the reconciler's resolution, and so is one refund; `/metrics` counts a scripted workload
//! exactly and the backlog gauges reflect the database; and no log line of any process ever shows an
//! API key, a secret, an idempotency key or a request body.
//!
//! Each test starts a throwaway PostgreSQL, the simulator, the api, a worker and a reconciler (the
//! binaries `cargo build --workspace --bins` makes) as the other cross-process suites do
//! (`oncepay_tests::system`), all exporting their spans to a receiver inside the test. The worker
//! and the reconciler reach the simulator through a recording proxy.

// Helpers outside `#[test]` functions fail loudly too: clippy's test exemption does not reach them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use oncepay_devkit::pg::Durability;
use oncepay_devkit::process::setting_variable;
use oncepay_devkit::wait::wait_until;
use oncepay_simulator::client::SimulatorClient;
use oncepay_simulator::faults::FaultsPatch;
use oncepay_tests::system::{
    Binaries, Processes, Provider, Role, SIMULATOR_API_KEY, System, SystemConfig, Tenant, Timing, Topology,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use tokio::net::TcpListener;

/// A key no tenant has, presented to the api.
const WRONG_API_KEY: &str = "opk_CANARYwrongApiKeyThatMustNeverBeLogged0000000000000000";
/// The client's idempotency key for the traced payment.
const IDEMPOTENCY_KEY: &str = "CANARY-idempotency-key-52e1";
/// Body values of the traced payment.
const CUSTOMER: &str = "cus_CANARY_customer_8d41";
const DESCRIPTION: &str = "CANARY description 77b0";
const METADATA_VALUE: &str = "CANARY-metadata-31f6";
/// A value in a body the api refuses.
const REFUSED_BODY_VALUE: &str = "CANARY-refused-amount-9a07";
/// An idempotency key the api refuses (it has a space).
const REFUSED_KEY: &str = "CANARY refused key 4c2d";

/// The worker gives up on a provider response after this long; a hanging simulator holds it longer.
const PROVIDER_TIMEOUT_MS: u64 = 1_000;
const HANG_MS: &str = "4000";
/// How long to wait for anything that the processes do on their own.
const PATIENCE: Duration = Duration::from_secs(60);

/// What must never appear in any log line: the tenant's API key, the provider's credential, the
/// webhook secret (whole and its base64 part), and every distinctive value above. Each is a canary,
/// searched for in every process's log and every exported span after the run.
fn canaries(api_key: &str, webhook_secret: &str) -> Vec<String> {
    let secret_base64 = webhook_secret.trim_start_matches("whsec_");
    [
        api_key,
        WRONG_API_KEY,
        SIMULATOR_API_KEY,
        webhook_secret,
        secret_base64,
        IDEMPOTENCY_KEY,
        REFUSED_KEY,
        CUSTOMER,
        DESCRIPTION,
        METADATA_VALUE,
        REFUSED_BODY_VALUE,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

// ---------------------------------------------------------------------------------------------------
// A small HTTP server for the test's own endpoints (the OTLP receiver, the provider proxy).

type Handler =
    Arc<dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<Full<Bytes>>> + Send>> + Send + Sync>;

/// Serves `handler` on a free port of 127.0.0.1 until the test ends; returns the base URL.
async fn serve(handler: Handler) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let answer = handler(request);
                    async move { Ok::<_, Infallible>(answer.await) }
                });
                // A client that gives up (the worker's timeout) ends its connection: not an error here.
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    url
}

/// One span as exported over OTLP.
#[derive(Debug, Clone)]
struct ExportedSpan {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: HashMap<String, String>,
    /// (trace id, span id) of each linked span.
    links: Vec<(String, String)>,
    /// The names and attribute values of its events (the log lines written inside it).
    events: Vec<String>,
}

impl ExportedSpan {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

fn text(attributes: &[KeyValue]) -> HashMap<String, String> {
    attributes
        .iter()
        .filter_map(|kv| {
            let value = match kv.value.as_ref()?.value.as_ref()? {
                AnyValue::StringValue(s) => s.clone(),
                AnyValue::IntValue(i) => i.to_string(),
                AnyValue::BoolValue(b) => b.to_string(),
                AnyValue::DoubleValue(d) => d.to_string(),
                _ => return None,
            };
            Some((kv.key.clone(), value))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP trace receiver: `POST /v1/traces` with an `ExportTraceServiceRequest` in protobuf.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<ExportedSpan>>>,
}

impl Receiver {
    async fn start(&self) -> String {
        let spans = self.spans.clone();
        serve(Arc::new(move |request: Request<Incoming>| {
            let spans = spans.clone();
            Box::pin(async move {
                if request.uri().path() != "/v1/traces" {
                    return status(StatusCode::NOT_FOUND);
                }
                let body = request.into_body().collect().await.unwrap().to_bytes();
                let export = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
                let mut received = spans.lock().unwrap();
                for resource in export.resource_spans {
                    let attributes = resource.resource.map(|r| text(&r.attributes)).unwrap_or_default();
                    let service = attributes.get("service.name").cloned().unwrap_or_default();
                    for span in resource.scope_spans.into_iter().flat_map(|scope| scope.spans) {
                        received.push(ExportedSpan {
                            service: service.clone(),
                            name: span.name,
                            trace_id: hex(&span.trace_id),
                            span_id: hex(&span.span_id),
                            parent_span_id: hex(&span.parent_span_id),
                            attributes: text(&span.attributes),
                            links: span.links.iter().map(|l| (hex(&l.trace_id), hex(&l.span_id))).collect(),
                            events: span
                                .events
                                .iter()
                                .flat_map(|e| std::iter::once(e.name.clone()).chain(text(&e.attributes).into_values()))
                                .collect(),
                        });
                    }
                }
                Response::builder()
                    .header("content-type", "application/x-protobuf")
                    .body(Full::new(Bytes::new()))
                    .unwrap()
            })
        }))
        .await
    }

    /// Every exported span, its name, attributes and events checked for canaries.
    fn assert_no_canary_in_spans(&self, canaries: &[String]) {
        let spans = self.spans.lock().unwrap();
        assert!(spans.len() > 10, "only {} spans were exported", spans.len());
        for span in spans.iter() {
            let texts = std::iter::once(&span.name).chain(span.attributes.values()).chain(&span.events);
            for text in texts {
                for canary in canaries {
                    assert!(!text.contains(canary), "a {} span leaks {canary:?}: {span:?}", span.service);
                }
            }
        }
    }

    /// The one span of `service` named `name` that satisfies `matches`, once exported.
    fn find(&self, service: &str, name: &str, matches: impl Fn(&ExportedSpan) -> bool) -> Option<ExportedSpan> {
        let spans = self.spans.lock().unwrap();
        let found: Vec<_> = spans.iter().filter(|s| s.service == service && s.name == name && matches(s)).collect();
        assert!(found.len() <= 1, "more than one {service} {name} span matches: {found:#?}");
        found.first().map(|s| (*s).clone())
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    Response::builder().status(code).body(Full::new(Bytes::new())).unwrap()
}

/// A provider request as the proxy saw it.
#[derive(Debug, Clone)]
struct ProviderRequest {
    method: String,
    path_and_query: String,
    traceparent: Option<String>,
}

/// Forwards every request to the simulator and remembers its method, path and `traceparent`, so
/// the context each provider request carried can be checked against the spans exported for it.
///
/// It listens before the simulator starts (the processes are configured with its address) and
/// forwards once told where the simulator is; until then it answers 502.
#[derive(Clone, Default)]
struct Proxy {
    seen: Arc<Mutex<Vec<ProviderRequest>>>,
    upstream: Arc<OnceLock<String>>,
}

impl Proxy {
    async fn start(&self) -> String {
        let (seen, upstream) = (self.seen.clone(), self.upstream.clone());
        let client = reqwest::Client::new();
        serve(Arc::new(move |request: Request<Incoming>| {
            let (seen, client, upstream) = (seen.clone(), client.clone(), upstream.clone());
            Box::pin(async move {
                let Some(upstream) = upstream.get() else { return status(StatusCode::BAD_GATEWAY) };
                let (parts, body) = request.into_parts();
                let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
                seen.lock().unwrap().push(ProviderRequest {
                    method: parts.method.to_string(),
                    path_and_query: path_and_query.clone(),
                    traceparent: parts.headers.get("traceparent").map(|v| v.to_str().unwrap().to_owned()),
                });
                let body = body.collect().await.unwrap().to_bytes();
                let mut forward = client.request(parts.method.clone(), format!("{upstream}{path_and_query}"));
                for (name, value) in &parts.headers {
                    if name != "host" {
                        forward = forward.header(name, value);
                    }
                }
                let Ok(answer) = forward.body(body).send().await else {
                    return status(StatusCode::BAD_GATEWAY);
                };
                let mut response = Response::builder().status(answer.status().as_u16());
                for (name, value) in answer.headers() {
                    response = response.header(name, value);
                }
                response.body(Full::new(answer.bytes().await.unwrap_or_default())).unwrap()
            })
        }))
        .await
    }

    /// Forwards from now on to `upstream`.
    fn forward_to(&self, upstream: &str) {
        self.upstream.set(upstream.to_owned()).expect("the proxy's upstream is set once");
    }

    fn requests(&self) -> Vec<ProviderRequest> {
        self.seen.lock().unwrap().clone()
    }
}

// ---------------------------------------------------------------------------------------------------
// The world: PostgreSQL, the four processes, the receiver and the proxy.

/// How a test wants the processes to behave.
struct Scenario {
    /// The simulator's `faults.*` settings.
    faults: &'static [(&'static str, &'static str)],
    /// How often the reconciler's poller looks for due unknown payments.
    poller_interval_ms: &'static str,
}

struct World {
    system: System,
    receiver: Receiver,
    proxy: Proxy,
    api: String,
    worker: String,
    reconciler: String,
    http: reqwest::Client,
}

impl World {
    async fn start(scenario: &Scenario) -> Self {
        // The proxy's client is built before the system installs the workspace's TLS provider.
        oncepay_service::tls::install_provider();
        let receiver = Receiver::default();
        let otlp = receiver.start().await;
        let proxy = Proxy::default();
        let provider = proxy.start().await;
        let setting = |to, key: &str, value: &str| (to, setting_variable(key), value.to_owned());
        let (worker, reconciler) = (Processes::Only(Role::Worker), Processes::Only(Role::Reconciler));
        let mut env = vec![
            // Production log format (JSON), with our own crates at `debug`, so every statement is audited.
            setting(Processes::All, "telemetry.log_format", "json"),
            setting(
                Processes::All,
                "telemetry.log_filter",
                "info,oncepay_api=debug,oncepay_worker=debug,oncepay_reconciler=debug,oncepay_store=debug,\
                 oncepay_provider=debug,oncepay_simulator=debug",
            ),
            setting(Processes::All, "telemetry.otlp_endpoint", &otlp),
            // Export every 100 ms rather than every 5 s (the OpenTelemetry SDK's own variable).
            (Processes::All, "OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
            setting(worker, "provider.base_url", &provider),
            setting(reconciler, "provider.base_url", &provider),
            setting(reconciler, "poller.interval_ms", scenario.poller_interval_ms),
            setting(reconciler, "backlog.interval_ms", "100"),
        ];
        env.extend(
            scenario
                .faults
                .iter()
                .map(|(fault, value)| setting(Processes::Simulator, &format!("faults.{fault}"), value)),
        );
        let system = System::start(SystemConfig {
            binaries: Binaries::built().unwrap(),
            topology: Topology { apis: 1, workers: 1, reconcilers: 1 },
            tenants: vec!["acme".to_owned()],
            durability: Durability::Fast,
            timing: Timing { provider_request_timeout_ms: PROVIDER_TIMEOUT_MS, ..Timing::default() },
            provider: Provider::Simulator { seed: 0x0B5E },
            log_dir: None,
            env,
            broker: false,
        })
        .await
        .unwrap();
        proxy.forward_to(system.simulator_url().unwrap());
        Self {
            api: system.url(Role::Api, 0).unwrap(),
            worker: system.url(Role::Worker, 0).unwrap(),
            reconciler: system.url(Role::Reconciler, 0).unwrap(),
            system,
            receiver,
            proxy,
            http: reqwest::Client::new(),
        }
    }

    /// The tenant the system was started with.
    fn acme(&self) -> Tenant {
        self.system.tenants()[0].clone()
    }

    /// A new tenant limited to `rate_limit` requests a second, made with the operator CLI.
    async fn tenant(&self, name: &str, rate_limit: &str) -> Tenant {
        self.system.create_tenant(name, Some(rate_limit)).await.unwrap()
    }

    /// `POST /v1/payments` with the given credential, key and raw body.
    async fn post(&self, api_key: &str, key: Option<&str>, body: &str) -> (StatusCode, Value) {
        let mut request = self
            .http
            .post(format!("{}/v1/payments", self.api))
            .bearer_auth(api_key)
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await.unwrap();
        let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Waits (long polls) until the payment is `succeeded`.
    async fn until_succeeded(&self, api_key: &str, payment_id: &str) {
        let succeeded = wait_until("the payment to succeed", PATIENCE, || async {
            let payment: Value = self
                .http
                .get(format!("{}/v1/payments/{payment_id}", self.api))
                .bearer_auth(api_key)
                .header("prefer", "wait=5")
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (payment["status"] == "succeeded").then_some(())
        })
        .await;
        if let Err(timed_out) = succeeded {
            panic!("{timed_out}\n{}", self.all_logs());
        }
    }

    /// Waits until `condition` holds, or fails with every process's log.
    async fn until<T>(&self, what: &str, mut condition: impl FnMut() -> Option<T>) -> T {
        let found = wait_until(what, PATIENCE, || std::future::ready(condition())).await;
        found.unwrap_or_else(|timed_out| panic!("{timed_out}\n{}", self.all_logs()))
    }

    /// Scrapes `/metrics` of `service` until `done` holds for it; returns that scrape.
    async fn until_scraped(&self, service: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
        let scraped = wait_until(what, PATIENCE, || async {
            let text = self.metrics(service).await;
            done(&text).then_some(text)
        })
        .await;
        match scraped {
            Ok(text) => text,
            Err(timed_out) => panic!("{timed_out}\n{}", self.metrics(service).await),
        }
    }

    /// Waits until `/metrics` of `service` shows `series` at `expected`.
    async fn until_metric(&self, service: &str, series: &str, expected: f64) {
        self.until_scraped(service, &format!("{series} = {expected}"), |text| metric(text, series) == Some(expected))
            .await;
    }

    async fn metrics(&self, service: &str) -> String {
        self.http.get(format!("{service}/metrics")).send().await.unwrap().text().await.unwrap()
    }

    /// Stops every process politely (each flushes its spans and logs on the way out).
    async fn stop(&mut self) {
        let unclean = self.system.shutdown().await.unwrap();
        assert!(unclean.is_empty(), "every process exits 0 on SIGTERM: {unclean:?}\n{}", self.all_logs());
    }

    fn all_logs(&self) -> String {
        let mut all = String::new();
        for entry in std::fs::read_dir(self.system.log_dir()).unwrap() {
            let path = entry.unwrap().path();
            all.push_str(&format!("--- {}\n{}\n", path.display(), std::fs::read_to_string(&path).unwrap()));
        }
        all
    }

    /// The log lines of one process.
    fn log_of(&self, name: &str) -> String {
        std::fs::read_to_string(self.system.log_dir().join(format!("{name}.log"))).unwrap()
    }

    /// Every log line of every process, and every exported span, checked for canaries.
    fn assert_no_canary_in_logs(&self, api_key: &str) {
        let canaries = canaries(api_key, self.system.webhook_secret());
        self.receiver.assert_no_canary_in_spans(&canaries);
        let mut lines = 0;
        for entry in std::fs::read_dir(self.system.log_dir()).unwrap() {
            let path = entry.unwrap().path();
            let log = std::fs::read_to_string(&path).unwrap();
            for line in log.lines() {
                lines += 1;
                for canary in &canaries {
                    assert!(!line.contains(canary), "{} leaks {canary:?}:\n{line}", path.display());
                }
            }
        }
        assert!(lines > 20, "the processes logged only {lines} lines");
    }
}

/// The value of one series (`name{labels}` exactly as rendered) in Prometheus text.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.rsplit_once(' ').filter(|(name, _)| *name == series).map(|(_, value)| value))
        .map(|value| value.parse().unwrap())
}

fn payment_body() -> String {
    json!({
        "amount": 4200,
        "currency": "EUR",
        "customer_id": CUSTOMER,
        "description": DESCRIPTION,
        "metadata": {"order": METADATA_VALUE},
    })
    .to_string()
}

/// Sends the canary payment through, with refused requests carrying canaries around it; returns its
/// id once it has succeeded.
async fn canary_payment(world: &World, tenant: &Tenant) -> String {
    let (status, _) = world.post(WRONG_API_KEY, Some(IDEMPOTENCY_KEY), &payment_body()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = world.post(&tenant.api_key, Some(REFUSED_KEY), &payment_body()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let refused = json!({"amount": REFUSED_BODY_VALUE, "currency": "EUR", "customer_id": CUSTOMER}).to_string();
    let (status, _) = world.post(&tenant.api_key, Some("refused-body"), &refused).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let (status, accepted) = world.post(&tenant.api_key, Some(IDEMPOTENCY_KEY), &payment_body()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let payment_id = accepted["id"].as_str().unwrap().to_owned();
    world.until_succeeded(&tenant.api_key, &payment_id).await;
    payment_id
}

/// The spans of the payment's journey up to the moment it became `unknown`, checked for parentage:
/// the api's `POST`, the worker's processing as its child, the provider call and the recording as the
/// worker's children. The provider request carried the provider call's own context.
async fn journey_to_unknown(world: &World, payment_id: &str) -> (ExportedSpan, ExportedSpan) {
    let receiver = &world.receiver;
    let ours = |s: &ExportedSpan| s.attribute("payment.id") == Some(payment_id);
    let request = world
        .until("the api's request span", || {
            receiver.find("oncepay-api", "http.request", |s| ours(s) && s.attribute("http.method") == Some("POST"))
        })
        .await;
    let process = world.until("the worker's span", || receiver.find("oncepay-worker", "worker.process", ours)).await;
    let record =
        world.until("the worker's record span", || receiver.find("oncepay-worker", "worker.record", ours)).await;
    let in_process = |s: &ExportedSpan| s.parent_span_id == process.span_id;
    let call = world
        .until("the provider call's span", || receiver.find("oncepay-worker", "provider.create_charge", in_process))
        .await;

    assert_eq!(request.attribute("http.route"), Some("/v1/payments"), "{request:?}");
    assert_eq!(process.trace_id, request.trace_id, "the worker continues the request's trace");
    assert_eq!(process.parent_span_id, request.span_id, "the worker's span is a child of the request's");
    assert_eq!(process.attribute("decision"), Some("unknown"), "{process:?}");
    assert_eq!(call.trace_id, request.trace_id);
    assert_eq!(call.attribute("provider.outcome"), Some("uncertain"), "{call:?}");
    assert_eq!(
        (record.trace_id.as_str(), record.parent_span_id.as_str()),
        (request.trace_id.as_str(), process.span_id.as_str())
    );

    let charge_posts: Vec<_> = world
        .proxy
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path_and_query == "/v1/charges")
        .collect();
    assert_eq!(charge_posts.len(), 1, "{charge_posts:?}");
    assert_eq!(
        charge_posts[0].traceparent.as_deref(),
        Some(format!("00-{}-{}-01", call.trace_id, call.span_id).as_str()),
        "the provider request carries the provider call's context"
    );
    // The worker's log line about the outcome leads to the trace: it carries the trace and span ids.
    let logged = world.log_of("worker-0");
    let line = logged.lines().find(|l| l.contains(payment_id) && l.contains("uncertain")).expect("a log line");
    let ids = format!(r#""trace_id":"{}","span_id":"{}""#, request.trace_id, process.span_id);
    assert!(line.contains(&ids), "{line}");
    (request, record)
}

#[tokio::test]
async fn one_payment_is_one_trace_from_the_request_to_the_webhook_that_settles_it() {
    // The simulator charges, then holds its response past the worker's timeout (the payment becomes
    // `unknown`), and its webhook arrives after that; the poller waits a minute, so the webhook settles.
    let scenario = Scenario {
        faults: &[("hang_after_rate", "1.0"), ("hang_ms", HANG_MS), ("webhook_delay_ms", "2500")],
        poller_interval_ms: "60000",
    };
    let mut world = World::start(&scenario).await;
    let tenant = world.acme();

    let payment_id = canary_payment(&world, &tenant).await;

    let (request, record) = journey_to_unknown(&world, &payment_id).await;
    let resolve = world
        .until("the webhook's resolution span", || {
            world
                .receiver
                .find("oncepay-reconciler", "webhook.resolve", |s| s.attribute("payment.id") == Some(&payment_id))
        })
        .await;
    assert_eq!(resolve.trace_id, request.trace_id, "the resolution is in the payment's trace");
    assert_eq!(resolve.parent_span_id, record.span_id, "it continues from the worker's recording of `unknown`");
    assert_eq!(resolve.attribute("resolution"), Some("webhook_charged"));
    let delivery = world
        .until("the webhook delivery's span", || {
            world
                .receiver
                .find("oncepay-reconciler", "webhook.apply", |s| s.attribute("payment.id") == Some(&payment_id))
        })
        .await;
    assert_ne!(delivery.trace_id, request.trace_id, "a delivery is a trace of its own");
    assert_eq!(resolve.links, [(delivery.trace_id.clone(), delivery.span_id.clone())], "linked to the delivery");

    world.stop().await;
    world.assert_no_canary_in_logs(&tenant.api_key);
}

#[tokio::test]
async fn one_payment_is_one_trace_from_the_request_to_the_poll_that_settles_it() {
    // As above, but no webhook ever arrives: the poller finds the charge by the payment's key.
    let scenario = Scenario {
        faults: &[("hang_after_rate", "1.0"), ("hang_ms", HANG_MS), ("webhook_drop_rate", "1.0")],
        poller_interval_ms: "100",
    };
    let mut world = World::start(&scenario).await;
    let tenant = world.acme();

    let payment_id = canary_payment(&world, &tenant).await;

    let (request, record) = journey_to_unknown(&world, &payment_id).await;
    let poll = world
        .until("the poll's span", || {
            world.receiver.find("oncepay-reconciler", "poller.poll", |s| {
                s.attribute("payment.id") == Some(&payment_id) && s.attribute("poll.outcome") == Some("charged")
            })
        })
        .await;
    assert_eq!(poll.trace_id, request.trace_id, "the resolution is in the payment's trace");
    assert_eq!(poll.parent_span_id, record.span_id, "it continues from the worker's recording of `unknown`");
    let lookup = world
        .until("the provider lookup's span", || {
            world.receiver.find("oncepay-reconciler", "provider.find_by_key", |s| s.parent_span_id == poll.span_id)
        })
        .await;
    let lookups: Vec<_> = world
        .proxy
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path_and_query.contains(&payment_id))
        .collect();
    let carried = format!("00-{}-{}-01", lookup.trace_id, lookup.span_id);
    assert!(lookups.iter().any(|r| r.traceparent.as_deref() == Some(carried.as_str())), "{lookups:?} {carried}");

    world.stop().await;
    world.assert_no_canary_in_logs(&tenant.api_key);
}

#[tokio::test]
async fn one_refund_is_one_trace_from_the_request_to_the_webhook_that_settles_it() {
    // The payment is charged at once. Then the simulator holds every response past the worker's
    // timeout, so the refund becomes `unknown`, and the refund's webhook arrives after that; the
    // poller waits a minute, so the webhook settles it.
    let scenario =
        Scenario { faults: &[("hang_ms", HANG_MS), ("webhook_delay_ms", "2500")], poller_interval_ms: "60000" };
    let mut world = World::start(&scenario).await;
    let tenant = world.acme();
    let (status, accepted) = world.post(&tenant.api_key, Some("order-to-refund"), &payment_body()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let payment_id = accepted["id"].as_str().unwrap().to_owned();
    world.until_succeeded(&tenant.api_key, &payment_id).await;
    let simulator = SimulatorClient::new(world.system.simulator_url().unwrap());
    simulator.set_faults(&FaultsPatch { hang_after_rate: Some(1.0), ..FaultsPatch::default() }).await.unwrap();

    let response = world
        .http
        .post(format!("{}/v1/payments/{payment_id}/refunds", world.api))
        .bearer_auth(&tenant.api_key)
        .header("idempotency-key", "refund-1")
        .header("content-type", "application/json")
        .body(json!({"amount": 1000}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let refund: Value = response.json().await.unwrap();
    let refund_id = refund["id"].as_str().unwrap().to_owned();

    let receiver = &world.receiver;
    let request = world
        .until("the refund request's span", || {
            receiver.find("oncepay-api", "http.request", |s| {
                s.attribute("http.route") == Some("/v1/payments/{id}/refunds")
                    && s.attribute("http.method") == Some("POST")
            })
        })
        .await;
    let send = world
        .until("the worker's refund span", || {
            receiver.find("oncepay-worker", "worker.refund", |s| s.attribute("refund.id") == Some(&refund_id))
        })
        .await;
    assert_eq!(
        (send.trace_id.as_str(), send.parent_span_id.as_str()),
        (request.trace_id.as_str(), request.span_id.as_str())
    );
    let resolve = world
        .until("the refund webhook's resolution span", || {
            receiver
                .find("oncepay-reconciler", "webhook.resolve_refund", |s| s.attribute("refund.id") == Some(&refund_id))
        })
        .await;
    assert_eq!(resolve.trace_id, request.trace_id, "the resolution is in the refund's trace");
    assert_eq!(resolve.parent_span_id, request.span_id, "it continues from the request that asked for the refund");
    assert_eq!(resolve.attribute("resolution"), Some("webhook_refunded"));
    let delivery = world
        .until("the refund webhook delivery's span", || {
            receiver
                .find("oncepay-reconciler", "webhook.apply_refund", |s| s.attribute("refund.id") == Some(&refund_id))
        })
        .await;
    assert_ne!(delivery.trace_id, request.trace_id, "a delivery is a trace of its own");
    assert_eq!(resolve.links, [(delivery.trace_id.clone(), delivery.span_id.clone())], "linked to the delivery");

    world.stop().await;
}

#[tokio::test]
async fn metrics_count_a_scripted_workload_and_the_gauges_reflect_the_database() {
    let scenario = Scenario { faults: &[], poller_interval_ms: "100" };
    let mut world = World::start(&scenario).await;
    let tenant = world.acme();
    let slow = world.tenant("slow", "1").await;
    let body = payment_body();

    // Two payments created, the first replayed three times, its key reused once with another body.
    let (status, first) = world.post(&tenant.api_key, Some(IDEMPOTENCY_KEY), &body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _) = world.post(&tenant.api_key, Some("second-payment"), &body).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    for _ in 0..3 {
        let (status, replayed) = world.post(&tenant.api_key, Some(IDEMPOTENCY_KEY), &body).await;
        assert!(status.is_success(), "{status}");
        assert_eq!(replayed["id"], first["id"]);
    }
    let other = json!({"amount": 1, "currency": "EUR", "customer_id": CUSTOMER}).to_string();
    let (status, _) = world.post(&tenant.api_key, Some(IDEMPOTENCY_KEY), &other).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    // The key is being written by another transaction right now, past the api's lock wait: 409.
    let mut writer = PgConnection::connect(world.system.database_url()).await.unwrap();
    let mut in_flight = writer.begin().await.unwrap();
    sqlx::query(
        "WITH payment AS (
             INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id)
             VALUES ($1::uuid, gen_random_uuid(), 1, 'EUR', 'cus_1') RETURNING tenant_id, payment_id)
         INSERT INTO idempotency_keys (tenant_id, idempotency_key, fingerprint, payment_id, expires_at)
         SELECT tenant_id, 'held-key', sha256('held'), payment_id, now() + interval '1 day' FROM payment",
    )
    .bind(tenant.tenant_id)
    .execute(&mut *in_flight)
    .await
    .unwrap();
    let (status, _) = world.post(&tenant.api_key, Some("held-key"), &body).await;
    assert_eq!(status, StatusCode::CONFLICT);
    in_flight.rollback().await.unwrap();
    // Refused before the store: a wrong key, a missing idempotency key, the second request of a tenant
    // limited to one per second.
    assert_eq!(world.post(WRONG_API_KEY, Some("k"), &body).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(world.post(&tenant.api_key, None, &body).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(world.post(&slow.api_key, Some("slow-1"), &body).await.0, StatusCode::ACCEPTED);
    assert_eq!(world.post(&slow.api_key, Some("slow-2"), &body).await.0, StatusCode::TOO_MANY_REQUESTS);

    let api = world.metrics(&world.api).await;
    let intake = |outcome: &str| metric(&api, &format!("oncepay_api_intake_total{{outcome=\"{outcome}\"}}"));
    let counted: Vec<_> =
        ["created", "replayed", "key_reused", "key_in_use", "unauthorized", "invalid", "rate_limited"]
            .into_iter()
            .map(|outcome| (outcome, intake(outcome)))
            .collect();
    assert_eq!(
        counted,
        [
            ("created", Some(3.0)),
            ("replayed", Some(3.0)),
            ("key_reused", Some(1.0)),
            ("key_in_use", Some(1.0)),
            ("unauthorized", Some(1.0)),
            ("invalid", Some(1.0)),
            ("rate_limited", Some(1.0)),
        ]
    );
    assert_eq!(intake("store_unavailable"), Some(0.0), "registered at zero before the first one");
    let posts = metric(&api, "oncepay_api_request_duration_seconds_count{route=\"/v1/payments\",method=\"POST\"}");
    assert_eq!(posts, Some(11.0), "every POST is timed");

    // The worker sends the three payments, each charged at once.
    world
        .until_metric(&world.worker, "oncepay_worker_provider_outcomes_total{kind=\"payment\",class=\"charged\"}", 3.0)
        .await;
    world.until_metric(&world.worker, "oncepay_worker_drain_latency_seconds_count{kind=\"payment\"}", 3.0).await;
    let worker = world.metrics(&world.worker).await;
    assert_eq!(metric(&worker, "oncepay_worker_claims_total{kind=\"payment\"}"), Some(3.0));
    assert_eq!(
        metric(&worker, "oncepay_worker_provider_outcomes_total{kind=\"payment\",class=\"uncertain\"}"),
        Some(0.0)
    );
    // Each charge's webhook reaches the reconciler, which only records it: the worker settles (or is
    // settling) the payment itself.
    let webhooks = |text: &str, verdict: &str| {
        metric(text, &format!("oncepay_reconciler_webhooks_total{{verdict=\"{verdict}\"}}")).unwrap_or(-1.0)
    };
    let reconciler = world
        .until_scraped(&world.reconciler, "three webhooks", |text| {
            webhooks(text, "not_unknown") + webhooks(text, "already_terminal") == 3.0
        })
        .await;
    assert_eq!(webhooks(&reconciler, "applied"), 0.0);
    assert_eq!(webhooks(&reconciler, "invalid_signature"), 0.0);

    // Seeded backlog: two payments waiting for a retry in an hour (the older accepted ten minutes
    // ago), one `unknown` for half an hour that the poller will not look at yet, a dead-lettered
    // payment and a conflict on a succeeded one, each with its open dead letter.
    let mut db = PgConnection::connect(world.system.database_url()).await.unwrap();
    for statement in [
        "WITH p AS (
             INSERT INTO payments (tenant_id, payment_id, amount, currency, customer_id, created_at, updated_at)
             SELECT $1::uuid, gen_random_uuid(), 1, 'EUR', 'cus_seed', now() - make_interval(mins => m), now()
             FROM (VALUES (10), (1)) AS ages (m)
             RETURNING tenant_id, payment_id, created_at)
         INSERT INTO outbox (tenant_id, payment_id, available_at, created_at)
         SELECT tenant_id, payment_id, now() + interval '1 hour', created_at FROM p",
        "WITH p AS (
             INSERT INTO payments (tenant_id, payment_id, status, amount, currency, customer_id, send_attempts,
                                   first_sent_at, may_be_charged)
             VALUES ($1::uuid, gen_random_uuid(), 'unknown', 1, 'EUR', 'cus_seed', 1, now(), true)
             RETURNING tenant_id, payment_id)
         INSERT INTO unknown_payments (tenant_id, payment_id, reason, since, next_poll_at)
         SELECT tenant_id, payment_id, 'timeout', now() - interval '30 minutes', now() + interval '1 hour' FROM p",
        "WITH p AS (
             INSERT INTO payments (tenant_id, payment_id, status, amount, currency, customer_id, send_attempts,
                                   first_sent_at, may_be_charged)
             VALUES ($1::uuid, gen_random_uuid(), 'dead_lettered', 1, 'EUR', 'cus_seed', 1, now(), true)
             RETURNING tenant_id, payment_id)
         INSERT INTO dead_letters (tenant_id, payment_id, kind, reason)
         SELECT tenant_id, payment_id, 'unresolved', 'seeded' FROM p",
        "INSERT INTO dead_letters (tenant_id, payment_id, kind, reason)
         SELECT tenant_id, payment_id, 'conflict', 'seeded' FROM payments
         WHERE tenant_id = $1::uuid AND status = 'succeeded' LIMIT 1",
    ] {
        sqlx::query(statement).bind(tenant.tenant_id).execute(&mut db).await.unwrap();
    }

    for (series, expected) in [
        ("oncepay_reconciler_outbox_depth{state=\"scheduled\"}", 2.0),
        ("oncepay_reconciler_outbox_depth{state=\"due\"}", 0.0),
        ("oncepay_reconciler_outbox_depth{state=\"leased\"}", 0.0),
        ("oncepay_reconciler_unknown_payments", 1.0),
        ("oncepay_reconciler_open_dead_letters{kind=\"unresolved\"}", 1.0),
        ("oncepay_reconciler_open_dead_letters{kind=\"conflict\"}", 1.0),
    ] {
        world.until_metric(&world.reconciler, series, expected).await;
    }
    // A second short of the seeded ages is allowed: under Citus the coordinator fixes `now()` when
    // the gauges' statement starts, while a worker node reads the rows when its part runs, so a row
    // committed in between counts from a moment before it was written (seen: 1799.99 s).
    let reconciler = world.metrics(&world.reconciler).await;
    let oldest_pending = metric(&reconciler, "oncepay_reconciler_oldest_pending_age_seconds").unwrap();
    assert!((599.0..660.0).contains(&oldest_pending), "{oldest_pending}");
    let oldest_unknown = metric(&reconciler, "oncepay_reconciler_oldest_unknown_age_seconds").unwrap();
    assert!((1799.0..1860.0).contains(&oldest_unknown), "{oldest_unknown}");

    // The store goes away: the api fails closed, and counts it.
    world.system.crash_database().await.unwrap();
    assert_eq!(world.post(&tenant.api_key, Some("no-store"), &body).await.0, StatusCode::SERVICE_UNAVAILABLE);
    world.until_metric(&world.api, "oncepay_api_intake_total{outcome=\"store_unavailable\"}", 1.0).await;

    world.assert_no_canary_in_logs(&tenant.api_key);
}
