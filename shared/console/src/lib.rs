//! The operator console: web pages for people, served under `/console` beside the operations API,
//! on its listener and origin, with the same accounts, roles, approvals and audit trail
//! ([`oncepay_ops`]).
//!
//! Pages are rendered on the server ([`pages`]); every change is a plain form ([`forms`]) that asks
//! for a reason, then for a confirmation that says what will happen, and then does exactly what
//! the JSON API would, through the same functions. The one script ([`assets`]) only refreshes the
//! overview. Every response forbids inline scripts, framing and other origins
//! ([`SECURITY_HEADERS`]); a change made with the session cookie must come from a page of this
//! origin, as everywhere in the API. Customer data travels only in page bodies and POSTed forms,
//! never in a URL.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::DefaultHeaders;
use actix_web::{HttpRequest, HttpResponse, guard, web};
use askama::Template;
use oncepay_http::problem::Problem;

use oncepay_ops::operators::api::signing_in::{self, Caller, caller};
use oncepay_ops::operators::api::{OperatorsState, connection, problem};
use oncepay_ops::operators::{Account, Role};

mod account;
mod admin;
mod assets;
mod bulk;
mod endpoints;
mod forms;
mod pages;
mod provider_view;
mod queries;

/// What every console response carries: no script, style or image from anywhere but here, no
/// inline script, never framed, no referrer sent on, and never kept by a cache (pages hold customer
/// data).
pub(crate) const SECURITY_HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
         form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
];

/// What each notice code left in a URL says.
const NOTICES: [(&str, &str); 20] = [
    ("retried", "Queued to be sent again: the worker sends it with the same key, so it is charged at most once."),
    (
        "refund_retried",
        "The refund is queued to be sent again: the worker sends it with the same key, so the money goes back at most \
         once.",
    ),
    ("proposed", "Proposed: nothing changes until a second operator approves."),
    ("acknowledged", "Acknowledged: the conflict is closed and the payment stays as it was."),
    ("refund_acknowledged", "Acknowledged: the refund's conflict is closed and the refund stays as it was."),
    ("approved", "Approved and done."),
    ("rejected", "Rejected: nothing was done."),
    ("withdrawn", "Withdrawn: nothing was done."),
    ("key_revoked", "Revoked: the key stops working within the api's auth cache time."),
    ("disconnected", "Disconnected: in connect mode the tenant takes no new payments until an account is set."),
    ("operator_created", "Created: they sign in at the OpenID provider as the identity you linked."),
    ("enrolled", "Your password is set: sign in with it."),
    ("password_changed", "Your password is changed, and every session and token of yours has ended: sign in again."),
    ("signed_out_everywhere", "Every session of yours has ended and every token of yours is revoked."),
    ("operator_changed", "Changed: their new role and tenants apply from their next request."),
    ("operator_disabled", "Disabled: they are signed out everywhere and their tokens no longer work."),
    (
        "endpoint_enabled",
        "Started: the deliveries that wait for the endpoint are sent now; replay its dead-lettered ones if the \
         merchant needs them.",
    ),
    ("endpoint_disabled", "Stopped: nothing more is sent to the endpoint until it is started again."),
    ("replayed", "Queued again: each delivery keeps its webhook-id, so the merchant can drop one it already has."),
    ("replayed_none", "Nothing to replay: no delivery matched, so nothing was queued."),
];

/// The words of notice `code`, if the console has one.
pub(crate) fn notice_text(code: &str) -> Option<&'static str> {
    NOTICES.iter().find(|(known, _)| *known == code).map(|(_, text)| *text)
}

