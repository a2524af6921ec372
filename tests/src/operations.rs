//! A client of the reconciler's operations API that acts as one operator with a personal token, as
//! a person at a terminal would. [`OperatorClient::admin`] acts as the admin the system bootstrapped
//! with the real CLI; an admin makes the other operators over HTTP, and each of them makes its own
//! token (enrolls with the code the admin got, signs in, issues itself a token), so that four eyes
//! sees two people, not the admin behind both.
//!
//! Every reconciler serves the same API on the same database, so a request goes to the one that
//! last responded and moves on to the next when it cannot be reached. The client only sends
//! requests and reads responses: deciding what an outcome means is the caller's job.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::system::System;

/// How long one request may take. A paused reconciler accepts connections but never responds, so
/// this bounds how long it holds up the caller before the next reconciler is tried.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// An operator of the operations API, with its token.
pub struct OperatorClient {
    token: String,
    urls: Vec<String>,
    http: reqwest::Client,
    /// The index in `urls` of the reconciler that last responded, tried first.
    current: AtomicUsize,
}

/// A request the operations API refused, as its RFC 9457 problem says.
#[derive(Debug, Clone, Deserialize)]
pub struct Problem {
    /// The HTTP status.
    pub status: u16,
    /// What went wrong, for a person.
    #[serde(default)]
    pub detail: String,
}

/// Why a request did not do what it asked.
#[derive(Debug)]
pub enum Failure {
    /// The operations API refused it (a 4xx problem): nothing was done.
    Refused(Problem),
    /// No reconciler responded, or one responded with a server error or a body this client cannot
    /// read: the request may or may not have been done.
    Failed(anyhow::Error),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(problem) => write!(f, "refused with {}: {}", problem.status, problem.detail),
            Self::Failed(error) => write!(f, "{error:#}"),
        }
    }
}

impl std::error::Error for Failure {}

/// What `POST /v1/payments/{id}/retry` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retried {
    /// The payment was sent again.
    Resent,
    /// The resend waits for an approver: the proposal's id.
    Proposed(Uuid),
}

/// What `POST /v1/operators/{name}/tokens` responds with.
#[derive(Deserialize)]
struct IssuedToken {
    token: String,
}

/// What `POST /v1/operators` responds with, of what the client reads.
#[derive(Deserialize)]
struct Created {
    enrollment: Option<Code>,
}

#[derive(Deserialize)]
struct Code {
    code: String,
}

