//! `oncepay listen`: a small HTTP/1.1 server on which a merchant receives oncepay's deliveries
//! while developing. Each POST is verified with `verify_webhook`, gets a 204 or a 400 response, and
//! is printed as one line; other methods get 405.
//!
//! It only shows deliveries: nothing is stored, acted on or passed on, and a delivery sent twice is
//! shown twice. No TLS: it is for a developer's machine, not for production.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Bytes};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use oncepay_client::webhooks::{WebhookSecret, verify_webhook};
use tokio::net::{TcpListener, TcpStream};

use crate::args::ListenArgs;
use crate::report::Exit;
use crate::say;

/// The largest body accepted: far more than any event needs.
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Serves until the process is interrupted; returns only if it cannot start.
pub async fn run(args: ListenArgs) -> Exit {
    let secrets = match parse_secrets(&args.secrets) {
        Ok(secrets) => secrets,
        Err(message) => {
            eprintln!("error: {message}");
            return Exit::Usage;
        }
    };
    let wanted = SocketAddr::new(args.bind, args.port);
    let listener = match TcpListener::bind(wanted).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: cannot listen on {wanted}: {error}");
            return Exit::Usage;
        }
    };
    // With port 0 the system chooses the port: print the one it chose.
    let address = listener.local_addr().unwrap_or(wanted);
    say(&format!("listening on http://{address}"));

    let secrets: Arc<[WebhookSecret]> = secrets.into();
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                tokio::spawn(serve(stream, secrets.clone()));
            }
            Err(error) => {
                // Usually out of file descriptors: back off a little instead of spinning.
                eprintln!("cannot accept a connection: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Parses every `--secret`; the message never repeats a secret, even a malformed one.
fn parse_secrets(texts: &[String]) -> Result<Vec<WebhookSecret>, String> {
    texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            WebhookSecret::parse(text.trim()).map_err(|error| match texts.len() {
                1 => format!("--secret is not valid: {error}"),
                _ => format!("--secret number {} is not valid: {error}", index + 1),
            })
        })
        .collect()
}

/// Serves one connection: a response to each request, and its line printed first.
async fn serve(stream: TcpStream, secrets: Arc<[WebhookSecret]>) {
    let service = service_fn(move |request| {
        let secrets = secrets.clone();
        async move {
            let (response, line) = receive(&secrets, request).await;
            // Printed before the response is sent: once the sender has the response, the line is out.
            if let Some(line) = line {
                say(&line);
            }
            Ok::<_, Infallible>(response)
        }
    });
    let connection = http1::Builder::new().timer(TokioTimer::new()).serve_connection(TokioIo::new(stream), service);
    if let Err(error) = connection.await {
        eprintln!("a connection ended with an error: {error}");
    }
}

/// The response to one request, and the line to print about it (none for a method other than POST).
async fn receive<B>(secrets: &[WebhookSecret], request: Request<B>) -> (Response<Full<Bytes>>, Option<String>)
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if request.method() != Method::POST {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only POST is accepted");
        response.headers_mut().insert(ALLOW, HeaderValue::from_static("POST"));
        return (response, None);
    }
    let (head, body) = request.into_parts();
    let id = head
        .headers
        .get("webhook-id")
        .and_then(|id| id.to_str().ok())
        .filter(|id| !id.is_empty())
        .map_or_else(|| "-".to_owned(), one_line);
    let refuse = |status, reason: &str| (text(status, reason), Some(format!("refused {id}: {reason}")));
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, "the body is over 1 MiB");
        }
        Err(_) => return refuse(StatusCode::BAD_REQUEST, "the body could not be read"),
    };
    if let Err(error) = verify_webhook(secrets, &head.headers, &body) {
        return refuse(StatusCode::BAD_REQUEST, &error.to_string());
    }
    let event_type = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|event| event.get("type")?.as_str().map(one_line))
        .unwrap_or_else(|| "-".to_owned());
    let line = format!("verified {id} {event_type} {}", one_line(&String::from_utf8_lossy(&body)));
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    (response, Some(line))
}

fn text(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{message}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// `raw` with its control characters escaped: a line per delivery, whatever the sender put in it,
/// and no escape sequences reaching the terminal.
fn one_line(raw: &str) -> String {
    raw.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

#[cfg(test)]
mod tests {
    use time::OffsetDateTime;

    use super::*;

    const BODY: &str = r#"{"type":"payment.succeeded","data":{"id":"pay_1"}}"#;

    fn secret() -> WebhookSecret {
        WebhookSecret::parse("whsec_b25jZXBheSdzIHB1Ymxpc2hlZCB0ZXN0IHNlY3JldCE=").unwrap()
    }

    fn delivery(method: Method, body: impl Into<Bytes>, signed: &[u8]) -> Request<Full<Bytes>> {
        let now = OffsetDateTime::now_utc().unix_timestamp();
        Request::builder()
            .method(method)
            .header("webhook-id", "msg_1")
            .header("webhook-timestamp", now.to_string())
            .header("webhook-signature", secret().sign("msg_1", now, signed))
            .body(Full::new(body.into()))
            .unwrap()
    }

    #[tokio::test]
    async fn each_kind_of_request_gets_its_status_and_line() {
        let too_big = vec![b' '; MAX_BODY_BYTES + 1];
        let cases = [
            (
                "signed",
                delivery(Method::POST, BODY, BODY.as_bytes()),
                StatusCode::NO_CONTENT,
                Some(format!("verified msg_1 payment.succeeded {BODY}")),
            ),
            (
                "changed",
                delivery(Method::POST, "{}", BODY.as_bytes()),
                StatusCode::BAD_REQUEST,
                Some("refused msg_1: no signature matches".to_owned()),
            ),
            (
                "no type",
                delivery(Method::POST, "[1,\n2]", b"[1,\n2]"),
                StatusCode::NO_CONTENT,
                Some(r"verified msg_1 - [1,\n2]".to_owned()),
            ),
            (
                "too big",
                delivery(Method::POST, too_big.clone(), &too_big),
                StatusCode::PAYLOAD_TOO_LARGE,
                Some("refused msg_1: the body is over 1 MiB".to_owned()),
            ),
            ("a GET", delivery(Method::GET, "", b""), StatusCode::METHOD_NOT_ALLOWED, None),
        ];
        for (name, request, status, line) in cases {
            let (response, printed) = receive(&[secret()], request).await;

            assert_eq!(response.status(), status, "{name}");
            assert_eq!(printed, line, "{name}");
        }
    }

    #[test]
    fn a_bad_secret_is_named_by_its_place_and_never_repeated() {
        let good = "whsec_b25jZXBheSdzIHB1Ymxpc2hlZCB0ZXN0IHNlY3JldCE=".to_owned();
        let bad = "whsec_c2hvcnQ=".to_owned();

        let alone = parse_secrets(std::slice::from_ref(&bad)).unwrap_err();
        let second = parse_secrets(&[good.clone(), bad.clone()]).unwrap_err();

        assert!(alone.starts_with("--secret is not valid: a webhook secret must be"), "{alone}");
        assert!(second.starts_with("--secret number 2 is not valid"), "{second}");
        assert!(!alone.contains(&bad) && !second.contains(&bad));
        assert_eq!(parse_secrets(&[good]).map(|secrets| secrets.len()), Ok(1));
    }
}
