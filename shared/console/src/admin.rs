//! The console's administration: tenants with their API keys and provider accounts, and the
//! operators with their roles and tenants.
//!
//! Everyone may list the tenants they may see; changes are offered to admins only, and refused by
//! the same functions the JSON API calls for anyone else. Like every change in the console, each
//! asks for a reason, then for a confirmation that says what will happen. Creating a tenant, issuing
//! a key and connecting a provider account are proposals a second operator approves on the proposals
//! page; the proposer then collects the key there, and it is shown on the page that follows, once,
//! and never travels in a URL.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use anyhow::Context as _;
use askama::Template;
use oncepay_http::problem::{Problem, ProblemType};
use serde::Deserialize;
use uuid::Uuid;

use super::forms::{Confirmation, ask_to_confirm, finish};
use super::{Chrome, caller_or_sign_in, error_page, html, see_other, visible_tenants};
use oncepay_ops::operator_error::OperatorError;
use oncepay_ops::operators::accounts::{self, NewOperator, OperatorView};
use oncepay_ops::operators::api::signing_in::Caller;
use oncepay_ops::operators::api::tenants::{connect_account, propose_key, propose_tenant, revoke_key_of};
use oncepay_ops::operators::api::{
    OperatorsState, change_operator, connection, disable, fresh_code, make_operator, manage_operators, problem,
};
use oncepay_ops::operators::audit::{Entry, Outcome};
use oncepay_ops::operators::enrollment::IssuedCode;
use oncepay_ops::operators::proposals;
use oncepay_ops::operators::reports::Acted;
use oncepay_ops::operators::{Role, Scope};
use oncepay_ops::render;
use oncepay_ops::tenants::{self, IssuedKey, KeyView, TenantView};

/// The fields of every administration form; which count depends on the change.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AdminForm {
    #[serde(default)]
    reason: String,
    /// `yes` once the operator has read what will happen.
    confirmed: Option<String>,
    name: Option<String>,
    role: Option<String>,
    /// Tenant names, separated by commas or spaces; empty for every tenant.
    tenants: Option<String>,
    oidc_subject: Option<String>,
    provider_account: Option<String>,
}

impl AdminForm {
    fn field(value: Option<&String>) -> Option<&str> {
        value.map(|v| v.trim()).filter(|v| !v.is_empty())
    }

    /// The fields to post again with the confirmation.
    fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![("reason", self.reason.clone()), ("confirmed", "yes".to_owned())];
        let optional = [
            ("name", &self.name),
            ("role", &self.role),
            ("tenants", &self.tenants),
            ("oidc_subject", &self.oidc_subject),
            ("provider_account", &self.provider_account),
        ];
        fields.extend(optional.into_iter().filter_map(|(name, value)| value.clone().map(|value| (name, value))));
        fields
    }

    fn role(&self) -> Result<Role, OperatorError> {
        let text = Self::field(self.role.as_ref()).unwrap_or_default();
        text.parse()
            .map_err(|_| OperatorError::Invalid(format!("{text:?} is not a role: viewer, operator, approver or admin")))
    }

    /// The tenants named, or `None` for every tenant.
    fn tenants(&self) -> Option<Vec<String>> {
        let names: Vec<String> = Self::field(self.tenants.as_ref())?
            .split([',', ' '])
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect();
        (!names.is_empty()).then_some(names)
    }
}

/// One tenant on the tenants page.
struct TenantLine {
    tenant: TenantView,
    keys: Vec<KeyLine>,
}

/// One API key of a tenant.
struct KeyLine {
    key_id: String,
    created_at: String,
    revoked: String,
}

impl From<KeyView> for KeyLine {
    fn from(key: KeyView) -> Self {
        Self {
            key_id: key.key_id,
            created_at: render::timestamp(key.created_at),
            revoked: key.revoked_at.map(render::timestamp).unwrap_or_default(),
        }
    }
}

/// `GET /console/tenants`.
#[derive(Template)]
#[template(path = "tenants.html")]
struct TenantsPage {
    chrome: Option<Chrome>,
    title: String,
    tenants: Vec<TenantLine>,
    /// Whether the operator may change tenants, keys and accounts.
    admin: bool,
    /// Whether they may create tenants (an admin of every tenant).
    creates: bool,
}

