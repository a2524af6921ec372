//! [`Client`]: the oncepay HTTP API (`POST /v1/payments`, `GET /v1/payments/{id}`,
//! `POST /v1/payments/{id}/refunds`, `GET /v1/refunds/{id}`, `GET /v1/payments/{id}/refunds`) with
//! retries and long polling.
//!
//! Every attempt at a create sends the intent's own key and body; nothing here makes a key. Every
//! request has a deadline, and following a payment or a refund never spins. The API key lives only
//! in a sensitive header value and is never logged, printed or put into an error.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{RequestBuilder, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::error::{BuildError, Error};
use crate::intent::{IdempotencyKey, PaymentIntent};
use crate::problem::Problem;
use crate::refund_intent::RefundIntent;
use crate::resource::{Created, CreatedRefund, Payment, PaymentId, PaymentStatus, Refund, RefundId, RefundStatus};
use crate::retry::{self, Next, RetryPolicy};

/// The longest long poll the api honours (`Prefer: wait=N`, N ≤ 30).
const MAX_LONG_POLL: Duration = Duration::from_secs(30);

/// How long to pause before re-polling a payment whose status did not move, when the server
/// responded early and sent no `Retry-After`.
const DEFAULT_POLL_PAUSE: Duration = Duration::from_secs(1);

/// A client of one oncepay api, as one tenant.
///
/// Cheap to clone: clones share one connection pool, so one client serves many tasks.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    inner: Arc<Settings>,
}

struct Settings {
    base_url: String,
    authorization: HeaderValue,
    timeout: Duration,
    long_poll: Duration,
    retry: RetryPolicy,
}

/// Configures a [`Client`]: timeouts, long polling and the retry policy.
pub struct ClientBuilder {
    base_url: String,
    api_key: String,
    connect_timeout: Duration,
    timeout: Duration,
    long_poll: Duration,
    retry: RetryPolicy,
}

impl Client {
    /// A client with the default timeouts and retry policy. `base_url` is where the api listens
    /// (e.g. `http://127.0.0.1:8080`), `api_key` the tenant's key (`opk_…`).
    pub fn new(base_url: impl Into<String>, api_key: impl Into<String>) -> Result<Self, BuildError> {
        Self::builder(base_url, api_key).build()
    }

