//! The operator CLI's side of the operations API: sends a command's request with the operator's
//! personal token (or, to enroll, sign in and change a password, with none or with the session a
//! sign-in opened) and turns the response back into the report or the failure the CLI prints.
//!
//! `main` builds it from `ONCEPAY_OPS_URL` and `ONCEPAY_OPS_TOKEN`; nothing here reads the
//! environment. A problem response keeps its `detail` as the message and maps its status to the
//! CLI's exit codes (400 → 2, 404 → 3, 409 → 4, 401 and 403 → 5); an unreachable API is a failure (1).

use std::time::Duration;

use anyhow::Context as _;
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::operator_error::OperatorError;
use crate::render::Report;

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A client of one operations API, acting with one credential.
pub struct OpsClient {
    base: String,
    credential: Credential,
    http: reqwest::Client,
}

/// What a request proves who it comes from with.
enum Credential {
    /// A personal token.
    Token(SecretString),
    /// The session cookie a sign-in set.
    Session(SecretString),
    /// Nothing: enrolling and signing in.
    Nobody,
}

/// A response: its status and its JSON body (`null` when it has none).
pub struct ApiResponse {
    /// The status.
    pub status: StatusCode,
    /// The body.
    pub body: Value,
}

impl ApiResponse {
    /// The body read as `T`.
    pub fn into<T: DeserializeOwned>(self) -> Result<T, OperatorError> {
        serde_json::from_value(self.body)
            .context("the operations API responded in an unexpected shape")
            .map_err(OperatorError::Failed)
    }

    /// The body read as the report `T`, ready to print.
    pub fn report<T: DeserializeOwned + Report + 'static>(self) -> Result<Box<dyn Report>, OperatorError> {
        Ok(Box::new(self.into::<T>()?))
    }
}

impl OpsClient {
    /// A client of the API at `base` (e.g. `http://127.0.0.1:8083`) with `token`.
    pub fn new(base: &str, token: SecretString) -> Result<Self, OperatorError> {
        Self::with(base, Credential::Token(token))
    }

    /// A client of the API at `base` with no credential, to enroll or sign in.
    pub fn anonymous(base: &str) -> Result<Self, OperatorError> {
        Self::with(base, Credential::Nobody)
    }

    fn with(base: &str, credential: Credential) -> Result<Self, OperatorError> {
        oncepay_service::tls::install_provider();
        let http = reqwest::Client::builder()
            .build()
            .context("cannot build the HTTP client")
            .map_err(OperatorError::Failed)?;
        Ok(Self { base: base.trim_end_matches('/').to_owned(), credential, http })
    }

    /// Signs `name` in with `password` (`POST /v1/session`): a client acting with the new session.
    pub async fn sign_in(&self, name: &str, password: &SecretString) -> Result<Self, OperatorError> {
        let body = serde_json::json!({ "name": name, "password": password.expose_secret() });
        let response = self
            .http
            .post(format!("{}/v1/session", self.base))
            .json(&body)
            .timeout(TIMEOUT)
            .send()
            .await
            .with_context(|| format!("cannot reach the operations API at {}", self.base))
            .map_err(OperatorError::Failed)?;
        let cookie = response
            .headers()
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok()?.strip_prefix("oncepay_session="))
            .filter_map(|value| value.split(';').next())
            .find(|value| !value.is_empty())
            .map(|value| SecretString::from(value.to_owned()));
        let status = response.status();
        if let (true, Some(cookie)) = (status.is_success(), cookie) {
            return Self::with(&self.base, Credential::Session(cookie));
        }
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let detail =
            body["detail"].as_str().map_or_else(|| format!("the operations API responded {status}"), str::to_owned);
        Err(match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => OperatorError::Forbidden(detail),
            StatusCode::BAD_REQUEST => OperatorError::Invalid(detail),
            _ => OperatorError::Failed(anyhow::anyhow!("{detail}")),
        })
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<ApiResponse, OperatorError> {
        self.send(Method::GET, path, &[], None).await
    }

    /// `GET path?query`.
    pub async fn get_with(&self, path: &str, query: &[(&str, String)]) -> Result<ApiResponse, OperatorError> {
        self.send(Method::GET, path, query, None).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<ApiResponse, OperatorError> {
        self.send(Method::POST, path, &[], Some(body)).await
    }

    /// `PATCH path` with a JSON body.
    pub async fn patch(&self, path: &str, body: &Value) -> Result<ApiResponse, OperatorError> {
        self.send(Method::PATCH, path, &[], Some(body)).await
    }

    /// `PUT path` with a JSON body.
    pub async fn put(&self, path: &str, body: &Value) -> Result<ApiResponse, OperatorError> {
        self.send(Method::PUT, path, &[], Some(body)).await
    }

    /// `DELETE path` with a JSON body.
    pub async fn delete(&self, path: &str, body: &Value) -> Result<ApiResponse, OperatorError> {
        self.send(Method::DELETE, path, &[], Some(body)).await
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<ApiResponse, OperatorError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url).query(query).timeout(TIMEOUT);
        request = match &self.credential {
            Credential::Token(token) => request.bearer_auth(token.expose_secret()),
            // The API takes a change with a cookie only from a page of its own origin, against
            // cross-site forgery in browsers; the CLI is no browser, and says it comes from there.
            Credential::Session(cookie) => request
                .header(reqwest::header::COOKIE, format!("oncepay_session={}", cookie.expose_secret()))
                .header("sec-fetch-site", "same-origin"),
            Credential::Nobody => request,
        };
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach the operations API at {}", self.base))
            .map_err(OperatorError::Failed)?;
        let status = response.status();
        let bytes =
            response.bytes().await.context("the operations API's response broke off").map_err(OperatorError::Failed)?;
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap_or(Value::Null) };
        if status.is_success() {
            return Ok(ApiResponse { status, body });
        }
        let detail =
            body["detail"].as_str().map_or_else(|| format!("the operations API responded {status}"), str::to_owned);
        Err(match status {
            StatusCode::BAD_REQUEST => OperatorError::Invalid(detail),
            StatusCode::NOT_FOUND => OperatorError::NotFound(detail),
            StatusCode::CONFLICT => OperatorError::Refused(detail),
            StatusCode::UNAUTHORIZED if matches!(self.credential, Credential::Token(_)) => {
                OperatorError::Forbidden(format!(
                    "the operations API refused the token: set ONCEPAY_OPS_TOKEN to a personal token that is \
                     neither revoked nor expired ({detail})"
                ))
            }
            StatusCode::UNAUTHORIZED => OperatorError::Forbidden(detail),
            StatusCode::FORBIDDEN => OperatorError::Forbidden(detail),
            _ => OperatorError::Failed(anyhow::anyhow!("{detail}")),
        })
    }
}