/// `GET /console/tenants`: the tenants the operator may see, their keys and provider accounts.
pub(super) async fn tenants_page(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "tenants").noticed_by(&request);
    let read = async {
        let visible = visible_tenants(&state, &caller).await?;
        let mut conn = connection(&state).await?;
        let all = tenants::list(&mut conn).await.map_err(problem)?.0;
        let mut lines = Vec::new();
        for tenant in all.into_iter().filter(|t| visible.iter().any(|v| v.name == t.name)) {
            let keys = tenants::keys(&mut conn, &tenant.name).await.map_err(problem)?;
            lines.push(TenantLine { tenant, keys: keys.into_iter().map(KeyLine::from).collect() });
        }
        Ok(lines)
    };
    match read.await {
        Ok(tenants) => {
            let admin = caller.account.role == Role::Admin;
            let creates = admin && caller.account.scope == Scope::Every;
            html(
                StatusCode::OK,
                &TenantsPage { chrome: Some(chrome), title: "Tenants".into(), tenants, admin, creates },
            )
        }
        Err(why) => error_page(Some(chrome), &why),
    }
}

/// The page that shows a new API key, once.
#[derive(Template)]
#[template(path = "key_issued.html")]
struct KeyIssuedPage {
    chrome: Option<Chrome>,
    title: String,
    issued: IssuedKey,
}

/// A change the administration pages ask for.
enum AdminChange {
    CreateTenant,
    IssueKey(String),
    CollectKey(Uuid),
    RevokeKey(String, String),
    Connect(String),
    CreateOperator,
    ChangeOperator(String),
    DisableOperator(String),
    IssueCode(String),
}

impl AdminChange {
    fn audit_action(&self) -> &'static str {
        match self {
            Self::CreateTenant => "tenant.create",
            Self::IssueKey(_) | Self::CollectKey(_) => "key.issue",
            Self::RevokeKey(..) => "key.revoke",
            Self::Connect(_) => "tenant.connect",
            Self::CreateOperator => "operator.create",
            Self::ChangeOperator(_) => "operator.update",
            Self::DisableOperator(_) => "operator.disable",
            Self::IssueCode(_) => "operator.enrollment",
        }
    }

    /// What it will do, in words.
    fn will(&self, form: &AdminForm) -> Vec<String> {
        let name = AdminForm::field(form.name.as_ref()).unwrap_or_default();
        let tenants = form.tenants().map_or_else(|| "every tenant".to_owned(), |t| t.join(", "));
        match self {
            Self::CreateTenant => vec![
                format!("You propose a new tenant, {name}, with its first API key."),
                "Nothing is made until a second operator approves. You then collect the key on the proposals \
                     page, once, and hand it to the tenant."
                    .into(),
            ],
            Self::IssueKey(tenant) => vec![
                format!("You propose another API key for {tenant}; its other keys keep working."),
                "Nothing is issued until a second operator approves. You then collect the key on the proposals \
                     page, once."
                    .into(),
            ],
            Self::CollectKey(proposal_id) => vec![
                format!("The API key that proposal {proposal_id} allows is made now."),
                "It is shown on the next page, once, and never again: hand it to the tenant.".into(),
            ],
            Self::RevokeKey(tenant, key) => vec![
                format!("Key {key} of {tenant} stops working within the api's auth cache time."),
                "Requests that present it are then refused with 401.".into(),
            ],
            Self::Connect(tenant) => match AdminForm::field(form.provider_account.as_ref()) {
                Some(account) => vec![
                    format!("You propose charging {tenant}'s new payments to provider account {account}."),
                    "Nothing changes until a second operator approves.".into(),
                ],
                None => vec![format!(
                    "{tenant} is disconnected now: in connect mode it takes no new payments until an account is \
                         set; its payments accepted before keep their account."
                )],
            },
            Self::CreateOperator => vec![format!(
                "Operator {name} is created as {} of {tenants}.",
                AdminForm::field(form.role.as_ref()).unwrap_or_default()
            )],
            Self::ChangeOperator(operator) => vec![format!(
                "{operator} becomes {} of {tenants}, from their next request.",
                AdminForm::field(form.role.as_ref()).unwrap_or_default()
            )],
            Self::DisableOperator(operator) => vec![
                format!("{operator} can no longer sign in; their tokens and sessions end now."),
                "Their proposals that wait for an approver are withdrawn.".into(),
            ],
            Self::IssueCode(operator) => vec![
                format!(
                    "{operator}'s local password is removed; their sessions end and their tokens stop working now."
                ),
                "A new enrollment code is shown on the next page, once: give it to them to set a new password.".into(),
            ],
        }
    }

    /// The button that confirms it.
    fn button(&self, form: &AdminForm) -> &'static str {
        match self {
            Self::CreateTenant => "Propose the tenant",
            Self::IssueKey(_) => "Propose the key",
            Self::CollectKey(_) => "Show the key",
            Self::RevokeKey(..) => "Revoke the key",
            Self::Connect(_) if AdminForm::field(form.provider_account.as_ref()).is_some() => "Propose the account",
            Self::Connect(_) => "Disconnect",
            Self::CreateOperator => "Create the operator",
            Self::ChangeOperator(_) => "Change the operator",
            Self::DisableOperator(_) => "Disable the operator",
            Self::IssueCode(_) => "Issue the code",
        }
    }

    /// Where "cancel" goes: the page the form was on.
    const fn back(&self) -> &'static str {
        match self {
            Self::CollectKey(_) => "/console/proposals",
            Self::CreateTenant | Self::IssueKey(_) | Self::RevokeKey(..) | Self::Connect(_) => "/console/tenants",
            Self::CreateOperator | Self::ChangeOperator(_) | Self::DisableOperator(_) | Self::IssueCode(_) => {
                "/console/operators"
            }
        }
    }

    /// Does it, as `caller`; the response to send.
    async fn run(
        &self,
        state: &OperatorsState,
        caller: &Caller,
        form: &AdminForm,
    ) -> Result<HttpResponse, OperatorError> {
        let reason = form.reason.as_str();
        let name = AdminForm::field(form.name.as_ref()).unwrap_or_default();
        let chrome = || Some(Chrome::of(&caller.account, "tenants"));
        match self {
            Self::CreateTenant => {
                let account = AdminForm::field(form.provider_account.as_ref());
                propose_tenant(state, caller, name, None, account, reason).await?;
                Ok(see_other("/console/proposals?notice=proposed"))
            }
            Self::IssueKey(tenant) => {
                propose_key(state, caller, tenant, reason).await?;
                Ok(see_other("/console/proposals?notice=proposed"))
            }
            Self::CollectKey(proposal_id) => {
                caller.require_fresh(state.fresh_sign_in, "collect an API key")?;
                let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
                let source = caller.source.as_deref();
                let issued =
                    proposals::collect_key(&mut conn, &caller.account, source, *proposal_id, state.limits()).await?;
                Ok(html(StatusCode::OK, &KeyIssuedPage { chrome: chrome(), title: "New API key".into(), issued }))
            }
            Self::RevokeKey(tenant, key) => {
                revoke_key_of(state, caller, tenant, key, reason).await?;
                Ok(see_other("/console/tenants?notice=key_revoked"))
            }
            Self::Connect(tenant) => {
                let account = AdminForm::field(form.provider_account.as_ref());
                match connect_account(state, caller, tenant, account, reason).await? {
                    Acted::Proposed { .. } => Ok(see_other("/console/proposals?notice=proposed")),
                    Acted::Done(_) => Ok(see_other("/console/tenants?notice=disconnected")),
                }
            }
            Self::CreateOperator => {
                let role = form.role()?;
                let tenants = form.tenants();
                let new = NewOperator {
                    name,
                    role,
                    tenants: tenants.as_deref(),
                    oidc_subject: AdminForm::field(form.oidc_subject.as_ref()),
                };
                let created = make_operator(state, caller, &new, reason).await?;
                Ok(match created.enrollment {
                    Some(issued) => code_page(caller, "New operator", issued),
                    None => see_other("/console/operators?notice=operator_created"),
                })
            }
            Self::ChangeOperator(operator) => {
                change_operator(state, caller, operator, Some(form.role()?), Some(form.tenants()), reason).await?;
                Ok(see_other("/console/operators?notice=operator_changed"))
            }
            Self::DisableOperator(operator) => {
                disable(state, caller, operator, reason).await?;
                Ok(see_other("/console/operators?notice=operator_disabled"))
            }
            Self::IssueCode(operator) => {
                let issued = fresh_code(state, caller, operator, reason).await?;
                Ok(code_page(caller, "New enrollment code", issued))
            }
        }
    }
}

