//! `GET /console/sign-in`: the sign-in page, with a password form and, when one is configured,
//! the way to the OpenID provider.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;

use super::notice_of;
use crate::{Chrome, html};
use oncepay_ops::operators::api::OperatorsState;

/// The sign-in page.
#[derive(Template)]
#[template(path = "sign_in.html")]
pub(crate) struct SignInPage {
    pub(super) chrome: Option<Chrome>,
    pub(super) title: String,
    /// Whether an OpenID provider is configured.
    pub(super) oidc: bool,
    /// Why the last attempt was refused.
    pub(super) error: Option<String>,
    /// The name typed last time.
    pub(super) name: String,
    /// Whether anyone may sign in with a local password (without an OpenID provider), so that
    /// enrolling is offered.
    pub(super) everyone_local: bool,
    /// What was just done (`?notice=`), said once.
    pub(super) notice: Option<&'static str>,
}

impl SignInPage {
    pub(crate) fn new(state: &OperatorsState, error: Option<String>, name: String) -> Self {
        Self {
            chrome: None,
            title: "Sign in".to_owned(),
            oidc: state.oidc.is_some(),
            error,
            name,
            everyone_local: state.oidc.is_none(),
            notice: None,
        }
    }
}

/// `GET /console/sign-in`.
pub(crate) async fn sign_in(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    let mut page = SignInPage::new(&state, None, String::new());
    page.notice = notice_of(&request).as_deref().and_then(crate::notice_text);
    html(StatusCode::OK, &page)
}
