//! Signing in with the organisation's OpenID provider: the authorization code flow with PKCE.
//!
//! [`Oidc::begin`] keeps a random `state`, `nonce` and PKCE verifier (`oidc_sign_ins`, ten minutes,
//! one use) and gives the provider's authorization URL to send the browser to. [`Oidc::finish`]
//! takes the sign-in back by its `state`, exchanges the code for an ID token with the verifier and
//! the client's secret, and checks the token ([`validate`]): its signature against the provider's
//! published keys, its issuer, its audience, its expiry and its nonce. The `sub` it names is the
//! identity an operator is linked to (`operators.oidc_subject`).

use std::time::Duration;

use anyhow::Context as _;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rand::RngCore;
use reqwest::Url;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::PgConnection;

use crate::operator_error::OperatorError;

/// How long a sign-in may take between leaving for the provider and coming back.
const SIGN_IN_TTL: Duration = Duration::from_secs(600);
/// How far the provider's clock may be from ours.
const LEEWAY_SECS: i64 = 60;
/// How long one request to the provider may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// `[operators.oidc]`: the provider and this installation's client at it.
#[derive(Debug, Clone, Deserialize)]
pub struct OidcSettings {
    /// The issuer, exactly as the provider names itself, e.g. `https://login.example.com`.
    pub issuer: String,
    /// This installation's client id at the provider.
    pub client_id: String,
    /// Its secret.
    pub client_secret: SecretString,
    /// Where the provider sends the browser back: the operations API's
    /// `/v1/session/oidc/callback`, as the browser reaches it.
    pub redirect_uri: String,
}

/// Why a sign-in with the provider was refused. Nothing is signed in.
#[derive(Debug, thiserror::Error)]
pub enum Why {
    /// The provider could not be asked.
    #[error("the OpenID provider cannot be reached: {0}")]
    Unreachable(String),
    /// It names itself differently from the issuer configured.
    #[error("the OpenID provider names itself {found:?}, not the configured issuer {expected:?}")]
    Issuer {
        /// What it says.
        found: String,
        /// What was configured.
        expected: String,
    },
    /// The `state` is unknown, used, expired, or not this browser's.
    #[error("this sign-in is unknown, was used already, expired, or was started in another browser: sign in again")]
    State,
    /// The provider refused the code (used, expired, or not issued for this sign-in).
    #[error("the OpenID provider refused the sign-in's code ({0})")]
    Code(String),
    /// The ID token does not check out.
    #[error("the ID token is not valid: {0}")]
    Token(String),
    /// Nobody is linked to the identity.
    #[error("no operator is linked to the identity {0:?}: an admin links it (oidc_subject)")]
    NotLinked(String),
    /// Something failed here.
    #[error(transparent)]
    Failed(#[from] OperatorError),
}

impl Why {
    /// What the audit trail records for a refusal: fixed words, never the provider's or the
    /// request's own.
    pub const fn label(&self) -> &'static str {
        match self {
            Self::Unreachable(_) | Self::Issuer { .. } => "the OpenID provider cannot be used",
            Self::State => "unknown, used, expired or another browser's sign-in",
            Self::Code(_) => "the OpenID provider refused the sign-in or its code",
            Self::Token(_) => "the ID token is not valid",
            Self::NotLinked(_) => "no operator is linked to the identity",
            Self::Failed(_) => "failed",
        }
    }
}

/// What the ID token says, of what oncepay reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Claims {
    /// The identity.
    pub sub: String,
    /// When it expires (seconds since the epoch).
    pub exp: i64,
    /// The nonce of the sign-in it was issued for.
    pub nonce: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Metadata {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
}

#[derive(Debug, Deserialize)]
struct TokenAnswer {
    id_token: String,
}

/// A sign-in on its way to the provider.
pub struct Begun {
    /// Where to send the browser.
    pub url: String,
    /// The `state`, also kept in the browser (a cookie) to tie the way back to it.
    pub state: SecretString,
}

/// The client of one OpenID provider.
pub struct Oidc {
    settings: OidcSettings,
    http: reqwest::Client,
}