/// Asks to confirm `asked`, then does it.
async fn confirm_then_run(
    state: &OperatorsState,
    request: &HttpRequest,
    action: String,
    asked: AdminChange,
    form: AdminForm,
) -> HttpResponse {
    let caller = match caller_or_sign_in(state, request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let section = match action.split('/').nth(2) {
        Some("operators") => "operators",
        Some("proposals") => "proposals",
        _ => "tenants",
    };
    let chrome = Chrome::of(&caller.account, section);
    if form.confirmed.as_deref() != Some("yes") {
        let (will, button, back) = (asked.will(&form), asked.button(&form), asked.back());
        let confirmation = Confirmation { action, will, button, back: back.into() };
        return ask_to_confirm(chrome, &form.reason, form.fields(), confirmation);
    }
    let entry = Entry::new(asked.audit_action(), Outcome::Done);
    let outcome = asked.run(state, &caller, &form).await;
    finish(state, &caller, chrome, entry, outcome).await
}

/// `POST /console/tenants`: creates a tenant.
pub(super) async fn create_tenant_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    form: web::Form<AdminForm>,
) -> HttpResponse {
    let action = "/console/tenants".to_owned();
    confirm_then_run(&state, &request, action, AdminChange::CreateTenant, form.into_inner()).await
}