/// The console's routes, under `/console`, and the page a browser gets back from the OpenID
/// provider (the operations API answers everyone else on that path).
pub fn configure(config: &mut web::ServiceConfig) {
    let headers = SECURITY_HEADERS.iter().fold(DefaultHeaders::new(), |headers, pair| headers.add(*pair));
    let browser = guard::fn_guard(|ctx| accepts_html(ctx.head().headers()));
    config.route("/v1/session/oidc/callback", web::get().guard(browser).to(oidc_callback));
    config.service(
        web::scope("/console")
            .wrap(headers)
            .route("", web::get().to(pages::overview))
            .route("/", web::get().to(pages::overview))
            .route("/live", web::get().to(pages::live))
            .route("/sign-in", web::get().to(pages::sign_in))
            .route("/sign-in", web::post().to(forms::sign_in))
            .route("/sign-out", web::post().to(forms::sign_out))
            .route("/dead-letters", web::get().to(pages::dead_letters))
            .route("/search", web::post().to(forms::search))
            .route("/payments/{payment_id}", web::get().to(pages::payment))
            .route("/payments/{payment_id}/{action}", web::post().to(forms::act_on_payment))
            .route("/refunds/{refund_id}/{action}", web::post().to(forms::act_on_refund))
            .route("/bulk-retries", web::post().to(bulk::create))
            .route("/bulk-retries/{bulk_retry_id}", web::get().to(bulk::show))
            .route("/proposals", web::get().to(pages::proposals))
            // Before the decisions, which would take `key` for one.
            .route("/proposals/{proposal_id}/key", web::post().to(admin::collect_key_form))
            .route("/proposals/{proposal_id}/{decision}", web::post().to(forms::decide))
            .route("/audit", web::get().to(pages::audit))
            .route("/tenants", web::get().to(admin::tenants_page))
            .route("/tenants", web::post().to(admin::create_tenant_form))
            .route("/tenants/{name}/keys", web::post().to(admin::issue_key_form))
            .route("/tenants/{name}/keys/{key_id}/revoke", web::post().to(admin::revoke_key_form))
            .route("/tenants/{name}/provider-account", web::post().to(admin::connect_form))
            .route("/endpoints", web::get().to(endpoints::endpoints_page))
            // Before the switches, which would take `replay` for one.
            .route("/tenants/{name}/endpoints/{endpoint_id}/replay", web::post().to(endpoints::replay_failed_form))
            .route("/tenants/{name}/endpoints/{endpoint_id}/{switch}", web::post().to(endpoints::switch_form))
            .route("/tenants/{name}/events/{event_id}/replay", web::post().to(endpoints::replay_event_form))
            .route("/operators", web::get().to(admin::operators_page))
            .route("/operators", web::post().to(admin::create_operator_form))
            .route("/operators/{name}", web::post().to(admin::change_operator_form))
            .route("/operators/{name}/disable", web::post().to(admin::disable_operator_form))
            .route("/operators/{name}/enrollment", web::post().to(admin::issue_code_form))
            .route("/enroll", web::get().to(account::enroll_page))
            .route("/enroll", web::post().to(account::enroll_form))
            .route("/account", web::get().to(account::account_page))
            .route("/account/password", web::post().to(account::password_form))
            .route("/account/sign-out-everywhere", web::post().to(account::sign_out_everywhere_form))
            .route("/recon", web::get().to(pages::recon_runs))
            .route("/recon/{run_id}", web::get().to(pages::recon_run))
            .route("/assets/{file}", web::get().to(assets::serve))
            .default_service(web::to(pages::not_found)),
    );
}

/// The frame of every page for a signed-in operator: who they are and what they may do.
#[derive(Debug, Clone)]
pub(crate) struct Chrome {
    /// The operator's name.
    pub(crate) name: String,
    /// Their role.
    pub(crate) role: Role,
    /// The section the page belongs to, for the navigation.
    pub(crate) section: &'static str,
    /// What was just done, said once after a change.
    pub(crate) notice: Option<&'static str>,
    /// Whether they may see every tenant, and so the reconciliation runs, which cover them all.
    pub(crate) every_tenant: bool,
    /// That the worker stopped webhook endpoints of tenants they may see, said at the top of the
    /// page.
    pub(crate) endpoints_stopped: Option<String>,
}