    /// A builder, to change timeouts, long polling or the retry policy.
    pub fn builder(base_url: impl Into<String>, api_key: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            api_key: api_key.into(),
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            long_poll: MAX_LONG_POLL,
            retry: RetryPolicy::default(),
        }
    }

    /// Sends the intent (`POST /v1/payments`), retrying what is safe to retry under its key:
    /// transport failures and timeouts, `408`, `409`, `429`, `500`, `502`, `503` and `504`.
    ///
    /// `Ok` for `202` (accepted) and `200` (a replay of a finished payment); `replayed` says
    /// whether the api had seen the key before. A rejection (`400`, `401`, `404`, `413`, `415`,
    /// `422`, ...) is [`Error::Problem`] at once, with the RFC 9457 details; a failure that
    /// outlasts the retry policy is [`Error::GaveUp`], after which sending the same intent again is
    /// still safe.
    #[tracing::instrument(name = "oncepay.create", skip_all)]
    pub async fn create(&self, intent: &PaymentIntent) -> Result<Created, Error> {
        let url = format!("{}/v1/payments", self.inner.base_url);
        let response = self.post_once(&url, intent.key(), intent.body()).await?;
        Ok(Created { payment: response.decode()?, replayed: response.replayed() })
    }

    /// The payment as it stands now (`GET /v1/payments/{id}`), retrying transient failures.
    #[tracing::instrument(name = "oncepay.get", skip_all, fields(payment.id = %id))]
    pub async fn get(&self, id: &PaymentId) -> Result<Payment, Error> {
        self.poll(&self.payment_url(id), Duration::ZERO, None).await?.decode()
    }

    /// Sends the refund intent (`POST /v1/payments/{id}/refunds`), retrying exactly what
    /// [`create`](Self::create) retries, under the intent's own key and body.
    ///
    /// `Ok` for `202` (accepted) and `200` (a replay of a finished refund). A refusal is
    /// [`Error::Problem`] at once: `404` (no such payment), `409 payment-not-refundable` (the
    /// payment has not succeeded; not retried, unlike a `409` for a key in use), `422
    /// nothing-to-refund` or `refund-exceeds-payment` (the detail says how much is left), `422
    /// idempotency-key-reused`, or a `400` with the field errors.
    #[tracing::instrument(name = "oncepay.refund", skip_all, fields(payment.id = %intent.payment_id()))]
    pub async fn refund(&self, intent: &RefundIntent) -> Result<CreatedRefund, Error> {
        let url = format!("{}/refunds", self.payment_url(intent.payment_id()));
        let response = self.post_once(&url, intent.key(), intent.body()).await?;
        Ok(CreatedRefund { refund: response.decode()?, replayed: response.replayed() })
    }

    /// The refund as it stands now (`GET /v1/refunds/{id}`), retrying transient failures.
    #[tracing::instrument(name = "oncepay.get_refund", skip_all, fields(refund.id = %id))]
    pub async fn get_refund(&self, id: &RefundId) -> Result<Refund, Error> {
        self.poll(&self.refund_url(id), Duration::ZERO, None).await?.decode()
    }

    /// Follows the refund with long polls until it is `succeeded` or `failed`, or `max_total` has
    /// passed, and returns it as last seen, as [`wait_for_terminal`](Self::wait_for_terminal)
    /// does for a payment.
    pub async fn wait_for_refund(&self, id: &RefundId, max_total: Duration) -> Result<Refund, Error> {
        self.follow(&self.refund_url(id), None, max_total, |_| {}).await
    }

    /// Like [`wait_for_refund`](Self::wait_for_refund), calling `on_change` with the refund each
    /// time its status is seen to move (the first response included).
    pub async fn watch_refund(
        &self,
        id: &RefundId,
        max_total: Duration,
        on_change: impl FnMut(&Refund),
    ) -> Result<Refund, Error> {
        self.follow(&self.refund_url(id), None, max_total, on_change).await
    }

    /// The payment's refunds, oldest first (`GET /v1/payments/{id}/refunds`), retrying transient
    /// failures; `404` for a payment the tenant does not have.
    #[tracing::instrument(name = "oncepay.list_refunds", skip_all, fields(payment.id = %id))]
    pub async fn list_refunds(&self, id: &PaymentId) -> Result<Vec<Refund>, Error> {
        let url = format!("{}/refunds", self.payment_url(id));
        let list: RefundList = self.poll(&url, Duration::ZERO, None).await?.decode()?;
        Ok(list.data)
    }

    /// Follows the payment with long polls until it is `succeeded` or `failed`, or `max_total` has
    /// passed, and returns it as last seen. Check [`PaymentStatus::is_terminal`]: after
    /// `max_total` it may still be `pending` or `processing`, or `unknown` / `dead_lettered`, which
    /// can take much longer to settle — how long to keep waiting is the caller's call.
    pub async fn wait_for_terminal(&self, id: &PaymentId, max_total: Duration) -> Result<Payment, Error> {
        self.follow(&self.payment_url(id), None, max_total, |_| {}).await
    }

    /// Like [`wait_for_terminal`](Self::wait_for_terminal), calling `on_change` with the payment
    /// each time its status is seen to move (the first response included).
    pub async fn watch(
        &self,
        id: &PaymentId,
        max_total: Duration,
        on_change: impl FnMut(&Payment),
    ) -> Result<Payment, Error> {
        self.follow(&self.payment_url(id), None, max_total, on_change).await
    }

    /// Sends the intent and follows the payment for up to `max_wait`: [`create`](Self::create)
    /// then [`wait_for_terminal`](Self::wait_for_terminal). On any error, send the same intent
    /// again: it cannot charge twice.
    pub async fn pay(&self, intent: &PaymentIntent, max_wait: Duration) -> Result<Payment, Error> {
        let created = self.create(intent).await?;
        if created.payment.status.is_terminal() {
            return Ok(created.payment);
        }
        self.follow(&self.payment_url(&created.payment.id), Some(created.payment.status), max_wait, |_| {}).await
    }

    fn payment_url(&self, id: &PaymentId) -> String {
        format!("{}/v1/payments/{id}", self.inner.base_url)
    }

    fn refund_url(&self, id: &RefundId) -> String {
        format!("{}/v1/refunds/{id}", self.inner.base_url)
    }

    /// One idempotent create at `url`: every attempt reads the key and the body given, never
    /// others.
    async fn post_once(&self, url: &str, key: &IdempotencyKey, body: &str) -> Result<Success, Error> {
        self.send(None, || {
            self.http
                .post(url)
                .timeout(self.inner.timeout)
                .header("Idempotency-Key", key.as_str())
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_owned())
        })
        .await
    }

    /// Polls the payment or refund at `url` until it is terminal or `max_total` has passed. A
    /// re-poll goes out at once only when the status moved or the server held the poll; otherwise
    /// after its `Retry-After`.
    #[tracing::instrument(name = "oncepay.follow", skip_all)]
    async fn follow<T: Followed>(
        &self,
        url: &str,
        mut known: Option<T::Status>,
        max_total: Duration,
        mut on_change: impl FnMut(&T),
    ) -> Result<T, Error> {
        let deadline = Instant::now() + max_total;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            // Whole seconds: `Prefer: wait=N` takes an integer, and rounding down keeps within
            // the caller's budget.
            let wait = Duration::from_secs(self.inner.long_poll.min(remaining).as_secs());
            let asked_at = Instant::now();
            let response = self.poll(url, wait, Some(deadline)).await?;
            let followed: T = response.decode()?;

            let status = followed.status();
            let moved = known != Some(status);
            if moved {
                on_change(&followed);
            }
            known = Some(status);
            if followed.is_terminal() || Instant::now() >= deadline {
                return Ok(followed);
            }
            let held = !wait.is_zero() && asked_at.elapsed() >= wait;
            if !moved && !held {
                // Nothing moved yet the server did not hold the poll (it does not long-poll, or
                // the status went there and back): pace by its Retry-After rather than spin.
                let pause = response.retry_after.unwrap_or(DEFAULT_POLL_PAUSE);
                tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            }
        }
    }

    /// One `GET` of `url`, held by the server for up to `wait` (`Prefer: wait=N`) unless `wait` is
    /// zero, with retries that stop at `deadline`.
    async fn poll(&self, url: &str, wait: Duration, deadline: Option<Instant>) -> Result<Success, Error> {
        let prefer = (!wait.is_zero()).then(|| format!("wait={}", wait.as_secs()));
        self.send(deadline, || {
            // Every request has a deadline: the time the server was asked to hold it, plus the
            // request timeout.
            let request = self.http.get(url).timeout(wait + self.inner.timeout);
            match &prefer {
                Some(prefer) => request.header("Prefer", prefer),
                None => request,
            }
        })
        .await
    }

    /// Sends the request `build` makes until it succeeds, is rejected, or the retry policy (or
    /// `deadline`) says stop. The wait before a retry is never shorter than the server's
    /// `Retry-After`.
    async fn send(&self, deadline: Option<Instant>, build: impl Fn() -> RequestBuilder) -> Result<Success, Error> {
        let policy = &self.inner.retry;
        let mut attempt = 1;
        loop {
            let request = build().header(AUTHORIZATION, self.inner.authorization.clone());
            let failure = match attempt_once(request).await {
                Ok(response) => return Ok(response),
                Err(failure) => failure,
            };
            if !failure.retryable {
                return Err(failure.error);
            }
            let delay = match policy.next(attempt, failure.retry_after, &mut rand::rng()) {
                Next::RetryAfter(delay) if deadline.is_none_or(|deadline| Instant::now() + delay < deadline) => delay,
                _ => return Err(Error::GaveUp { attempts: attempt, last: Box::new(failure.error) }),
            };
            // The client's only log line: never the key, an idempotency key or a body.
            tracing::warn!(
                attempt,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                http.status = failure.error.status(),
                "oncepay request failed, will retry"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base_url", &self.inner.base_url)
            .field("api_key", &"<redacted>")
            .field("timeout", &self.inner.timeout)
            .field("long_poll", &self.inner.long_poll)
            .field("retry", &self.inner.retry)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// How long to wait for a connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for a whole response (default 10 s); a long poll gets this on top of the
    /// time the server is asked to hold it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long each long poll asks the server to hold (default and maximum 30 s; whole seconds).
    pub fn long_poll(mut self, wait: Duration) -> Self {
        self.long_poll = wait.clamp(Duration::from_secs(1), MAX_LONG_POLL);
        self
    }

    /// When and how to retry (default [`RetryPolicy::default`]).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The client.
    pub fn build(self) -> Result<Client, BuildError> {
        let base_url = parse_base_url(&self.base_url)?;
        if self.api_key.is_empty() {
            return Err(BuildError::InvalidApiKey);
        }
        let mut authorization =
            HeaderValue::from_str(&format!("Bearer {}", self.api_key)).map_err(|_| BuildError::InvalidApiKey)?;
        authorization.set_sensitive(true);

        install_tls_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            // The api never redirects; following one could only send the key somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("oncepay-client/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(BuildError::Http)?;
        Ok(Client {
            http,
            inner: Arc::new(Settings {
                base_url,
                authorization,
                timeout: self.timeout,
                long_poll: self.long_poll,
                retry: self.retry,
            }),
        })
    }
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("long_poll", &self.long_poll)
            .field("retry", &self.retry)
            .finish()
    }
}

/// A successful response, read in full.
struct Success {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
    retry_after: Option<Duration>,
}

impl Success {
    fn decode<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|source| Error::Decode { status: self.status.as_u16(), source })
    }

    /// Whether the api had seen the request's key before (`Idempotent-Replayed: true`).
    fn replayed(&self) -> bool {
        self.headers.get("Idempotent-Replayed").is_some_and(|value| value.as_bytes() == b"true")
    }
}