/// `POST /console/tenants/{name}/keys`: issues an API key.
pub(super) async fn issue_key_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    form: web::Form<AdminForm>,
) -> HttpResponse {
    let tenant = path.into_inner();
    let action = format!("/console/tenants/{tenant}/keys");
    confirm_then_run(&state, &request, action, AdminChange::IssueKey(tenant), form.into_inner()).await
}

/// `POST /console/proposals/{id}/key`: collects the API key an approved proposal made, once.
pub(super) async fn collect_key_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    form: web::Form<AdminForm>,
) -> HttpResponse {
    let text = path.into_inner();
    let Ok(proposal_id) = Uuid::parse_str(&text) else {
        let refused = Problem::new(ProblemType::NotFound, format!("there is no proposal {text:?}"));
        return error_page(None, &refused);
    };
    let action = format!("/console/proposals/{proposal_id}/key");
    confirm_then_run(&state, &request, action, AdminChange::CollectKey(proposal_id), form.into_inner()).await
}

/// `POST /console/tenants/{name}/keys/{key_id}/revoke`: revokes an API key.
pub(super) async fn revoke_key_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<AdminForm>,
) -> HttpResponse {
    let (tenant, key) = path.into_inner();
    let action = format!("/console/tenants/{tenant}/keys/{key}/revoke");
    confirm_then_run(&state, &request, action, AdminChange::RevokeKey(tenant, key), form.into_inner()).await
}

/// `POST /console/tenants/{name}/provider-account`: sets or clears the provider account.
pub(super) async fn connect_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    form: web::Form<AdminForm>,
) -> HttpResponse {
    let tenant = path.into_inner();
    let action = format!("/console/tenants/{tenant}/provider-account");
    confirm_then_run(&state, &request, action, AdminChange::Connect(tenant), form.into_inner()).await
}

/// The page that shows an enrollment code, once.
#[derive(Template)]
#[template(path = "code_issued.html")]
struct CodeIssuedPage {
    chrome: Option<Chrome>,
    title: String,
    issued: IssuedCode,
    expires: String,
}

fn code_page(caller: &Caller, title: &str, issued: IssuedCode) -> HttpResponse {
    let chrome = Some(Chrome::of(&caller.account, "operators"));
    let expires = render::timestamp(issued.expires_at);
    html(StatusCode::OK, &CodeIssuedPage { chrome, title: title.into(), issued, expires })
}

/// `GET /console/operators`.
#[derive(Template)]
#[template(path = "operators.html")]
struct OperatorsPage {
    chrome: Option<Chrome>,
    title: String,
    operators: Vec<OperatorView>,
    roles: [Role; 4],
}

impl OperatorsPage {
    fn tenants_of(&self, operator: &OperatorView) -> String {
        operator.tenants.as_ref().map_or_else(String::new, |names| names.join(", "))
    }
}

/// `GET /console/operators`: every operator (admins of every tenant only).
pub(super) async fn operators_page(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "operators").noticed_by(&request);
    let read = async {
        manage_operators(&caller, "list the operators").map_err(problem)?;
        let mut conn = connection(&state).await?;
        accounts::list(&mut conn).await.map_err(problem)
    };
    match read.await {
        Ok(operators) => {
            let page = OperatorsPage { chrome: Some(chrome), title: "Operators".into(), operators, roles: Role::ALL };
            html(StatusCode::OK, &page)
        }
        Err(why) => error_page(Some(chrome), &why),
    }
}

/// `POST /console/operators`: creates an operator.
pub(super) async fn create_operator_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    form: web::Form<AdminForm>,
) -> HttpResponse {
    let action = "/console/operators".to_owned();
    confirm_then_run(&state, &request, action, AdminChange::CreateOperator, form.into_inner()).await
}

/// `POST /console/operators/{name}`: changes an operator's role and tenants.
pub(super) async fn change_operator_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    form: web::Form<AdminForm>,
) -> HttpResponse {
    let name = path.into_inner();
    let action = format!("/console/operators/{name}");
    confirm_then_run(&state, &request, action, AdminChange::ChangeOperator(name), form.into_inner()).await
}

/// `POST /console/operators/{name}/enrollment`: issues an operator a fresh enrollment code.
pub(super) async fn issue_code_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    form: web::Form<AdminForm>,
) -> HttpResponse {
    let name = path.into_inner();
    let action = format!("/console/operators/{name}/enrollment");
    confirm_then_run(&state, &request, action, AdminChange::IssueCode(name), form.into_inner()).await
}

/// `POST /console/operators/{name}/disable`: disables an operator.
pub(super) async fn disable_operator_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    form: web::Form<AdminForm>,
) -> HttpResponse {
    let name = path.into_inner();
    let action = format!("/console/operators/{name}/disable");
    confirm_then_run(&state, &request, action, AdminChange::DisableOperator(name), form.into_inner()).await
}
