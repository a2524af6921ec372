//! Who a request acts as: a personal token (`Authorization: Bearer oot_…`), or the session cookie a
//! sign-in set. Also the routes that sign in and out, enroll (set one's first password with a
//! code), and change one's own password.
//!
//! Every request of the break-glass account (when an OpenID provider is configured) is recorded in
//! the audit trail as a use of it, but for a page refreshing itself.
//!
//! A request that carries a token is judged by the token alone. A request judged by its cookie that
//! could change something (any method but GET and HEAD) must come from a page of this origin:
//! `Sec-Fetch-Site: same-origin`, or, from a browser that does not send it, an `Origin` equal to
//! this server's. Anything else is refused with a 403 problem and changes nothing.

use actix_web::http::header::{self, AUTHORIZATION, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::{HttpRequest, HttpResponse, web};
use anyhow::Context as _;
use oncepay_http::problem::{Problem, ProblemType};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::json;
use time::OffsetDateTime;

use super::{OperatorsState, body, change, connection, ok, problem, respond};
use crate::dead_letters::actions::require_reason;
use crate::operator_error::OperatorError;
use crate::operators::Account;
use crate::operators::accounts;
use crate::operators::audit::{self, Actor, Entry, Outcome};
use crate::operators::enrollment;
use crate::operators::oidc::Why;
use crate::operators::sessions::{self, COOKIE, Refused, Use};
use crate::operators::tokens;

/// The header a console page's own script sends when it refreshes the page in the background.
const BACKGROUND: &str = "oncepay-background";

/// How a caller proved who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A personal token.
    Token,
    /// A session, signed in at this time.
    Session(OffsetDateTime),
    /// A bulk retry, acting for the operator who confirmed it.
    Job,
}

/// The operator a request acts as, how they proved it, and where the request came from.
pub struct Caller {
    pub account: Account,
    pub via: Via,
    pub source: Option<String>,
}

impl Caller {
    pub fn actor(&self) -> Actor<'_> {
        Actor::of(&self.account, self.source.as_deref())
    }

    /// Refuses a session whose sign-in is older than `fresh`: approving moves money, so the person
    /// must have proved who they are a moment ago. A token is judged by itself.
    pub fn require_fresh(&self, fresh: std::time::Duration, to: &str) -> Result<(), OperatorError> {
        let Via::Session(signed_in_at) = self.via else { return Ok(()) };
        if OffsetDateTime::now_utc() - signed_in_at <= fresh {
            return Ok(());
        }
        Err(OperatorError::Forbidden(format!(
            "to {to} takes a fresh sign-in: sign in again (yours is older than {} minutes)",
            fresh.as_secs().div_ceil(60)
        )))
    }
}

/// Who can act with a credential `caller` makes for `owner`: the caller, or, when they make one for
/// themselves, whoever made the credential they make it with.
pub(super) fn made_by(caller: &Caller, owner: &Account) -> uuid::Uuid {
    if caller.account.operator_id == owner.operator_id { caller.account.made_by } else { caller.account.operator_id }
}

fn source(request: &HttpRequest) -> Option<String> {
    request.peer_addr().map(|peer| peer.ip().to_string())
}

/// The caller, from the request's bearer token or session cookie; a 401 problem for a missing,
/// unknown, revoked or expired token or session, or a disabled operator, the same answer for each;
/// a 403 problem for a cookie on a change from another origin.
pub async fn caller(state: &OperatorsState, request: &HttpRequest) -> Result<Caller, Problem> {
    let refused = || {
        Problem::new(
            ProblemType::Unauthorized,
            "sign in (POST /v1/session), or send an operator token: Authorization: Bearer oot_…",
        )
    };
    let bearer = request.headers().get(AUTHORIZATION).and_then(|value| value.to_str().ok());
    if let Some(bearer) = bearer {
        let presented = bearer.strip_prefix("Bearer ").map(str::trim).ok_or_else(refused)?;
        let mut conn = connection(state).await?;
        let account = tokens::authenticate(&mut conn, presented).await.map_err(problem)?.ok_or_else(refused)?;
        let caller = Caller { account, via: Via::Token, source: source(request) };
        break_glass_use(state, &mut conn, &caller, request).await?;
        return Ok(caller);
    }
    let cookie = session_cookie(request).ok_or_else(refused)?;
    if !matches!(*request.method(), Method::GET | Method::HEAD) && !same_origin(request) {
        return Err(cross_origin());
    }
    let mut conn = connection(state).await?;
    // A page that refreshes itself says so: it must not keep an unattended session from ending.
    let used = if request.headers().contains_key(BACKGROUND) { Use::InTheBackground } else { Use::ByThePerson };
    let (account, signed_in_at) = sessions::authenticate(&mut conn, cookie.expose_secret(), state.sessions.idle, used)
        .await
        .map_err(problem)?
        .ok_or_else(refused)?;
    let caller = Caller { account, via: Via::Session(signed_in_at), source: source(request) };
    if used == Use::ByThePerson {
        break_glass_use(state, &mut conn, &caller, request).await?;
    }
    Ok(caller)
}

