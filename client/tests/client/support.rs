//! What every client test needs: a scripted stand-in for the api, canned responses, a client with
//! tiny backoffs, and a front that drops connections.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use oncepay_client::{Client, ClientBuilder, Jitter, RetryPolicy};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, copy_bidirectional};
use tokio::net::{TcpListener, TcpStream};
use wiremock::{MockServer, Request, Respond, ResponseTemplate};

/// A key distinctive enough that finding it anywhere is a leak.
pub const API_KEY: &str = "opk_TestSecretPart0123456789abcdefghijklmnopqrstuvwxyzABCD";

/// The payment every canned response describes.
pub const PAYMENT_ID: &str = "0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e7f";

/// The refund every canned refund response describes (of [`PAYMENT_ID`]).
pub const REFUND_ID: &str = "0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e80";

/// Retries without waiting for real time, so tests stay fast.
pub fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        base_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        jitter: Jitter::Full,
        max_retry_after: Duration::from_secs(5),
    }
}

/// A client builder for `uri` with [`fast_retries`].
pub fn builder(uri: &str) -> ClientBuilder {
    Client::builder(uri, API_KEY).retry_policy(fast_retries()).timeout(Duration::from_secs(5))
}

/// A client for `uri` with [`fast_retries`].
pub fn client(uri: &str) -> Client {
    builder(uri).build().unwrap()
}

/// The payment resource in `status`, as the api renders it.
pub fn payment_json(status: &str) -> Value {
    let mut payment = json!({
        "id": PAYMENT_ID,
        "status": status,
        "amount": 1999,
        "currency": "EUR",
        "customer_id": "cus_42",
        "metadata": {"order": "A-17"},
        "created_at": "2026-11-22T04:23:00.5Z",
        "updated_at": "2026-11-22T04:23:01Z",
        "amount_refunded": 0,
    });
    if status == "succeeded" {
        payment["provider_charge_id"] = json!("ch_1");
    }
    if status == "failed" {
        payment["failure"] = json!({"code": "card_declined", "message": "The card was declined."});
    }
    payment
}

/// The refund resource in `status`, as the api renders it.
pub fn refund_json(status: &str) -> Value {
    let mut refund = json!({
        "id": REFUND_ID,
        "payment_id": PAYMENT_ID,
        "status": status,
        "amount": 500,
        "currency": "EUR",
        "reason": "requested_by_customer",
        "metadata": {},
        "created_at": "2026-11-22T05:00:00Z",
        "updated_at": "2026-11-22T05:00:01Z",
    });
    if status == "succeeded" {
        refund["provider_refund_id"] = json!("re_1");
    }
    if status == "failed" {
        refund["failure"] = json!({"code": "refund_failed", "message": "The provider failed the refund."});
    }
    refund
}

/// `202 Accepted` for a new refund in `status`.
pub fn refund_accepted(status: &str) -> ResponseTemplate {
    ResponseTemplate::new(202)
        .insert_header("Location", format!("/v1/refunds/{REFUND_ID}").as_str())
        .insert_header("Retry-After", "1")
        .set_body_json(refund_json(status))
}

/// `200` with the refund in `status` and the `Retry-After` the api sends while it is not final.
pub fn refund_found(status: &str, retry_after: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).insert_header("Retry-After", retry_after).set_body_json(refund_json(status))
}

/// `202 Accepted` for a new payment in `status`.
pub fn accepted(status: &str) -> ResponseTemplate {
    ResponseTemplate::new(202)
        .insert_header("Location", format!("/v1/payments/{PAYMENT_ID}").as_str())
        .insert_header("Retry-After", "1")
        .set_body_json(payment_json(status))
}

/// `200` with the payment in `status` and the `Retry-After` the api sends while it is not final.
pub fn found(status: &str, retry_after: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).insert_header("Retry-After", retry_after).set_body_json(payment_json(status))
}

/// A problem document of kind `slug`, with `Retry-After` if given.
pub fn problem(status: u16, slug: &str, retry_after: Option<&str>) -> ResponseTemplate {
    let body = json!({
        "type": format!("https://oncepay.dev/problems/{slug}"),
        "title": format!("title of {slug}"),
        "status": status,
        "detail": format!("detail of {slug}"),
    });
    let template = ResponseTemplate::new(status).set_body_raw(body.to_string(), "application/problem+json");
    match retry_after {
        Some(value) => template.insert_header("Retry-After", value),
        None => template,
    }
}

/// A header of a received request, as text.
pub fn header<'r>(request: &'r Request, name: &str) -> Option<&'r str> {
    request.headers.get(name).and_then(|value| value.to_str().ok())
}

/// When each request reached a [`Script`], in order.
#[derive(Clone, Default)]
pub struct Arrivals(Arc<Mutex<Vec<SystemTime>>>);

impl Arrivals {
    pub fn times(&self) -> Vec<SystemTime> {
        self.0.lock().unwrap().clone()
    }
}

/// Responds to the n-th request with the n-th response (the last one from then on), and records
/// when each request arrived: the server's own log of what the client did and when.
pub struct Script {
    responses: Vec<ResponseTemplate>,
    arrivals: Arrivals,
}

impl Script {
    pub fn new(responses: Vec<ResponseTemplate>) -> (Self, Arrivals) {
        let arrivals = Arrivals::default();
        (Self { responses, arrivals: arrivals.clone() }, arrivals)
    }
}

impl Respond for Script {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let mut arrivals = self.arrivals.0.lock().unwrap();
        let n = arrivals.len();
        arrivals.push(SystemTime::now());
        self.responses[n.min(self.responses.len() - 1)].clone()
    }
}

/// A TCP front for a mock server that reads the request head of each of the first `drops`
/// connections and then closes them without a response; later connections pass through.
pub struct DroppingFront {
    pub uri: String,
    heads: Arc<Mutex<Vec<String>>>,
}

impl DroppingFront {
    pub async fn start(upstream: &MockServer, drops: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let upstream: SocketAddr = *upstream.address();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let dropped = heads.clone();
        tokio::spawn(async move {
            let mut left = drops;
            while let Ok((mut socket, _)) = listener.accept().await {
                if left > 0 {
                    left -= 1;
                    let head = read_head(&mut socket).await;
                    dropped.lock().unwrap().push(head);
                    drop(socket);
                } else {
                    tokio::spawn(async move {
                        let mut server = TcpStream::connect(upstream).await.unwrap();
                        let _ = copy_bidirectional(&mut socket, &mut server).await;
                    });
                }
            }
        });
        Self { uri, heads }
    }

    /// The heads of the requests whose connections were dropped.
    pub fn dropped_heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

async fn read_head(socket: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        match socket.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buffer[..n]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A header's value in a raw request head.
pub fn header_in_head(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim().to_owned())
    })
}
