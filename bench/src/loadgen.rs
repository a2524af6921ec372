//! The HTTP load generator: N keep-alive HTTP/1.1 connections to the api over loopback, each
//! sending its next request (an accept, a replay or a refund) as soon as it has read the previous
//! response (a closed loop), until just after the measured window. Responses that arrive inside the
//! window count, with their latencies; the warm-up before it only warms.
//!
//! It runs on a thread of its own, whose CPU time is measured apart (`cpu::ClientSource::Thread`).
//! Each connection has exactly one request in flight (no pipelining). A response it cannot read for
//! certain is a transport problem, counted and followed by a reconnect, never guessed at. Nothing
//! here talks to PostgreSQL.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use crate::cpu;
use crate::dataset::{self, Refundable, ReplaySet};
use crate::latency::Latencies;

/// How long a request may wait for its response after the window before the connection gives up.
const STRAGGLER_GRACE: Duration = Duration::from_secs(5);

/// The load goes on this long after the window closes, so the machine is still under the same load
/// (and this thread still alive) when the window's closing CPU sample is taken.
const TAIL: Duration = Duration::from_millis(300);

/// The read buffer's first capacity: every response of the api fits, so it never grows.
const READ_BUFFER: usize = 8 * 1024;

/// Headers a response may have (the api sends fewer than ten).
const MAX_HEADERS: usize = 32;

/// The longest status line and headers accepted.
const MAX_HEAD: usize = 64 * 1024;

/// The longest response accepted, head and body.
const MAX_RESPONSE: usize = 1024 * 1024;

/// What the requests do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// `POST /v1/payments` with a fresh key each time: expects 202.
    Accept,
    /// `POST /v1/payments` with one of the keys of settled payments in the set, picked at random
    /// (same body): expects the stored 200 with `Idempotent-Replayed: true`.
    Replay(ReplaySet),
    /// `POST /v1/payments/{id}/refunds` of one of the payments, picked at random, with a fresh key
    /// each time: expects 202.
    Refund(Refundable),
}

impl Workload {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::Replay(_) => "replay",
            Self::Refund(_) => "refund",
        }
    }
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
    /// Responses from here on count.
    pub measure_from: Instant,
    /// The window ends here; the load a moment later.
    pub measure_until: Instant,
}

/// What a load run measured inside its window.
#[derive(Debug, Default)]
pub struct Measured {
    /// Requests that got the expected response.
    pub completed: u64,
    /// Their latencies, from the send to the last byte of the response.
    pub latencies: Latencies,
    /// Everything else, by kind (`status 503`, `transport`, `timeout`).
    pub unexpected: BTreeMap<String, u64>,
    /// The first such problem, described, for the log.
    pub first_problem: Option<String>,
}

impl Measured {
    fn problem(&mut self, kind: String, detail: impl std::fmt::Display) {
        if self.first_problem.is_none() {
            self.first_problem = Some(format!("{kind}: {detail}"));
        }
        *self.unexpected.entry(kind).or_default() += 1;
    }

    /// Counts a response that arrived inside the window.
    fn responded(&mut self, workload: Workload, response: Response, latency: Duration, target: SocketAddr) {
        let expected = match workload {
            Workload::Accept | Workload::Refund(_) => response.status == 202,
            Workload::Replay(_) => response.status == 200 && response.replayed,
        };
        if expected {
            self.completed += 1;
            self.latencies.record(latency);
        } else {
            self.problem(
                format!("status {}{}", response.status, if response.replayed { " (replayed)" } else { "" }),
                target,
            );
        }
    }