/// Records a request of the break-glass account: what it asked, and how it proved who it is.
async fn break_glass_use(
    state: &OperatorsState,
    conn: &mut sqlx::PgConnection,
    caller: &Caller,
    request: &HttpRequest,
) -> Result<(), Problem> {
    if !state.sessions.local.is_break_glass(&caller.account.name) {
        return Ok(());
    }
    let via = if caller.via == Via::Token { "token" } else { "session" };
    let entry = Entry::new("break_glass.use", Outcome::Done)
        .detail(json!({ "method": request.method().as_str(), "path": request.path(), "via": via }));
    audit::record(conn, &caller.actor(), &entry).await.map_err(problem)
}

fn cross_origin() -> Problem {
    Problem::new(
        ProblemType::Forbidden,
        "a change with a session cookie must come from a page of this origin; nothing was done",
    )
}

/// The session cookie's value, if the request has one.
fn session_cookie(request: &HttpRequest) -> Option<SecretString> {
    cookie(request, COOKIE)
}

/// The value of cookie `wanted`, if the request has it.
fn cookie(request: &HttpRequest, wanted: &str) -> Option<SecretString> {
    request
        .headers()
        .get_all(header::COOKIE)
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == wanted)
        .map(|(_, value)| SecretString::from(value.to_owned()))
}

/// Whether the request comes from a page of this server's own origin.
fn same_origin(request: &HttpRequest) -> bool {
    let headers = request.headers();
    if let Some(site) = headers.get("sec-fetch-site").and_then(|value| value.to_str().ok()) {
        return site == "same-origin";
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|value| value.to_str().ok()) else { return false };
    let info = request.connection_info();
    origin == format!("{}://{}", info.scheme(), info.host())
}

fn set_cookie(value: &str, max_age_secs: u64) -> (header::HeaderName, HeaderValue) {
    let cookie = format!("{COOKIE}={value}; Path=/; Max-Age={max_age_secs}; HttpOnly; Secure; SameSite=Strict");
    (header::SET_COOKIE, HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static("")))
}

/// The cookie that ties a sign-in at the OpenID provider to the browser that started it. `Lax`, not
/// `Strict`: the browser comes back from the provider's site, and must bring it.
const OIDC_STATE: &str = "oncepay_oidc_state";

