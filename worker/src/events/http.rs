//! Sending one delivery over HTTP: the Standard Webhooks request, signed with every current secret,
//! to an address the rules allow, without following redirects, reading a few KiB of the answer.
//!
//! The client resolves names through [`GuardedResolver`], which hands the connection only the
//! addresses [`endpoint_url::address_allowed`] accepts: the address checked is the address
//! connected to, so a name that resolves to a public address when checked and a private one when
//! used (DNS rebinding) cannot reach the private one. A URL that names an address is checked
//! before the request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER, USER_AGENT};
use time::OffsetDateTime;

use oncepay_domain::endpoint_url::{self, UrlPolicy};
use oncepay_store::merchant_deliveries::{Attempt, ClaimedDelivery};

use super::message::Signed;
use super::verdict::Outcome;

/// The most bytes of a response read and kept.
pub const MAX_RESPONSE_BYTES: usize = 4096;

/// The HTTP client deliveries go out through.
#[derive(Clone)]
pub struct Sender {
    client: reqwest::Client,
    policy: UrlPolicy,
    timeout: Duration,
}

impl Sender {
    /// A client with `timeout` for the whole attempt, no redirects, and the address rules of
    /// `policy`.
    pub fn new(timeout: Duration, policy: UrlPolicy) -> anyhow::Result<Self> {
        oncepay_service::tls::install_provider();
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(GuardedResolver { policy }))
            .build()?;
        Ok(Self { client, policy, timeout })
    }

    /// The longest one attempt takes, from the first byte sent to the last byte read.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Makes one attempt of `claimed`, signed at `now`; what the endpoint answered, as the verdict
    /// and the record need it.
    pub async fn send(&self, claimed: &ClaimedDelivery, now: OffsetDateTime) -> (Outcome, Attempt) {
        let mut attempt = Attempt { attempted_at: now, status: None, response: String::new(), error: None };
        let outcome = match self.try_send(claimed, now, &mut attempt).await {
            Ok(outcome) => outcome,
            Err(error) => {
                attempt.error = Some(error);
                Outcome::NoAnswer
            }
        };
        (outcome, attempt)
    }

    async fn try_send(
        &self,
        claimed: &ClaimedDelivery,
        now: OffsetDateTime,
        attempt: &mut Attempt,
    ) -> Result<Outcome, String> {
        let url = endpoint_url::check(&claimed.url, self.policy).map_err(|refusal| refusal.to_string())?;
        let signed = Signed::of(claimed, now)?;
        let mut response = self
            .client
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header(USER_AGENT, concat!("oncepay-webhooks/", env!("CARGO_PKG_VERSION")))
            .header("webhook-id", signed.id)
            .header("webhook-timestamp", signed.timestamp.to_string())
            .header("webhook-signature", signed.signature)
            .body(signed.body)
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = response.status().as_u16();
        attempt.status = Some(status);
        let retry_after = retry_after(response.headers());
        let mut head = Vec::new();
        // A body that breaks off is still an answer: the status is what counts.
        while head.len() < MAX_RESPONSE_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => head.extend_from_slice(&chunk[..chunk.len().min(MAX_RESPONSE_BYTES - head.len())]),
                Ok(None) | Err(_) => break,
            }
        }
        attempt.response = String::from_utf8_lossy(&head).into_owned();
        Ok(Outcome::Answered { status, retry_after })
    }
}

/// A `Retry-After` given in seconds.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok().map(Duration::from_secs)
}

/// What went wrong with a request, in words, with its causes.
fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    let mut words = format!("the request {kind}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        words.push_str(": ");
        words.push_str(&cause.to_string());
        source = cause.source();
    }
    words
}

/// Resolves a name to the addresses it may be delivered to, and fails when there are none.
struct GuardedResolver {
    policy: UrlPolicy,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> =
                found.iter().copied().filter(|a| endpoint_url::address_allowed(a.ip(), policy)).collect();
            if allowed.is_empty() {
                let error = format!(
                    "{host} resolves only to addresses oncepay does not deliver to ({})",
                    found.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>().join(", ")
                );
                return Err(error.into());
            }
            let addrs: Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}