    fn merge(&mut self, other: Measured) {
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
    thread: std::thread::JoinHandle<anyhow::Result<Measured>>,
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
                // One thread, one current-thread runtime: the generator can take at most one core
                // from the api and PostgreSQL it measures.
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
    pub async fn finish(self) -> anyhow::Result<Measured> {
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the load generator's thread panicked"))?
    }
}

async fn run(plan: Plan) -> anyhow::Result<Measured> {
    anyhow::ensure!(!plan.targets.is_empty() && plan.connections > 0, "nothing to load");
    let plan = Arc::new(plan);
    let mut connections = JoinSet::new();
    for index in 0..plan.connections {
        let target = plan.targets[index % plan.targets.len()];
        let requests = Requests::new(&target.to_string(), &plan.token, plan.workload)?;
        connections.spawn(connection(Arc::clone(&plan), target, requests));
    }
    let mut measured = Measured::default();
    while let Some(finished) = connections.join_next().await {
        measured.merge(finished?);
    }
    Ok(measured)
}

/// One connection's closed loop; reconnects after a transport error or a `Connection: close`.
async fn connection(plan: Arc<Plan>, target: SocketAddr, mut requests: Requests) -> Measured {
    let mut measured = Measured::default();
    let stop = plan.measure_until + TAIL;
    // Every request is sent before `stop`, so one deadline for the whole loop bounds each of them as
    // a timer per request would, without arming and clearing a timer per request.
    let ran =
        tokio::time::timeout_at(stop + STRAGGLER_GRACE, closed_loop(&plan, target, stop, &mut requests, &mut measured));
    if ran.await.is_err() {
        measured.problem("timeout".into(), "no response long after the window");
    }
    measured
}

/// Sends requests on `target` until `stop`, counting their responses in `measured`.
///
/// The loop owns its stream and two buffers it reuses: it writes each request in one `write_all`,
/// then reads until the whole response is in, then sends the next.
async fn closed_loop(plan: &Plan, target: SocketAddr, stop: Instant, requests: &mut Requests, measured: &mut Measured) {
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    let mut received = Vec::with_capacity(READ_BUFFER);
    while Instant::now() < stop {
        let mut stream = match connect(target).await {
            Ok(stream) => stream,
            Err(error) => {
                measured.problem("connect".into(), format!("{error:#}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // What the last connection left unread belongs to no request of this one.
        received.clear();
        while Instant::now() < stop {
            let (key, payment) = match plan.workload {
                Workload::Accept => (rng.random_range(dataset::FRESH_KEYS), None),
                Workload::Replay(set) => (set.key_number(rng.random_range(0..set.keys.max(1))), None),
                Workload::Refund(refundable) => (
                    rng.random_range(dataset::FRESH_KEYS),
                    Some(refundable.payment_id(rng.random_range(refundable.numbers()))),
                ),
            };
            let sent = Instant::now();
            let response = match exchange(&mut stream, requests.with_key(key, payment), &mut received).await {
                Ok(response) => response,
                Err(error) => {
                    measured.problem("transport".into(), format!("{error:#}"));
                    break;
                }
            };
            let done = Instant::now();
            if (plan.measure_from..plan.measure_until).contains(&done) {
                measured.responded(plan.workload, response, done - sent, target);
            }
            if response.close {
                break;
            }
        }
    }
}

async fn connect(target: SocketAddr) -> anyhow::Result<TcpStream> {
    let stream = TcpStream::connect(target).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Sends one request and reads its whole response (so the connection can carry the next one).
///
/// Hand-written rather than hyper's client, which passes each request and response through a
/// connection task by channel: every microsecond of CPU the generator spends is taken from the api
/// and PostgreSQL it measures, and the service is compared with pgbench (BENCHMARKS.md has what
/// each costs). What is left is mostly the kernel's: one `sendto` and one `recvfrom` per request,
/// some `epoll_wait`, and the loopback TCP they drive.
///
/// `received` holds what was read but not yet consumed: it is empty between exchanges on a
/// well-behaved connection, and its allocation is reused.
async fn exchange<S>(stream: &mut S, request: &[u8], received: &mut Vec<u8>) -> anyhow::Result<Response>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if !received.is_empty() {
        return Err(ResponseError::Unsolicited(received.len()).into());
    }
    stream.write_all(request).await.context("cannot send the request")?;
    loop {
        if let Some((response, length)) = frame(received)? {
            // Anything after the response stays, for the next exchange to refuse.
            received.drain(..length);
            return Ok(response);
        }
        received.reserve(READ_BUFFER / 2);
        let read = stream.read_buf(received).await.context("cannot read the response")?;
        if read == 0 {
            return Err(ResponseError::Closed { read: received.len() }.into());
        }
    }
}

/// The bytes of one connection's requests. All but the idempotency key (and a refund's payment id)
/// are the same for every request, so they are built once, and a request is the parts and the
/// key written into one reused buffer.
struct Requests {
    /// The request line up to the end of the path, or for a refund up to the payment id.
    start: Vec<u8>,
    /// For a refund, the rest of the path after the payment id; else nothing.
    path_end: &'static [u8],
    /// The rest of the request line and the headers, up to the idempotency key's value.
    head: Vec<u8>,
    /// The end of the head and the body.
    suffix: Vec<u8>,
    /// The last request built.
    buffer: Vec<u8>,
}

/// A refund's path around the payment id.
const REFUND_PATH: (&str, &str) = ("/v1/payments/", "/refunds");

impl Requests {
    fn new(host: &str, token: &str, workload: Workload) -> anyhow::Result<Self> {
        anyhow::ensure!(is_header_value(host), "the target {host:?} cannot be a Host header");
        anyhow::ensure!(is_header_value(token), "the API key cannot be sent in a header");
        let (path, path_end, body) = match workload {
            Workload::Accept | Workload::Replay(_) => (dataset::PATH, "", dataset::BODY),
            Workload::Refund(_) => (REFUND_PATH.0, REFUND_PATH.1, dataset::REFUND_BODY),
        };
        let start = format!("{method} {path}", method = dataset::METHOD).into_bytes();
        let head = format!(
            " HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {length}\r\nIdempotency-Key: ",
            length = body.len(),
        )
        .into_bytes();
        let suffix = format!("\r\n\r\n{body}").into_bytes();
        // Room for a payment id and the longest key (`u64::MAX` has 20 digits), so the buffer never
        // grows.
        let capacity = start.len() + uuid::fmt::Hyphenated::LENGTH + path_end.len() + head.len() + 20 + suffix.len();
        Ok(Self { start, path_end: path_end.as_bytes(), head, suffix, buffer: Vec::with_capacity(capacity) })
    }

    /// The request with `key`, of `payment` for a refund.
    fn with_key(&mut self, key: u64, payment: Option<Uuid>) -> &[u8] {
        self.buffer.clear();
        self.buffer.extend_from_slice(&self.start);
        if let Some(payment) = payment {
            self.buffer.extend_from_slice(payment.hyphenated().encode_lower(&mut Uuid::encode_buffer()).as_bytes());
            self.buffer.extend_from_slice(self.path_end);
        }
        self.buffer.extend_from_slice(&self.head);
        self.buffer.extend_from_slice(decimal(key, &mut [0; 20]));
        self.buffer.extend_from_slice(&self.suffix);
        &self.buffer
    }
}

/// `n` in decimal, written at the end of `digits` (`u64::MAX` has 20 digits).
fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[start..];
        }
    }
}

/// Whether `value` can go into a header as it is: no line breaks nor other control characters.
fn is_header_value(value: &str) -> bool {
    value.bytes().all(|byte| byte == b'\t' || (byte >= b' ' && byte != 0x7f))
}

/// What the loop needs to know of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Response {
    status: u16,
    /// `Idempotent-Replayed: true` (the first such header, its value exactly `true`).
    replayed: bool,
    /// The server closes the connection after this response.
    close: bool,
}

/// Why bytes from the server are not a response the generator can read. Each is a transport
/// problem: the loop counts it and reconnects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResponseError {
    /// Not HTTP/1.x: the status line or a header does not parse.
    Malformed(httparse::Error),
    /// A `Transfer-Encoding` (chunked) body, which this client does not decode.
    TransferEncoding,
    /// Neither `Content-Length` nor `Transfer-Encoding`: the body would end with the connection.
    NoLength,
    /// A `Content-Length` that is not one decimal number.
    InvalidLength,
    /// An interim (1xx) response: nothing here asks for one.
    Interim(u16),
    /// A head over `MAX_HEAD` or a response over `MAX_RESPONSE` bytes.
    TooLarge,
    /// The server closed the connection having sent `read` bytes of the response.
    Closed { read: usize },
    /// `len` bytes arrived that belong to no request (one request is in flight at a time).
    Unsolicited(usize),
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(error) => write!(f, "a malformed response: {error}"),
            Self::TransferEncoding => {
                f.write_str("a response with a Transfer-Encoding (chunked), which the load generator does not decode")
            }
            Self::NoLength => f.write_str("a response without Content-Length, which the load generator does not read"),
            Self::InvalidLength => f.write_str("a response with an invalid Content-Length"),
            Self::Interim(status) => write!(f, "an interim response ({status}) nobody asked for"),
            Self::TooLarge => write!(f, "a response over {MAX_RESPONSE} bytes or a head over {MAX_HEAD}"),
            Self::Closed { read: 0 } => f.write_str("the server closed the connection before responding"),
            Self::Closed { read } => write!(f, "the server closed the connection after {read} bytes of the response"),
            Self::Unsolicited(len) => write!(f, "{len} bytes after a response, before the next request"),
        }
    }
}