impl Chrome {
    fn of(account: &Account, section: &'static str) -> Self {
        let every_tenant = account.scope == oncepay_ops::operators::Scope::Every;
        Self {
            name: account.name.clone(),
            role: account.role,
            section,
            notice: None,
            every_tenant,
            endpoints_stopped: None,
        }
    }

    /// Whether they may retry, resolve and propose.
    pub(crate) fn can_act(&self) -> bool {
        self.role >= Role::Operator
    }

    /// Whether they may approve and reject others' proposals.
    pub(crate) fn can_approve(&self) -> bool {
        self.role >= Role::Approver
    }

    /// Whether they manage tenants, keys and (of every tenant) operators.
    pub(crate) fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

/// The caller of a console request, or the response that stands instead: the sign-in page for a
/// browser without a session, an error page for anything else (a change from another origin).
async fn caller_or_sign_in(state: &OperatorsState, request: &HttpRequest) -> Result<Caller, HttpResponse> {
    match caller(state, request).await {
        Ok(caller) => Ok(caller),
        Err(refused) if refused.status == StatusCode::UNAUTHORIZED.as_u16() => Err(see_other("/console/sign-in")),
        Err(refused) => Err(error_page(None, &refused)),
    }
}

/// A 303 to `location`, on this origin.
fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther().insert_header((header::LOCATION, location)).finish()
}

/// The page, rendered, with `status`.
fn html(status: StatusCode, page: &impl Template) -> HttpResponse {
    match page.render() {
        Ok(body) => HttpResponse::build(status).content_type("text/html; charset=utf-8").body(body),
        Err(error) => {
            tracing::error!(error = %error, "cannot render a console page");
            HttpResponse::InternalServerError().content_type("text/plain; charset=utf-8").body("cannot render the page")
        }
    }
}

/// A page that says what went wrong, with the problem's status.
fn error_page(chrome: Option<Chrome>, refused: &Problem) -> HttpResponse {
    let status = StatusCode::from_u16(refused.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let page = pages::ErrorPage {
        chrome,
        title: refused.title.clone(),
        detail: refused.detail.clone(),
        refused: status.is_client_error(),
    };
    let mut response = html(status, &page);
    if let Some(secs) = refused.retry_after_secs {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// Whether a request with `headers` comes from a browser that wants a page rather than JSON.
fn accepts_html(headers: &header::HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|value| value.to_str().ok()).is_some_and(|accept| accept.contains("text/html"))
}

/// `GET /v1/session/oidc/callback?code=…&state=…` from a browser: where the OpenID provider sends
/// it back ([`signing_in::oidc_session`]). A page that takes it on to the console, with the session
/// cookie, or one that says why not. A page, not a redirect: the session cookie is
/// `SameSite=Strict`, and a browser sends it only on a navigation that starts from this origin,
/// which a redirect in a chain that began at the provider's site is not.
async fn oidc_callback(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    let signed_in = signing_in::oidc_session(&state, &request).await.map(|session| {
        let page =
            pages::SignedInPage { chrome: None, title: "Signed in".to_owned(), name: session.account.name.clone() };
        signing_in::with_oidc_session(&state, html(StatusCode::OK, &page), &session)
    });
    with_security_headers(signed_in.unwrap_or_else(|refused| error_page(None, &refused)))
}

fn with_security_headers(mut response: HttpResponse) -> HttpResponse {
    for (name, value) in SECURITY_HEADERS {
        response.headers_mut().insert(header::HeaderName::from_static(name), HeaderValue::from_static(value));
    }
    response
}

/// The tenants the caller may see, by name.
async fn visible_tenants(state: &OperatorsState, caller: &Caller) -> Result<Vec<queries::Tenant>, Problem> {
    let mut conn = connection(state).await?;
    let only = caller.account.scope.to_column();
    queries::visible_tenants(&mut conn, only.as_deref()).await.map_err(problem)
}
