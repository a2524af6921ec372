//! `oncepay listen`, the real binary: deliveries the reference implementation (the
//! `standardwebhooks` crate) signs are accepted and printed, changed ones are refused, and a bad
//! secret stops it before it listens.

use std::process::Stdio;

use oncepay_client::webhooks::WebhookSecret;
use reqwest::StatusCode;
use standardwebhooks::Webhook;
use time::OffsetDateTime;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

const BODY: &str = r#"{"type":"payment.succeeded","timestamp":"2026-11-22T04:23:01Z","data":{"id":"pay_1"}}"#;

/// A running `oncepay listen` and the lines it prints after the first.
struct Listening {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    url: String,
}

impl Listening {
    /// Starts `oncepay listen` on a port the system chooses and reads the address it printed.
    async fn start(secrets: &[&str]) -> Self {
        let mut child = listen(secrets).stdout(Stdio::piped()).spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next_line().await.unwrap().unwrap();
        let url = first.strip_prefix("listening on ").unwrap_or_else(|| panic!("first line: {first}")).to_owned();
        Self { child, lines, url }
    }

    /// The next line printed.
    async fn line(&mut self) -> String {
        self.lines.next_line().await.unwrap().unwrap()
    }

    async fn stop(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// `oncepay listen --port 0` with these secrets, and none from the environment.
fn listen(secrets: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_oncepay"));
    command.args(["listen", "--port", "0"]).env_remove("ONCEPAY_WEBHOOK_SECRET").kill_on_drop(true);
    for secret in secrets {
        command.args(["--secret", secret]);
    }
    command
}

/// POSTs `body` to `url` as delivery `id`, signed over `signed` with `secret` by the reference
/// implementation; the status and the response body.
async fn deliver(url: &str, secret: &str, id: &str, signed: &str, body: &str) -> (StatusCode, String) {
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let signature = Webhook::new(secret).unwrap().sign(id, now, signed.as_bytes()).unwrap();
    // The client is built without a TLS provider of its own; plain HTTP still asks for one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let response = reqwest::Client::new()
        .post(format!("{url}/webhooks/oncepay"))
        .header("webhook-id", id)
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", signature)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (response.status(), response.text().await.unwrap())
}

#[tokio::test]
async fn listen_accepts_a_delivery_the_reference_signs_and_prints_its_id_type_and_body() {
    let secret = WebhookSecret::generate();
    let mut listening = Listening::start(&[&secret]).await;

    let (status, _) = deliver(&listening.url, &secret, "msg_1", BODY, BODY).await;

    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(listening.line().await, format!("verified msg_1 payment.succeeded {BODY}"));
    listening.stop().await;
}

#[tokio::test]
async fn listen_refuses_a_delivery_whose_body_was_changed_and_says_why() {
    let secret = WebhookSecret::generate();
    let mut listening = Listening::start(&[&secret]).await;
    let changed = BODY.replace("pay_1", "pay_2");

    let (status, reason) = deliver(&listening.url, &secret, "msg_1", BODY, &changed).await;

    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(reason.trim(), "no signature matches");
    assert_eq!(listening.line().await, "refused msg_1: no signature matches");
    listening.stop().await;
}

#[tokio::test]
async fn listen_with_two_secrets_accepts_a_delivery_signed_with_the_second() {
    let (old, new, stranger) = (WebhookSecret::generate(), WebhookSecret::generate(), WebhookSecret::generate());
    let mut listening = Listening::start(&[&old, &new]).await;

    let (with_new, _) = deliver(&listening.url, &new, "msg_1", BODY, BODY).await;
    let new_line = listening.line().await;
    let (with_stranger, _) = deliver(&listening.url, &stranger, "msg_2", BODY, BODY).await;
    let stranger_line = listening.line().await;

    assert_eq!(with_new, StatusCode::NO_CONTENT);
    assert!(new_line.starts_with("verified msg_1 payment.succeeded "), "{new_line}");
    assert_eq!(with_stranger, StatusCode::BAD_REQUEST);
    assert_eq!(stranger_line, "refused msg_2: no signature matches");
    listening.stop().await;
}

#[tokio::test]
async fn listen_with_a_bad_secret_exits_with_a_usage_error_before_listening() {
    let good = WebhookSecret::generate();

    let output = listen(&[&good, "whsec_dG9vIHNob3J0"]).output().await.unwrap();

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--secret number 2 is not valid: a webhook secret must be `whsec_`"), "{stderr}");
    assert!(!stderr.contains("dG9vIHNob3J0"), "the bad secret was repeated: {stderr}");
    assert!(output.stdout.is_empty(), "{}", String::from_utf8_lossy(&output.stdout));
}