impl Oidc {
    /// A client with `settings`.
    pub fn new(settings: OidcSettings) -> Result<Self, OperatorError> {
        oncepay_service::tls::install_provider();
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Self { settings, http })
    }

    async fn metadata(&self) -> Result<Metadata, Why> {
        let url = format!("{}/.well-known/openid-configuration", self.settings.issuer.trim_end_matches('/'));
        let metadata: Metadata = self.get_json(&url).await?;
        if metadata.issuer != self.settings.issuer {
            return Err(Why::Issuer { found: metadata.issuer, expected: self.settings.issuer.clone() });
        }
        Ok(metadata)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, Why> {
        let response = self.http.get(url).send().await.map_err(|e| Why::Unreachable(e.to_string()))?;
        if !response.status().is_success() {
            return Err(Why::Unreachable(format!("GET {url} answered {}", response.status())));
        }
        response.json().await.map_err(|e| Why::Unreachable(format!("GET {url}: {e}")))
    }

    /// Starts a sign-in: keeps its state, nonce and verifier, and returns where to send the browser.
    pub async fn begin(&self, conn: &mut PgConnection) -> Result<Begun, Why> {
        let metadata = self.metadata().await?;
        let (state, nonce, verifier) = (random(), random(), random());
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
        sqlx::query!(
            r#"
            INSERT INTO oidc_sign_ins (state_sha256, nonce, code_verifier, expires_at)
            VALUES ($1, $2, $3, now() + make_interval(secs => $4))
            "#,
            digest(&state),
            nonce,
            verifier,
            SIGN_IN_TTL.as_secs_f64(),
        )
        .execute(&mut *conn)
        .await
        .context("cannot keep the sign-in")
        .map_err(OperatorError::Failed)?;
        // Sign-ins abandoned on the way are not kept past their time.
        sqlx::query!("DELETE FROM oidc_sign_ins WHERE expires_at < now()")
            .execute(conn)
            .await
            .context("cannot forget old sign-ins")
            .map_err(OperatorError::Failed)?;
        let url = Url::parse_with_params(
            &metadata.authorization_endpoint,
            [
                ("response_type", "code"),
                ("client_id", &self.settings.client_id),
                ("redirect_uri", &self.settings.redirect_uri),
                ("scope", "openid"),
                ("state", &state),
                ("nonce", &nonce),
                ("code_challenge", &challenge),
                ("code_challenge_method", "S256"),
            ],
        )
        .map_err(|e| Why::Unreachable(format!("the authorization endpoint is not a URL: {e}")))?;
        Ok(Begun { url: url.into(), state: SecretString::from(state) })
    }

    /// Finishes the sign-in `state` with the provider's `code`: the identity (`sub`) the checked ID
    /// token names. The sign-in is used up either way.
    pub async fn finish(&self, conn: &mut PgConnection, state: &str, code: &str) -> Result<String, Why> {
        let pending = sqlx::query!(
            "DELETE FROM oidc_sign_ins WHERE state_sha256 = $1 AND expires_at > now() RETURNING nonce, code_verifier",
            digest(state),
        )
        .fetch_optional(conn)
        .await
        .context("cannot read the sign-in")
        .map_err(OperatorError::Failed)?
        .ok_or(Why::State)?;
        let metadata = self.metadata().await?;
        let response = self
            .http
            .post(&metadata.token_endpoint)
            .basic_auth(&self.settings.client_id, Some(self.settings.client_secret.expose_secret()))
            .form(&[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", &self.settings.redirect_uri),
                ("code_verifier", &pending.code_verifier),
            ])
            .send()
            .await
            .map_err(|e| Why::Unreachable(e.to_string()))?;
        if !response.status().is_success() {
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            return Err(Why::Code(body["error"].as_str().unwrap_or("no reason given").to_owned()));
        }
        let answer: TokenAnswer = response.json().await.map_err(|e| Why::Token(format!("no ID token: {e}")))?;
        let keys: JwkSet = self.get_json(&metadata.jwks_uri).await?;
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let claims =
            validate(&answer.id_token, &keys, &self.settings.issuer, &self.settings.client_id, &pending.nonce, now)?;
        Ok(claims.sub)
    }
}

/// Checks an ID token: signed with one of `keys` by an asymmetric algorithm, issued by `issuer`
/// for `audience`, not expired at `now` (seconds since the epoch, give or take a minute), and
/// carrying `nonce`.
pub fn validate(
    id_token: &str,
    keys: &JwkSet,
    issuer: &str,
    audience: &str,
    nonce: &str,
    now: i64,
) -> Result<Claims, Why> {
    let bad = |what: String| Why::Token(what);
    let header = jsonwebtoken::decode_header(id_token).map_err(|e| bad(format!("unreadable: {e}")))?;
    if !matches!(
        header.alg,
        Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512 | Algorithm::PS256 | Algorithm::ES256 | Algorithm::EdDSA
    ) {
        return Err(bad(format!("signed with {:?}, which is not accepted", header.alg)));
    }
    let key = match &header.kid {
        Some(kid) => keys.find(kid),
        None => keys.keys.first().filter(|_| keys.keys.len() == 1),
    }
    .ok_or_else(|| bad("signed with a key the provider does not publish".into()))?;
    let key = DecodingKey::from_jwk(key).map_err(|e| bad(format!("the provider's key is unusable: {e}")))?;
    let mut validation = Validation::new(header.alg);
    validation.set_issuer(&[issuer]);
    validation.set_audience(&[audience]);
    // The expiry is checked below, against `now`.
    validation.validate_exp = false;
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    let claims = jsonwebtoken::decode::<Claims>(id_token, &key, &validation).map_err(|e| bad(e.to_string()))?.claims;
    if claims.exp + LEEWAY_SECS < now {
        return Err(bad("expired".into()));
    }
    if claims.nonce.as_deref() != Some(nonce) {
        return Err(bad("it was not issued for this sign-in (nonce)".into()));
    }
    Ok(claims)
}

/// 32 random bytes in base64url: a state, a nonce, or a PKCE verifier (43 characters).
fn random() -> String {
    let mut raw = [0u8; 32];
    rand::rng().fill_bytes(&mut raw);
    URL_SAFE_NO_PAD.encode(raw)
}

fn digest(state: &str) -> Vec<u8> {
    Sha256::digest(state.as_bytes()).to_vec()
}