impl std::error::Error for ResponseError {}

/// Finds the response at the start of `bytes`: `None` until all of it has arrived, then the
/// response and how many bytes it takes (what follows is not part of it).
///
/// Understands the status line and headers (parsed by `httparse`), a body framed by
/// `Content-Length` (what the api sends; 204 and 304 have none), `Connection: close` (and HTTP/1.0
/// without keep-alive) and `Idempotent-Replayed: true`. It does not decode `Transfer-Encoding` nor
/// read a body to the end of the connection: such a response is an error, like an interim, a
/// malformed or an oversized one.
fn frame(bytes: &[u8]) -> Result<Option<(Response, usize)>, ResponseError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut headers);
    let head = match parsed.parse(bytes).map_err(ResponseError::Malformed)? {
        httparse::Status::Complete(head) => head,
        httparse::Status::Partial if bytes.len() > MAX_HEAD => return Err(ResponseError::TooLarge),
        httparse::Status::Partial => return Ok(None),
    };
    // A complete parse always has a code and a version.
    let status = parsed.code.unwrap_or_default();
    if (100..200).contains(&status) {
        return Err(ResponseError::Interim(status));
    }
    let mut length = None;
    let mut replayed = None;
    let (mut close, mut keep_alive) = (false, false);
    for header in parsed.headers.iter() {
        let name = header.name;
        if name.eq_ignore_ascii_case("content-length") {
            let value = content_length(header.value)?;
            if length.is_some_and(|known| known != value) {
                return Err(ResponseError::InvalidLength);
            }
            length = Some(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(ResponseError::TransferEncoding);
        } else if name.eq_ignore_ascii_case("connection") {
            for option in header.value.split(|&byte| byte == b',').map(<[u8]>::trim_ascii) {
                close |= option.eq_ignore_ascii_case(b"close");
                keep_alive |= option.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case("idempotent-replayed") && replayed.is_none() {
            replayed = Some(header.value == b"true");
        }
    }
    let body = match status {
        204 | 304 => 0,
        _ => length.ok_or(ResponseError::NoLength)?,
    };
    if head > MAX_HEAD || head.saturating_add(body) > MAX_RESPONSE {
        return Err(ResponseError::TooLarge);
    }
    if bytes.len() < head + body {
        return Ok(None);
    }
    let http_1_0 = parsed.version == Some(0);
    let response = Response { status, replayed: replayed.unwrap_or(false), close: close || (http_1_0 && !keep_alive) };
    Ok(Some((response, head + body)))
}

/// A `Content-Length` value: decimal digits only (no sign, no list).
fn content_length(value: &[u8]) -> Result<usize, ResponseError> {
    let value = value.trim_ascii();
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(ResponseError::InvalidLength);
    }
    std::str::from_utf8(value).ok().and_then(|digits| digits.parse().ok()).ok_or(ResponseError::InvalidLength)
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet, VecDeque};
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    use tokio::io::ReadBuf;
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    use super::*;

    const ACCEPTED: &[u8] = b"HTTP/1.1 202 Accepted\r\ncontent-length: 14\r\ncontent-type: application/json\r\n\
                              \r\n{\"id\":\"pay_1\"}";
    const REPLAYED: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nidempotent-replayed: true\r\n\r\n{}";
    const NO_CONTENT: &[u8] = b"HTTP/1.1 204 No Content\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n";
    const CLOSING: &[u8] = b"HTTP/1.1 202 Accepted\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

    fn expected(status: u16, replayed: bool, close: bool) -> Response {
        Response { status, replayed, close }
    }

    /// A stream whose reads return the given chunks one by one, then the end of the stream, and
    /// which keeps what is written to it.
    struct Scripted {
        reads: VecDeque<Vec<u8>>,
        written: Vec<u8>,
    }

    impl Scripted {
        fn new(reads: &[&[u8]]) -> Self {
            Self { reads: reads.iter().map(|chunk| chunk.to_vec()).collect(), written: Vec::new() }
        }
    }

    impl AsyncRead for Scripted {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if let Some(mut chunk) = self.reads.pop_front() {
                let taken = chunk.len().min(buf.remaining());
                buf.put_slice(&chunk[..taken]);
                if taken < chunk.len() {
                    self.reads.push_front(chunk.split_off(taken));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Scripted {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
            self.written.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    async fn exchange_over(reads: &[&[u8]]) -> (anyhow::Result<Response>, Vec<u8>) {
        let mut stream = Scripted::new(reads);
        let mut received = Vec::new();
        let response = exchange(&mut stream, b"request", &mut received).await;
        (response, received)
    }

    fn response_error(result: anyhow::Result<Response>) -> ResponseError {
        *result.unwrap_err().downcast_ref::<ResponseError>().unwrap()
    }

    #[test]
    fn a_request_is_the_constant_head_the_key_and_the_body() {
        let mut requests = Requests::new("127.0.0.1:8080", "ok_test_secret", Workload::Accept).unwrap();

        let request = requests.with_key(4_294_967_296, None).to_vec();

        assert_eq!(
            String::from_utf8(request).unwrap(),
            format!(
                "POST /v1/payments HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAuthorization: Bearer ok_test_secret\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\nIdempotency-Key: 4294967296\r\n\r\n{}",
                dataset::BODY.len(),
                dataset::BODY
            )
        );
    }

    #[test]
    fn a_refund_names_its_payment_in_the_path_and_sends_the_refund_body() {
        let refundable = Refundable { millis: 0x0192_f0c4_7a3e, first: 0, count: 100 };
        let mut requests = Requests::new("127.0.0.1:8080", "ok_test_secret", Workload::Refund(refundable)).unwrap();
        let allocation = requests.buffer.as_ptr();

        let request = requests.with_key(u64::MAX, Some(refundable.payment_id(99))).to_vec();

        assert_eq!(requests.buffer.as_ptr(), allocation, "the buffer had room for the longest request");
        assert_eq!(
            String::from_utf8(request).unwrap(),
            format!(
                "POST /v1/payments/0192f0c4-7a3e-7000-8000-000000000063/refunds HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
                 Authorization: Bearer ok_test_secret\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Idempotency-Key: 18446744073709551615\r\n\r\n{}",
                dataset::REFUND_BODY.len(),
                dataset::REFUND_BODY
            )
        );
    }

    #[test]
    fn each_request_changes_only_the_key_and_reuses_one_allocation() {
        let mut requests = Requests::new("127.0.0.1:8080", "secret", Workload::Accept).unwrap();
        let first = requests.with_key(7, None).to_vec();
        let allocation = requests.buffer.as_ptr();

        let longest = requests.with_key(u64::MAX, None).to_vec();
        let again = requests.with_key(7, None).to_vec();

        assert_eq!(requests.buffer.as_ptr(), allocation);
        assert_eq!(again, first);
        let text = String::from_utf8(longest).unwrap();
        assert!(text.contains("\r\nIdempotency-Key: 18446744073709551615\r\n\r\n"), "{text}");
        assert!(text.ends_with(dataset::BODY));
        assert_eq!(text.len(), first.len() + 19);
    }

    #[test]
    fn keys_are_written_in_decimal() {
        let cases: [(u64, &str); 6] = [
            (0, "0"),
            (9, "9"),
            (10, "10"),
            (2_654_435_761, "2654435761"),
            (*dataset::FRESH_KEYS.end(), "9223372036854775806"),
            (u64::MAX, "18446744073709551615"),
        ];
        for (key, text) in cases {
            assert_eq!(decimal(key, &mut [0; 20]), text.as_bytes(), "{key}");
        }
    }

    #[test]
    fn a_target_or_token_that_could_break_the_head_is_refused() {
        for (host, token) in [("127.0.0.1:1", "a\r\nX-Evil: 1"), ("127.0.0.1:1\n", "secret"), ("h", "tab\tis\u{7f}")] {
            assert!(Requests::new(host, token, Workload::Accept).is_err(), "{host:?} {token:?}");
        }
        assert!(Requests::new("127.0.0.1:1", "ok_live_abc.DEF-123", Workload::Accept).is_ok());
    }

    #[test]
    fn a_whole_response_is_framed_to_its_last_byte() {
        let cases: [(&[u8], Response); 4] = [
            (ACCEPTED, expected(202, false, false)),
            (REPLAYED, expected(200, true, false)),
            (NO_CONTENT, expected(204, false, false)),
            (CLOSING, expected(202, false, true)),
        ];
        for (bytes, expected) in cases {
            assert_eq!(frame(bytes), Ok(Some((expected, bytes.len()))), "{}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn a_response_is_incomplete_at_every_byte_short_of_its_end() {
        for bytes in [ACCEPTED, REPLAYED, NO_CONTENT, CLOSING] {
            for end in 0..bytes.len() {
                assert_eq!(frame(&bytes[..end]), Ok(None), "{}", String::from_utf8_lossy(&bytes[..end]));
            }
        }
    }

    #[tokio::test]
    async fn a_response_split_across_two_reads_at_any_byte_is_read_whole() {
        for bytes in [ACCEPTED, REPLAYED, NO_CONTENT] {
            for split in 1..bytes.len() {
                let (response, left) = exchange_over(&[&bytes[..split], &bytes[split..]]).await;

                assert_eq!(response.unwrap(), frame(bytes).unwrap().unwrap().0, "split at {split}");
                assert!(left.is_empty());
            }
        }
    }

    #[tokio::test]
    async fn a_response_arriving_a_byte_per_read_is_read_whole() {
        let reads: Vec<&[u8]> = REPLAYED.chunks(1).collect();

        let (response, left) = exchange_over(&reads).await;

        assert_eq!(response.unwrap(), expected(200, true, false));
        assert!(left.is_empty());
    }

    #[tokio::test]
    async fn a_body_that_arrives_after_the_headers_completes_the_response() {
        let head = b"HTTP/1.1 200 OK\r\nIdempotent-Replayed: true\r\nContent-Length: 11\r\n\r\n";

        let (response, left) = exchange_over(&[head, b"{\"id\":", b"\"pa\"}"]).await;

        assert_eq!(response.unwrap(), expected(200, true, false));
        assert!(left.is_empty());
    }

    #[tokio::test]
    async fn the_request_is_written_before_the_response_is_read() {
        let mut stream = Scripted::new(&[ACCEPTED]);
        let mut received = Vec::new();

        exchange(&mut stream, b"POST / HTTP/1.1\r\n\r\n", &mut received).await.unwrap();

        assert_eq!(stream.written, b"POST / HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn header_names_are_matched_whatever_their_case() {
        let bytes = b"HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 2\r\niDeMpOtEnT-rEpLaYeD: true\r\nConnection: Close\r\n\r\n{}";

        assert_eq!(frame(bytes), Ok(Some((expected(200, true, true), bytes.len()))));
    }

    #[test]
    fn only_idempotent_replayed_true_marks_a_replay() {
        let cases: [(&str, bool); 6] = [
            ("", false),
            ("Idempotent-Replayed: true\r\n", true),
            ("Idempotent-Replayed: false\r\n", false),
            ("Idempotent-Replayed: TRUE\r\n", false),
            ("Idempotent-Replayed: true\r\nIdempotent-Replayed: false\r\n", true),
            ("Idempotent-Replayed-Not: true\r\n", false),
        ];
        for (header, replayed) in cases {
            let bytes = format!("HTTP/1.1 200 OK\r\n{header}Content-Length: 0\r\n\r\n");

            let framed = frame(bytes.as_bytes()).unwrap().unwrap();

            assert_eq!(framed.0.replayed, replayed, "{header:?}");
        }
    }

    #[test]
    fn connection_close_and_http_1_0_without_keep_alive_end_the_connection() {
        let cases: [(&str, &str, bool); 6] = [
            ("HTTP/1.1", "", false),
            ("HTTP/1.1", "Connection: keep-alive\r\n", false),
            ("HTTP/1.1", "Connection: close\r\n", true),
            ("HTTP/1.1", "Connection: upgrade ,  CLOSE\r\n", true),
            ("HTTP/1.0", "", true),
            ("HTTP/1.0", "Connection: Keep-Alive\r\n", false),
        ];
        for (version, header, close) in cases {
            let bytes = format!("{version} 202 Accepted\r\n{header}Content-Length: 0\r\n\r\n");

            let framed = frame(bytes.as_bytes()).unwrap().unwrap();

            assert_eq!(framed.0.close, close, "{version} {header:?}");
        }
    }

    #[test]
    fn two_responses_back_to_back_are_framed_apart() {
        let both = [REPLAYED, ACCEPTED].concat();

        let (first, length) = frame(&both).unwrap().unwrap();
        let (second, rest) = frame(&both[length..]).unwrap().unwrap();

        assert_eq!((first, length), (expected(200, true, false), REPLAYED.len()));
        assert_eq!((second, rest), (expected(202, false, false), ACCEPTED.len()));
    }

    #[tokio::test]
    async fn bytes_after_a_response_are_kept_and_refused_by_the_next_exchange() {
        let both = [REPLAYED, ACCEPTED].concat();
        let mut stream = Scripted::new(&[&both]);
        let mut received = Vec::new();

        let first = exchange(&mut stream, b"one", &mut received).await.unwrap();
        let second = exchange(&mut stream, b"two", &mut received).await;

        assert_eq!(first, expected(200, true, false));
        assert_eq!(received, ACCEPTED);
        assert_eq!(response_error(second), ResponseError::Unsolicited(ACCEPTED.len()));
        assert_eq!(stream.written, b"one", "nothing is sent while unsolicited bytes wait");
    }

    #[test]
    fn chunked_and_unbounded_responses_are_refused_not_guessed() {
        let cases: [(&[u8], ResponseError); 6] = [
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
                ResponseError::TransferEncoding,
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\ntransfer-encoding: chunked\r\n\r\n",
                ResponseError::TransferEncoding,
            ),
            (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}", ResponseError::NoLength),
            (b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}", ResponseError::InvalidLength),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", ResponseError::InvalidLength),
            (b"HTTP/1.1 100 Continue\r\n\r\n", ResponseError::Interim(100)),
        ];
        for (bytes, error) in cases {
            assert_eq!(frame(bytes), Err(error), "{}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn garbage_and_oversized_responses_are_refused() {
        let huge_body = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", MAX_RESPONSE);
        let endless_head = [b"HTTP/1.1 200 OK\r\n".as_slice(), &vec![b'x'; MAX_HEAD]].concat();

        assert!(matches!(frame(b"SSH-2.0-OpenSSH\r\n\r\n"), Err(ResponseError::Malformed(_))));
        assert_eq!(frame(huge_body.as_bytes()), Err(ResponseError::TooLarge));
        assert_eq!(frame(&endless_head), Err(ResponseError::TooLarge));
    }

    #[tokio::test]
    async fn a_connection_closed_before_or_during_a_response_is_a_transport_problem() {
        let (before, _) = exchange_over(&[]).await;
        let (during, _) = exchange_over(&[&ACCEPTED[..30]]).await;

        assert_eq!(response_error(before), ResponseError::Closed { read: 0 });
        assert_eq!(response_error(during), ResponseError::Closed { read: 30 });
    }

    /// A request as the in-test server saw it.
    #[derive(Debug)]
    struct Seen {
        method: String,
        path: String,
        headers: HashMap<String, String>,
        body: Vec<u8>,
    }

    /// The first request at the start of `bytes`, and its length, once it has all arrived.
    fn parse_request(bytes: &[u8]) -> Option<(Seen, usize)> {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut request = httparse::Request::new(&mut headers);
        let httparse::Status::Complete(head) = request.parse(bytes).unwrap() else { return None };
        let headers: HashMap<String, String> = request
            .headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8(h.value.to_vec()).unwrap()))
            .collect();
        let length: usize = headers["content-length"].parse().unwrap();
        let body = bytes.get(head..head + length)?.to_vec();
        let seen =
            Seen { method: request.method.unwrap().to_owned(), path: request.path.unwrap().to_owned(), headers, body };
        Some((seen, head + length))
    }

    /// Responds to every request with 202, closing the connection after every third response (with
    /// `Connection: close`), and reports each request and each connection.
    async fn serve(listener: TcpListener, seen: mpsc::UnboundedSender<Seen>, connections: Arc<AtomicUsize>) {
        while let Ok((mut stream, _)) = listener.accept().await {
            connections.fetch_add(1, Ordering::SeqCst);
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                for responded in 1.. {
                    let (request, length) = loop {
                        if let Some(request) = parse_request(&buffer) {
                            break request;
                        }
                        if stream.read_buf(&mut buffer).await.unwrap_or(0) == 0 {
                            return;
                        }
                    };
                    buffer.drain(..length);
                    let _ = seen.send(request);
                    let close = responded % 3 == 0;
                    if stream.write_all(if close { CLOSING } else { ACCEPTED }).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    }

    /// Runs one connection of `workload` for a moment against [`serve`], checks what every request
    /// shares (head, a fresh key each, a reconnection after `Connection: close`), and returns the
    /// requests the server saw.
    async fn one_connection(workload: Workload) -> Vec<Seen> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap();
        let (sender, mut receiver) = mpsc::unbounded_channel();
        let connections = Arc::new(AtomicUsize::new(0));
        let server = tokio::spawn(serve(listener, sender, Arc::clone(&connections)));
        let now = Instant::now();
        let plan = Arc::new(Plan {
            targets: vec![target],
            connections: 1,
            token: "ok_test_secret".into(),
            workload,
            measure_from: now,
            measure_until: now + Duration::from_millis(200),
        });
        let requests = Requests::new(&target.to_string(), &plan.token, plan.workload).unwrap();

        let measured = connection(plan, target, requests).await;
        server.abort();

        let mut seen = Vec::new();
        while let Ok(request) = receiver.try_recv() {
            seen.push(request);
        }
        assert_eq!(measured.errors(), 0, "{:?}", measured.first_problem);
        assert!(measured.completed >= 4, "{} responses", measured.completed);
        assert!(seen.len() as u64 >= measured.completed);
        assert!(connections.load(Ordering::SeqCst) >= 2, "no reconnection after Connection: close");
        let keys: HashSet<&str> = seen.iter().map(|request| request.headers["idempotency-key"].as_str()).collect();
        assert_eq!(keys.len(), seen.len(), "a key was sent twice");
        for request in &seen {
            assert_eq!(request.headers["host"], target.to_string());
            assert_eq!(request.headers["authorization"], "Bearer ok_test_secret");
            assert_eq!(request.headers["content-type"], "application/json");
            let key: u64 = request.headers["idempotency-key"].parse().unwrap();
            assert!(dataset::FRESH_KEYS.contains(&key), "{key}");
        }
        seen
    }

    #[tokio::test]
    async fn a_connection_loop_sends_whole_requests_with_a_new_key_each_and_reconnects_on_close() {
        let seen = one_connection(Workload::Accept).await;

        for request in &seen {
            assert_eq!((request.method.as_str(), request.path.as_str()), ("POST", dataset::PATH));
            assert_eq!(request.headers["content-length"], dataset::BODY.len().to_string());
            assert_eq!(request.body, dataset::BODY.as_bytes());
        }
    }

    #[tokio::test]
    async fn a_connection_of_refunds_refunds_payments_picked_at_random_from_the_refundable_ones() {
        let refundable = Refundable { millis: 0x0192_f0c4_7a3e, first: 1_000, count: 1_000 };
        let ids: HashSet<String> =
            refundable.numbers().map(|n| dataset::refund_path(refundable.payment_id(n))).collect();

        let seen = one_connection(Workload::Refund(refundable)).await;

        for request in &seen {
            assert_eq!(request.method, "POST");
            assert!(ids.contains(&request.path), "{} is not a refund of a refundable payment", request.path);
            assert_eq!(request.headers["content-length"], dataset::REFUND_BODY.len().to_string());
            assert_eq!(request.body, dataset::REFUND_BODY.as_bytes());
        }
        let paths: HashSet<&str> = seen.iter().map(|request| request.path.as_str()).collect();
        assert!(paths.len() > 1, "every refund was of one payment");
    }
}