/// A resource followed by long polls until it is final.
trait Followed: DeserializeOwned {
    /// Its kind's status.
    type Status: Copy + PartialEq;

    /// Where it stands.
    fn status(&self) -> Self::Status;

    /// Whether it is final.
    fn is_terminal(&self) -> bool;
}

impl Followed for Payment {
    type Status = PaymentStatus;

    fn status(&self) -> PaymentStatus {
        self.status
    }

    fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }
}

impl Followed for Refund {
    type Status = RefundStatus;

    fn status(&self) -> RefundStatus {
        self.status
    }

    fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }
}

/// The body of `GET /v1/payments/{id}/refunds`.
#[derive(Deserialize)]
struct RefundList {
    data: Vec<Refund>,
}

/// One failed attempt, and whether another may follow.
struct Failure {
    error: Error,
    retryable: bool,
    retry_after: Option<Duration>,
}

async fn attempt_once(request: RequestBuilder) -> Result<Success, Failure> {
    let transport = |error: reqwest::Error| Failure {
        // Timeouts, refused or dropped connections, a body cut off: the request may or may not
        // have arrived, and the idempotency key makes asking again safe. Only a request that
        // could not be built is final.
        retryable: !error.is_builder(),
        error: Error::Http(error),
        retry_after: None,
    };
    let response = request.send().await.map_err(transport)?;
    let status = response.status();
    let headers = response.headers().clone();
    let retry_after = retry::retry_after(&headers, SystemTime::now());
    let body = response.bytes().await.map_err(transport)?.to_vec();
    if status.is_success() {
        return Ok(Success { status, headers, body, retry_after });
    }
    let problem = Problem::from_response(status, &body);
    Err(Failure {
        retryable: retry::is_retryable(status, &problem),
        error: Error::Problem { status: status.as_u16(), problem },
        retry_after,
    })
}