fn set_state_cookie(value: &str, max_age_secs: u64) -> (header::HeaderName, HeaderValue) {
    let cookie =
        format!("{OIDC_STATE}={value}; Path=/v1/session/oidc; Max-Age={max_age_secs}; HttpOnly; Secure; SameSite=Lax");
    (header::SET_COOKIE, HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static("")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    name: String,
    password: SecretString,
}

/// `POST /v1/session` `{name, password}`: 201 with the session cookie, 401 for a wrong name or
/// password, 429 while the name is locked after too many refusals. Refused from another site.
pub(super) async fn sign_in(state: web::Data<OperatorsState>, request: HttpRequest, bytes: web::Bytes) -> HttpResponse {
    respond(
        async {
            refuse_other_sites(&request)?;
            let asked: SignIn = body(&bytes).map_err(problem)?;
            let session = with_password(&state, &request, &asked.name, asked.password).await?;
            let a = &session.account;
            let mut response = ok(
                StatusCode::CREATED,
                &json!({ "name": a.name, "role": a.role, "expires_at": session.expires_at.unix_timestamp() }),
            );
            let (name, value) = session_cookie_header(&state, &session);
            response.headers_mut().insert(name, value);
            Ok(response)
        }
        .await,
    )
}

/// Refuses a sign-in posted from another site's page: it would sign the browser in as someone
/// else. A browser names the page's site or origin; a program (curl, a script) names neither.
pub fn refuse_other_sites(request: &HttpRequest) -> Result<(), Problem> {
    let headers = request.headers();
    let site = headers.get("sec-fetch-site").and_then(|value| value.to_str().ok());
    let from_a_page = site.is_some() || headers.contains_key(header::ORIGIN);
    if from_a_page && site != Some("none") && !same_origin(request) {
        return Err(cross_origin());
    }
    Ok(())
}

/// Signs `name` in with a local password: the new session, or a 401 problem for a wrong name or
/// password and a 429 while the name is locked.
pub async fn with_password(
    state: &OperatorsState,
    request: &HttpRequest,
    name: &str,
    password: SecretString,
) -> Result<sessions::NewSession, Problem> {
    let source = source(request);
    let signed_in =
        sessions::sign_in(&state.pool, &state.hashing, name, password, source.as_deref(), &state.sessions).await;
    signed_in.map_err(|refused| refusal(state, refused))
}

/// The problem for a refused sign-in or enrollment: 401, 429 with how long the lock lasts, 400 for a
/// password that cannot be used, 503 while too much is checked at once.
pub(super) fn refusal(state: &OperatorsState, refused: Refused) -> Problem {
    match refused {
        Refused::Wrong => {
            let mut detail = Refused::Wrong.to_string();
            if state.oidc.is_some() {
                detail.push_str(
                    " (with the organisation's OpenID provider configured, only the break-glass account signs in \
                     with a password)",
                );
            }
            Problem::new(ProblemType::Unauthorized, detail)
        }
        limited @ (Refused::Locked(window) | Refused::TooMany(window)) => {
            Problem::new(ProblemType::RateLimited, limited.to_string()).with_retry_after(window.as_secs())
        }
        Refused::Failed(error) => problem(error),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Enrollment {
    name: String,
    code: SecretString,
    password: SecretString,
}

/// `POST /v1/enrollment` `{name, code, password}`: sets the operator's own first password with the
/// code an admin gave them (204); 401 for a wrong, used or expired code, 429 while locked.
/// Refused from another site.
pub(super) async fn enroll(state: web::Data<OperatorsState>, request: HttpRequest, bytes: web::Bytes) -> HttpResponse {
    respond(
        async {
            refuse_other_sites(&request)?;
            let asked: Enrollment = body(&bytes).map_err(problem)?;
            with_code(&state, &request, &asked.name, &asked.code, asked.password).await?;
            Ok(HttpResponse::NoContent().finish())
        }
        .await,
    )
}

/// Enrolls `name` with `code`: a problem for a refusal.
pub async fn with_code(
    state: &OperatorsState,
    request: &HttpRequest,
    name: &str,
    code: &SecretString,
    password: SecretString,
) -> Result<(), Problem> {
    let source = source(request);
    let enrolled =
        enrollment::enroll(&state.pool, &state.hashing, name, code, password, source.as_deref(), &state.sessions).await;
    enrolled.map_err(|refused| match refused {
        Refused::Wrong => Problem::new(
            ProblemType::Unauthorized,
            "wrong name or code, or the code expired or was used: ask an admin for a fresh one",
        ),
        other => refusal(state, other),
    })
}

/// The `Set-Cookie` header that carries a new session.
pub fn session_cookie_header(
    state: &OperatorsState,
    session: &sessions::NewSession,
) -> (header::HeaderName, HeaderValue) {
    set_cookie(session.cookie.expose_secret(), state.sessions.max.as_secs())
}

/// The `Set-Cookie` header that clears the session cookie.
pub fn cleared_session_cookie() -> (header::HeaderName, HeaderValue) {
    set_cookie("", 0)
}

/// `DELETE /v1/session`: ends this session and clears its cookie (204).
pub(super) async fn sign_out(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    respond(
        async {
            end_session(&state, &request).await?;
            let mut response = HttpResponse::NoContent().finish();
            let (name, value) = cleared_session_cookie();
            response.headers_mut().insert(name, value);
            Ok(response)
        }
        .await,
    )
}

/// Ends the request's session, if it has one, and records the sign-out.
pub async fn end_session(state: &OperatorsState, request: &HttpRequest) -> Result<(), Problem> {
    let caller = caller(state, request).await?;
    let mut conn = connection(state).await?;
    if let Some(cookie) = session_cookie(request) {
        sessions::sign_out(&mut conn, cookie.expose_secret()).await.map_err(problem)?;
    }
    audit::record(&mut conn, &caller.actor(), &Entry::new("session.sign_out", Outcome::Done)).await.map_err(problem)
}

/// `DELETE /v1/session/everywhere`: ends every session of the caller (204).
pub(super) async fn sign_out_everywhere(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let mut tx =
                state.pool.begin().await.context("cannot start a transaction").map_err(|e| problem(e.into()))?;
            let ended = sessions::sign_out_everywhere(&mut tx, caller.account.operator_id).await.map_err(problem)?;
            let entry = Entry::new("session.sign_out_everywhere", Outcome::Done)
                .detail(json!({ "sessions": ended.sessions, "tokens_revoked": ended.tokens }));
            audit::record(&mut tx, &caller.actor(), &entry).await.map_err(problem)?;
            tx.commit().await.context("cannot commit").map_err(|e| problem(e.into()))?;
            let mut response = HttpResponse::NoContent().finish();
            let (name, value) = cleared_session_cookie();
            response.headers_mut().insert(name, value);
            Ok(response)
        }
        .await,
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewPassword {
    old_password: SecretString,
    password: SecretString,
    reason: String,
}

/// `PUT /v1/operators/{name}/password` `{old_password, password, reason}`: one's own, from a session
/// signed in within `fresh_sign_in_secs`, with the old password; ends every session and token of
/// theirs (204, clearing the cookie). Nobody sets another operator's: an admin of every tenant
/// issues them an enrollment code instead.
pub(super) async fn set_password(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let entry = Entry::new("operator.password", Outcome::Done);
            let outcome = async {
                own_only(&caller, &path)?;
                let asked: NewPassword = body(&bytes)?;
                let reason = require_reason(&asked.reason)?;
                change_own_password(&state, &caller, &path, asked.old_password, asked.password, reason).await?;
                let mut response = HttpResponse::NoContent().finish();
                let (name, value) = cleared_session_cookie();
                response.headers_mut().insert(name, value);
                Ok(response)
            };
            change(&state, &caller, entry, outcome.await).await
        }
        .await,
    )
}

/// Refuses a password change of anyone but the caller.
fn own_only(caller: &Caller, name: &str) -> Result<(), OperatorError> {
    if caller.account.name == name {
        return Ok(());
    }
    Err(OperatorError::Forbidden(format!(
        "nobody sets another operator's password: an admin of every tenant issues {name} an enrollment code \
         (POST /v1/operators/{name}/enrollment)"
    )))
}

/// Changes `caller`'s own password (`name` must be theirs), from a fresh session, with the old one.
pub async fn change_own_password(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    old: SecretString,
    new: SecretString,
    reason: &str,
) -> Result<sessions::Ended, OperatorError> {
    own_only(caller, name)?;
    if !matches!(caller.via, Via::Session(_)) {
        return Err(OperatorError::Forbidden(
            "changing a password takes a fresh sign-in with the password, not a token: sign in (POST /v1/session) \
             and change it from that session"
                .into(),
        ));
    }
    caller.require_fresh(state.fresh_sign_in, "change your password")?;
    let source = caller.source.as_deref();
    let change = sessions::PasswordChange { old, new, reason };
    sessions::change_password(&state.pool, &state.hashing, &caller.account, change, source, &state.sessions).await
}

fn no_provider() -> Problem {
    Problem::new(ProblemType::NotFound, "no OpenID provider is configured ([operators.oidc]): sign in with a password")
}

/// `GET /v1/session/oidc`: 303 to the OpenID provider's sign-in, with a cookie tying the way back
/// to this browser.
pub(super) async fn oidc_begin(state: web::Data<OperatorsState>) -> HttpResponse {
    respond(
        async {
            let oidc = state.oidc.as_ref().ok_or_else(no_provider)?;
            let mut conn = connection(&state).await?;
            let begun = oidc.begin(&mut conn).await.map_err(|why| {
                tracing::warn!(error = %why, "cannot start a sign-in with the OpenID provider");
                Problem::new(ProblemType::ServiceUnavailable, why.to_string())
            })?;
            let mut response = HttpResponse::SeeOther().insert_header((header::LOCATION, begun.url)).finish();
            let (name, value) = set_state_cookie(begun.state.expose_secret(), 600);
            response.headers_mut().insert(name, value);
            Ok(response)
        }
        .await,
    )
}

#[derive(Deserialize)]
struct Callback {
    state: Option<String>,
    code: Option<String>,
    error: Option<String>,
}

/// The session of a browser the OpenID provider sent back to `GET /v1/session/oidc/callback?code=…&state=…`.
/// The state must be this browser's and unused; the ID token must check out; its identity must be
/// linked to an operator. Otherwise a 401 problem, recorded in the audit trail (503 for the
/// provider's own trouble).
pub async fn oidc_session(state: &OperatorsState, request: &HttpRequest) -> Result<sessions::NewSession, Problem> {
    let oidc = state.oidc.as_ref().ok_or_else(no_provider)?;
    let back: Callback = super::query(request)?;
    let source = source(request);
    let mut conn = connection(state).await?;
    // Refusals are recorded under no name: the way back carries nothing an operator typed.
    let nobody = Actor { operator_id: None, name: OIDC_SIGN_IN, source: source.as_deref() };
    sessions::admit(&mut conn, source.as_deref(), &state.sessions.limits, &nobody, "session.sign_in")
        .await
        .map_err(|refused| refusal(state, refused))?;
    let outcome = async {
        // The state must be the one this browser left with, not one an attacker sent it back with.
        let (Some(returned), Some(kept)) = (back.state, cookie(request, OIDC_STATE)) else { return Err(Why::State) };
        if kept.expose_secret() != returned {
            return Err(Why::State);
        }
        if let Some(error) = back.error {
            return Err(Why::Code(error));
        }
        let code = back.code.ok_or(Why::State)?;
        let subject = oidc.finish(&mut conn, &returned, &code).await?;
        let account = accounts::find_by_subject(&mut conn, &subject).await?.ok_or(Why::NotLinked(subject))?;
        sessions::readmit(&mut conn, source.as_deref()).await?;
        Ok(sessions::open(&mut conn, account, source.as_deref(), &state.sessions, "oidc").await?)
    };
    match outcome.await {
        Ok(session) => Ok(session),
        Err(Why::Failed(error)) => Err(problem(error)),
        // The provider's trouble: the person was not refused.
        Err(why @ (Why::Unreachable(_) | Why::Issuer { .. })) => {
            Err(Problem::new(ProblemType::ServiceUnavailable, format!("sign-in failed: {why}")))
        }
        Err(why) => {
            // Fixed words only; the identity the provider vouched for, when it got that far.
            let mut detail = json!({ "method": "oidc", "refusal": why.label() });
            if let Why::NotLinked(subject) = &why {
                detail["subject"] = json!(subject.chars().take(255).collect::<String>());
            }
            let entry = Entry::new("session.sign_in", Outcome::Refused).detail(detail);
            audit::record(&mut conn, &nobody, &entry).await.map_err(problem)?;
            Err(Problem::new(ProblemType::Unauthorized, format!("sign-in refused: {why}")))
        }
    }
}

/// The name a refused sign-in at the OpenID provider is recorded under.
const OIDC_SIGN_IN: &str = "(OpenID sign-in)";

/// `response`, carrying the session a sign-in at the OpenID provider opened, and clearing the
/// cookie that tied the sign-in to the browser.
pub fn with_oidc_session(
    state: &OperatorsState,
    mut response: HttpResponse,
    session: &sessions::NewSession,
) -> HttpResponse {
    let (name, value) = set_cookie(session.cookie.expose_secret(), state.sessions.max.as_secs());
    response.headers_mut().append(name, value);
    let (name, value) = set_state_cookie("", 0);
    response.headers_mut().append(name, value);
    response
}
