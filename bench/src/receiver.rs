//! The events phase's merchant endpoint: a small HTTP/1.1 server on 127.0.0.1, on a thread of its
//! own, that reads each request whole, responds 204 at once and notes when the request arrived.
//!
//! It keeps connections open, as a merchant's server would, so the worker's client reuses them. It
//! checks no signature and keeps no body: it only counts. A request it cannot read (no
//! `Content-Length`, a head too large) closes its connection, and the worker counts a failed attempt.
//! Nothing here starts a process or talks to PostgreSQL.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// The most a request's head may take; the worker's are a few hundred bytes.
const MAX_HEAD: usize = 16 * 1024;

/// The most headers a request may have.
const MAX_HEADERS: usize = 32;

const NO_CONTENT: &[u8] = b"HTTP/1.1 204 No Content\r\n\r\n";

/// A running receiver. Dropping it stops it.
pub struct Receiver {
    address: SocketAddr,
    arrivals: Arc<Mutex<Vec<SystemTime>>>,
    stop: Option<oneshot::Sender<()>>,
}

impl Receiver {
    /// Listens on a free port of 127.0.0.1 and serves from a thread of its own, so that its work is
    /// not on the thread that times the windows.
    pub fn start() -> anyhow::Result<Self> {
        let listener = StdListener::bind(("127.0.0.1", 0)).context("the receiver cannot listen")?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = oneshot::channel();
        let noted = Arc::clone(&arrivals);
        std::thread::Builder::new()
            .name("receiver".into())
            .spawn(move || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener)?;
                    tokio::select! {
                        () = accept(listener, noted) => {}
                        _ = stopped => {}
                    }
                    anyhow::Ok(())
                })
            })
            .context("cannot start the receiver's thread")?;
        Ok(Self { address, arrivals, stop: Some(stop) })
    }

    /// The URL to give an endpoint.
    pub fn url(&self) -> String {
        format!("http://{}/events", self.address)
    }

    /// Requests that arrived from `from` until `until`.
    pub fn received_between(&self, from: SystemTime, until: SystemTime) -> u64 {
        let arrivals = self.arrivals.lock().unwrap_or_else(PoisonError::into_inner);
        arrivals.iter().filter(|&&at| from <= at && at < until).count() as u64
    }

    /// Requests so far.
    pub fn received(&self) -> u64 {
        self.arrivals.lock().unwrap_or_else(PoisonError::into_inner).len() as u64
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn accept(listener: TcpListener, arrivals: Arc<Mutex<Vec<SystemTime>>>) {
    loop {
        if let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, Arc::clone(&arrivals)));
        }
    }
}

/// Serves one connection until the client closes it or sends what this cannot read.
async fn serve(mut stream: TcpStream, arrivals: Arc<Mutex<Vec<SystemTime>>>) {
    let _ = stream.set_nodelay(true);
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = [0; 8192];
    loop {
        let Some(length) = request_length(&buffer) else { return };
        if let Some(length) = length.filter(|length| buffer.len() >= *length) {
            buffer.drain(..length);
            arrivals.lock().unwrap_or_else(PoisonError::into_inner).push(SystemTime::now());
            if stream.write_all(NO_CONTENT).await.is_err() {
                return;
            }
            continue;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(read) => buffer.extend_from_slice(&chunk[..read]),
        }
    }
}

/// The length of the request at the start of `buffer`, head and body, once its head is complete:
/// `Some(None)` while the head is incomplete, `None` for a request this cannot read.
fn request_length(buffer: &[u8]) -> Option<Option<usize>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(buffer).ok()? {
        httparse::Status::Partial => (buffer.len() <= MAX_HEAD).then_some(None),
        httparse::Status::Complete(head) => {
            let mut body = None;
            for header in request.headers.iter() {
                if header.name.eq_ignore_ascii_case("content-length") {
                    body = std::str::from_utf8(header.value).ok()?.trim().parse::<usize>().ok();
                } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
                    return None;
                }
            }
            // A request without a body (no Content-Length) has none.
            let has_body = request.method.is_some_and(|method| method != "GET" && method != "HEAD");
            match (body, has_body) {
                (Some(body), _) => Some(Some(head + body)),
                (None, false) => Some(Some(head)),
                (None, true) => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn each_request_on_a_kept_connection_is_counted_and_answered_204() {
        oncepay_service::tls::install_provider();
        let receiver = Receiver::start().unwrap();
        let client = reqwest::Client::new();
        let from = SystemTime::now();

        for body in ["{}".to_owned(), "x".repeat(40_000)] {
            let response = client.post(receiver.url()).body(body).send().await.unwrap();
            assert_eq!(response.status(), 204);
        }

        assert_eq!(receiver.received(), 2);
        assert_eq!(receiver.received_between(from, SystemTime::now() + Duration::from_secs(1)), 2);
        assert_eq!(receiver.received_between(SystemTime::now() + Duration::from_secs(1), SystemTime::UNIX_EPOCH), 0);
    }

    #[test]
    fn a_head_is_read_whole_before_its_length_is_known() {
        let request = b"POST /events HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello";

        assert_eq!(request_length(&request[..20]), Some(None));
        assert_eq!(request_length(request), Some(Some(request.len())));
        assert_eq!(request_length(b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"), None);
        assert_eq!(request_length(b"POST / HTTP/1.1\r\nhost: x\r\n\r\n"), None);
    }
}