fn parse_base_url(raw: &str) -> Result<String, BuildError> {
    let invalid = |reason: &str| BuildError::InvalidBaseUrl { reason: reason.to_owned() };
    let url = reqwest::Url::parse(raw).map_err(|error| invalid(&error.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("credentials belong in the API key, not the URL"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("no query or fragment"));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// reqwest is built without a default TLS crypto provider; install ring's unless the embedding
/// program already chose one.
fn install_tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Fails only if another thread installed one first, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_normalised_and_checked() {
        let cases = [
            ("http://127.0.0.1:8080", Some("http://127.0.0.1:8080")),
            ("http://127.0.0.1:8080/", Some("http://127.0.0.1:8080")),
            ("https://pay.example.com/oncepay/", Some("https://pay.example.com/oncepay")),
            ("127.0.0.1:8080", None),
            ("ftp://example.com", None),
            ("http://user:pw@example.com", None),
            ("http://example.com/?x=1", None),
        ];
        for (raw, expected) in cases {
            assert_eq!(parse_base_url(raw).ok().as_deref(), expected, "{raw}");
        }
    }

    #[test]
    fn an_api_key_a_header_cannot_carry_is_refused() {
        for key in ["", "opk_a\nb"] {
            assert!(matches!(Client::new("http://127.0.0.1:1", key), Err(BuildError::InvalidApiKey)), "{key:?}");
        }
    }

    #[test]
    fn the_long_poll_stays_within_what_the_api_honours() {
        let builder = |wait| Client::builder("http://127.0.0.1:1", "k").long_poll(wait);

        assert_eq!(builder(Duration::from_secs(300)).long_poll, MAX_LONG_POLL);
        assert_eq!(builder(Duration::ZERO).long_poll, Duration::from_secs(1));
    }
}