/// How a request proves who it comes from.
enum Credential<'a> {
    Token(&'a str),
    Session(&'a str),
    Nobody,
}

#[derive(Deserialize)]
struct ProposalRef {
    proposal_id: Uuid,
}

#[derive(Deserialize)]
struct Proposed {
    proposal: ProposalRef,
}

impl OperatorClient {
    /// The system's first operator, the admin it bootstrapped when it started.
    pub fn admin(system: &System) -> anyhow::Result<Self> {
        Self::new(system.admin_token().to_owned(), system.operations_urls())
    }

    fn new(token: String, urls: Vec<String>) -> anyhow::Result<Self> {
        ensure!(!urls.is_empty(), "no reconciler serves the operations API");
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(1))
            .timeout(REQUEST_TIMEOUT)
            .build()
            .context("cannot build an HTTP client")?;
        Ok(Self { token, urls, http, current: AtomicUsize::new(0) })
    }

    /// As an admin: creates operator `name` with `role` (`viewer`, `operator`, `approver`, `admin`)
    /// for every tenant, and returns a client acting as it with a token it made itself: it sets its
    /// own password with the enrollment code, signs in, and issues itself the token.
    pub async fn create_operator(&self, name: &str, role: &str, reason: &str) -> Result<Self, Failure> {
        let body = json!({ "name": name, "role": role, "reason": reason });
        let created: Created = read(self.send(Method::POST, "/v1/operators", Some(&body)).await?)?;
        let code = created.enrollment.ok_or_else(|| Failure::Failed(anyhow!("no enrollment code for {name}")))?;
        let password = format!("{name}'s own password, {}", Uuid::new_v4());
        let body = json!({ "name": name, "code": code.code, "password": password });
        self.send_as(Credential::Nobody, Method::POST, "/v1/enrollment", Some(&body)).await?;
        let session = self.sign_in(name, &password).await?;
        let body = json!({ "label": "oncepay-tests", "reason": reason });
        let path = format!("/v1/operators/{name}/tokens");
        let issued: IssuedToken =
            read(self.send_as(Credential::Session(&session), Method::POST, &path, Some(&body)).await?)?;
        self.send_as(Credential::Session(&session), Method::DELETE, "/v1/session", None).await?;
        Self::new(issued.token, self.urls.clone()).map_err(Failure::Failed)
    }

    /// Signs `name` in with `password`: the session cookie's value.
    async fn sign_in(&self, name: &str, password: &str) -> Result<String, Failure> {
        let body = json!({ "name": name, "password": password });
        let mut unreachable = Vec::new();
        for url in &self.urls {
            let response = match self.http.post(format!("{url}/v1/session")).json(&body).send().await {
                Ok(response) => response,
                Err(error) => {
                    unreachable.push(format!("{url}: {error}"));
                    continue;
                }
            };
            let status = response.status();
            let cookie = response
                .headers()
                .get_all(reqwest::header::SET_COOKIE)
                .iter()
                .filter_map(|value| value.to_str().ok()?.strip_prefix("oncepay_session="))
                .filter_map(|value| value.split(';').next())
                .find(|value| !value.is_empty())
                .map(str::to_owned);
            return match cookie {
                Some(cookie) if status.is_success() => Ok(cookie),
                _ => {
                    Err(Failure::Refused(Problem { status: status.as_u16(), detail: format!("{name} cannot sign in") }))
                }
            };
        }
        Err(Failure::Failed(anyhow!("POST /v1/session: no reconciler responded ({})", unreachable.join("; "))))
    }

    /// Retries a dead-lettered payment: resent, or proposed for an approver.
    pub async fn retry(&self, payment_id: Uuid, reason: &str) -> Result<Retried, Failure> {
        let body = json!({ "reason": reason });
        let (status, value) = self.send(Method::POST, &format!("/v1/payments/{payment_id}/retry"), Some(&body)).await?;
        if status == StatusCode::ACCEPTED {
            let proposed: Proposed = read((status, value))?;
            return Ok(Retried::Proposed(proposed.proposal.proposal_id));
        }
        Ok(Retried::Resent)
    }

    /// As an approver: approves another operator's proposal, which does what it proposes.
    pub async fn approve(&self, proposal_id: Uuid, reason: &str) -> Result<(), Failure> {
        self.decide(proposal_id, "approve", reason).await
    }

    /// As an approver: rejects another operator's proposal; nothing is done.
    pub async fn reject(&self, proposal_id: Uuid, reason: &str) -> Result<(), Failure> {
        self.decide(proposal_id, "reject", reason).await
    }

    async fn decide(&self, proposal_id: Uuid, decision: &str, reason: &str) -> Result<(), Failure> {
        let body = json!({ "reason": reason });
        self.send(Method::POST, &format!("/v1/proposals/{proposal_id}/{decision}"), Some(&body)).await.map(drop)
    }

    /// The proposals waiting for an approver, newest first.
    pub async fn pending_proposals(&self) -> Result<Vec<Uuid>, Failure> {
        let waiting: Vec<ProposalRef> = read(self.send(Method::GET, "/v1/proposals?status=pending", None).await?)?;
        Ok(waiting.into_iter().map(|proposal| proposal.proposal_id).collect())
    }

    /// Sends the request to the reconciler that last responded, then to each other one in turn
    /// while none can be reached. A request that timed out may have been done: sending it again is
    /// safe because the operations API refuses what no longer applies (a retry of a payment that
    /// has no open dead letter, a second proposal for one payment, a decided proposal).
    async fn send(&self, method: Method, path: &str, body: Option<&Value>) -> Result<(StatusCode, Value), Failure> {
        self.send_as(Credential::Token(&self.token), method, path, body).await
    }

    /// [`Self::send`] with `credential`: a session's request says it comes from a page of the API's
    /// own origin, as the API asks of a change made with a cookie.
    async fn send_as(
        &self,
        credential: Credential<'_>,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), Failure> {
        let first = self.current.load(Ordering::Relaxed);
        let mut unreachable = Vec::new();
        for offset in 0..self.urls.len() {
            let index = (first + offset) % self.urls.len();
            let mut request = self.http.request(method.clone(), format!("{}{path}", self.urls[index]));
            request = match credential {
                Credential::Token(token) => request.bearer_auth(token),
                Credential::Session(cookie) => request
                    .header(reqwest::header::COOKIE, format!("oncepay_session={cookie}"))
                    .header("sec-fetch-site", "same-origin"),
                Credential::Nobody => request,
            };
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(error) => {
                    unreachable.push(format!("{}: {error}", self.urls[index]));
                    continue;
                }
            };
            self.current.store(index, Ordering::Relaxed);
            let status = response.status();
            let text = response.text().await.map_err(|error| Failure::Failed(error.into()))?;
            let value: Value =
                if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
            if status.is_success() {
                return Ok((status, value));
            }
            let problem = serde_json::from_value(value.clone())
                .unwrap_or_else(|_| Problem { status: status.as_u16(), detail: value.to_string() });
            if status.is_client_error() {
                return Err(Failure::Refused(problem));
            }
            return Err(Failure::Failed(anyhow!("{method} {path}: {status}: {}", problem.detail)));
        }
        Err(Failure::Failed(anyhow!("{method} {path}: no reconciler responded ({})", unreachable.join("; "))))
    }
}

/// Reads a successful response's body as `T`.
fn read<T: DeserializeOwned>((status, value): (StatusCode, Value)) -> Result<T, Failure> {
    serde_json::from_value(value)
        .with_context(|| format!("cannot read a {status} response of the operations API"))
        .map_err(Failure::Failed)
}
