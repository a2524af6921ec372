//! The console's pages for one's own account: enrolling (setting one's first password with the code
//! an admin gave, typed or pasted into a form, never carried in a URL), and, signed in, one's
//! account: its tokens, changing one's own password (the old one and a fresh sign-in), and signing
//! out everywhere (which revokes one's tokens too).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::{Chrome, caller_or_sign_in, error_page, html, see_other};
use oncepay_ops::operators::api::signing_in::{self, Via};
use oncepay_ops::operators::api::{OperatorsState, change, connection, problem};
use oncepay_ops::operators::audit::{self, Entry, Outcome};
use oncepay_ops::operators::{sessions, tokens};
use oncepay_ops::render;

/// `GET /console/enroll`.
#[derive(Template)]
#[template(path = "enroll.html")]
struct EnrollPage {
    chrome: Option<Chrome>,
    title: String,
    error: Option<String>,
    name: String,
}

/// `GET /console/enroll`: the form.
pub(super) async fn enroll_page() -> HttpResponse {
    html(
        StatusCode::OK,
        &EnrollPage { chrome: None, title: "Set your password".into(), error: None, name: String::new() },
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EnrollForm {
    name: String,
    code: SecretString,
    password: SecretString,
    repeated: SecretString,
}

/// `POST /console/enroll`: to the sign-in page with a notice, or the form again with why not.
pub(super) async fn enroll_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    form: web::Form<EnrollForm>,
) -> HttpResponse {
    let form = form.into_inner();
    if let Err(refused) = signing_in::refuse_other_sites(&request) {
        return error_page(None, &refused);
    }
    let again = |status: StatusCode, error: String| {
        let page =
            EnrollPage { chrome: None, title: "Set your password".into(), error: Some(error), name: form.name.clone() };
        html(status, &page)
    };
    if form.password.expose_secret() != form.repeated.expose_secret() {
        return again(StatusCode::BAD_REQUEST, "the two passwords differ: type the same one twice".into());
    }
    match signing_in::with_code(&state, &request, &form.name, &form.code, form.password.clone()).await {
        Ok(()) => see_other("/console/sign-in?notice=enrolled"),
        Err(refused) => again(StatusCode::from_u16(refused.status).unwrap_or(StatusCode::UNAUTHORIZED), refused.detail),
    }
}

/// One of the operator's tokens.
struct TokenLine {
    token_id: String,
    label: String,
    created_at: String,
    expires_at: String,
    revoked_at: String,
}

/// `GET /console/account`.
#[derive(Template)]
#[template(path = "account.html")]
struct AccountPage {
    chrome: Option<Chrome>,
    title: String,
    /// Whether they may have a local password (to change it).
    local: bool,
    /// When they signed in, if with a session.
    signed_in: String,
    tokens: Vec<TokenLine>,
}

/// `GET /console/account`: one's own account.
pub(super) async fn account_page(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "account").noticed_by(&request);
    let read = async {
        let mut conn = connection(&state).await?;
        tokens::list(&mut conn, caller.account.operator_id).await.map_err(problem)
    };
    match read.await {
        Ok(list) => {
            let tokens = list
                .into_iter()
                .map(|t| TokenLine {
                    token_id: t.token_id.to_string(),
                    label: t.label,
                    created_at: render::timestamp(t.created_at),
                    expires_at: render::timestamp(t.expires_at),
                    revoked_at: t.revoked_at.map(render::timestamp).unwrap_or_default(),
                })
                .collect();
            let signed_in = match caller.via {
                Via::Session(at) => render::timestamp(at),
                Via::Token | Via::Job => String::new(),
            };
            let local = state.sessions.local.allow(&caller.account.name);
            html(
                StatusCode::OK,
                &AccountPage { chrome: Some(chrome), title: "Your account".into(), local, signed_in, tokens },
            )
        }
        Err(why) => error_page(Some(chrome), &why),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PasswordForm {
    old_password: SecretString,
    password: SecretString,
    repeated: SecretString,
}

/// `POST /console/account/password`: changes one's own password, then to the sign-in page.
pub(super) async fn password_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    form: web::Form<PasswordForm>,
) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "account");
    let form = form.into_inner();
    let outcome = async {
        if form.password.expose_secret() != form.repeated.expose_secret() {
            return Err(oncepay_ops::operator_error::OperatorError::Invalid(
                "the two new passwords differ: type the same one twice".into(),
            ));
        }
        let name = caller.account.name.clone();
        let reason = "changed their own password in the console";
        signing_in::change_own_password(&state, &caller, &name, form.old_password, form.password, reason).await?;
        let mut response = see_other("/console/sign-in?notice=password_changed");
        let (name, value) = signing_in::cleared_session_cookie();
        response.headers_mut().insert(name, value);
        Ok(response)
    };
    let entry = Entry::new("operator.password", Outcome::Done);
    match change(&state, &caller, entry, outcome.await).await {
        Ok(response) => response,
        Err(refused) => error_page(Some(chrome), &refused),
    }
}

/// `POST /console/account/sign-out-everywhere`: ends every session and token of one's own.
pub(super) async fn sign_out_everywhere_form(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "account");
    let ended = async {
        let mut tx = state.pool.begin().await.map_err(|e| problem(anyhow::Error::from(e).into()))?;
        let ended = sessions::sign_out_everywhere(&mut tx, caller.account.operator_id).await.map_err(problem)?;
        let entry = Entry::new("session.sign_out_everywhere", Outcome::Done)
            .detail(serde_json::json!({ "sessions": ended.sessions, "tokens_revoked": ended.tokens }));
        audit::record(&mut tx, &caller.actor(), &entry).await.map_err(problem)?;
        tx.commit().await.map_err(|e| problem(anyhow::Error::from(e).into()))
    };
    match ended.await {
        Ok(()) => {
            let mut response = see_other("/console/sign-in?notice=signed_out_everywhere");
            let (name, value) = signing_in::cleared_session_cookie();
            response.headers_mut().insert(name, value);
            response
        }
        Err(refused) => error_page(Some(chrome), &refused),
    }
}
