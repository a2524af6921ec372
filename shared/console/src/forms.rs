//! The console's forms (POST): signing in and out, the search, and the changes to a payment, a
//! refund or a proposal.
//!
//! A change is posted twice: first with its reason, followed by a page that says what will happen
//! and asks to confirm; then with `confirmed=yes`, when it is done by the same function the JSON
//! API calls, a refused change recorded in the audit trail the same way, and the browser is sent back to
//! the payment's page with a notice.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use oncepay_domain::ids::{PaymentId, RefundId};
use oncepay_domain::money::format_amount;
use oncepay_domain::refund::RefundReason;
use oncepay_http::problem::{Problem, ProblemType};
use secrecy::SecretString;
use serde::Deserialize;
use uuid::Uuid;

use super::pages::{FoundLine, SearchPage, SignInPage, payment_id_of};
use super::{Chrome, caller_or_sign_in, error_page, html, queries, see_other, visible_tenants};
use oncepay_ops::dead_letters::actions::{Asked, require_reason};
use oncepay_ops::dead_letters::refunds::{self as dead_refunds, AskedRefundResolution};
use oncepay_ops::operator_error::OperatorError;
use oncepay_ops::operators::Role;
use oncepay_ops::operators::api::refunds::{
    acknowledge_refund, refund_payment, refund_reason, resolve_refund, retry_refund,
};
use oncepay_ops::operators::api::signing_in::{self, Caller};
use oncepay_ops::operators::api::{
    Decided, Decision, OperatorsState, change, connection, decide_proposal, problem, resolve_payment, retry_payment,
};
use oncepay_ops::operators::audit::{Entry, Outcome};
use oncepay_ops::operators::proposals::{Closing, ProposalStatus};
use oncepay_ops::operators::reports::Acted;

/// The most payments a search lists.
const SEARCH_ROWS: i64 = 50;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SignInForm {
    name: String,
    password: SecretString,
}

/// `POST /console/sign-in`: with the session cookie to the overview, or the sign-in page again
/// with why not.
pub(super) async fn sign_in(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    form: web::Form<SignInForm>,
) -> HttpResponse {
    let form = form.into_inner();
    if let Err(refused) = signing_in::refuse_other_sites(&request) {
        return error_page(None, &refused);
    }
    match signing_in::with_password(&state, &request, &form.name, form.password).await {
        Ok(session) => {
            let mut response = see_other("/console/");
            let (name, value) = signing_in::session_cookie_header(&state, &session);
            response.headers_mut().insert(name, value);
            response
        }
        Err(refused) => {
            let status = StatusCode::from_u16(refused.status).unwrap_or(StatusCode::UNAUTHORIZED);
            html(status, &SignInPage::new(&state, Some(refused.detail), form.name))
        }
    }
}

/// `POST /console/sign-out`.
pub(super) async fn sign_out(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    // Already signed out is as good as signed out now.
    if let Err(refused) = signing_in::end_session(&state, &request).await
        && refused.status != StatusCode::UNAUTHORIZED.as_u16()
    {
        return error_page(None, &refused);
    }
    let mut response = see_other("/console/sign-in");
    let (name, value) = signing_in::cleared_session_cookie();
    response.headers_mut().insert(name, value);
    response
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SearchForm {
    q: String,
}

/// `POST /console/search` `q=…`: the payments it names, or the one payment's page. A POST, so that
/// what was searched for (a customer's reference, say) stays out of URLs and logs. Viewers do not
/// search by customer reference.
pub(super) async fn search(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    form: web::Form<SearchForm>,
) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "search");
    let asked = form.into_inner().q.trim().to_owned();
    if asked.is_empty() || asked.len() > 255 {
        let refused = Problem::new(ProblemType::InvalidRequest, "type a payment id, key or reference to search for");
        return error_page(Some(chrome), &refused);
    }
    let found = async {
        let tenants: Vec<Uuid> =
            visible_tenants(&state, &caller).await?.iter().map(|t| t.tenant_id.as_uuid()).collect();
        let mut conn = connection(&state).await?;
        // A viewer sees customer references masked, so may not test whether one is a customer's.
        let by_customer = caller.account.role != Role::Viewer;
        queries::search(&mut conn, &tenants, &asked, by_customer, SEARCH_ROWS).await.map_err(problem)
    };
    match found.await {
        Err(refused) => error_page(Some(chrome), &refused),
        Ok(found) if found.len() == 1 && found.iter().all(|f| f.payment_id == found[0].payment_id) => {
            see_other(&format!("/console/payments/{}", found[0].payment_id))
        }
        Ok(found) => {
            let found = found
                .into_iter()
                .map(|f| FoundLine {
                    payment_id: f.payment_id,
                    matched: f.matched,
                    tenant: f.tenant,
                    status: f.status.as_str().to_owned(),
                    amount: format_amount(f.amount.minor_units(), f.currency.as_str()),
                    created_at: oncepay_ops::render::timestamp(f.created_at),
                })
                .collect();
            html(StatusCode::OK, &SearchPage { chrome: Some(chrome), title: "Search".into(), asked, found })
        }
    }
}

/// The form of every change to a payment or proposal; which fields count depends on the change.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ChangeForm {
    #[serde(default)]
    reason: String,
    /// `yes` once the operator has read what will happen.
    confirmed: Option<String>,
    /// Resolve as: `succeeded`, `failed` or `acknowledged`.
    #[serde(rename = "as")]
    outcome: Option<String>,
    charge_id: Option<String>,
    /// A checkbox: `on` when ticked.
    force: Option<String>,
    /// A checkbox: `on` when ticked.
    outside_key_window: Option<String>,
    /// A refund's amount in minor units; empty for all that is left.
    amount: Option<String>,
    /// A refund's reason in the provider's words; empty for none.
    refund_reason: Option<String>,
    provider_refund_id: Option<String>,
}

impl ChangeForm {
    fn confirmed(&self) -> bool {
        self.confirmed.as_deref() == Some("yes")
    }

    fn ticked(field: Option<&String>) -> bool {
        field.is_some_and(|value| value == "on")
    }

    fn charge_id(&self) -> Option<String> {
        filled(self.charge_id.as_ref())
    }

    fn provider_refund_id(&self) -> Option<String> {
        filled(self.provider_refund_id.as_ref())
    }

    /// The refund's amount; none when the field is empty.
    fn amount(&self) -> Result<Option<i64>, Problem> {
        let Some(amount) = filled(self.amount.as_ref()) else { return Ok(None) };
        amount.parse().map(Some).map_err(|_| {
            Problem::new(ProblemType::InvalidRequest, format!("amount {amount:?} is not a whole number of minor units"))
        })
    }

    /// The fields to post again with the confirmation.
    fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![("reason", self.reason.clone()), ("confirmed", "yes".to_owned())];
        let optional = [
            ("as", &self.outcome),
            ("charge_id", &self.charge_id),
            ("force", &self.force),
            ("outside_key_window", &self.outside_key_window),
            ("amount", &self.amount),
            ("refund_reason", &self.refund_reason),
            ("provider_refund_id", &self.provider_refund_id),
        ];
        fields.extend(optional.into_iter().filter_map(|(name, value)| value.clone().map(|value| (name, value))));
        fields
    }
}

/// A form field's value, trimmed; none when it is empty.
fn filled(field: Option<&String>) -> Option<String> {
    field.map(|value| value.trim()).filter(|value| !value.is_empty()).map(str::to_owned)
}

/// The page that says what a change will do and asks to confirm it.
#[derive(Template)]
#[template(path = "confirm.html")]
struct ConfirmPage {
    chrome: Option<Chrome>,
    title: String,
    confirmation: Confirmation,
    reason: String,
    /// The form's fields, posted again with the confirmation.
    fields: Vec<(&'static str, String)>,
}

/// What a change will do, said before it is confirmed.
pub(super) struct Confirmation {
    /// Where the confirmation is posted.
    pub(super) action: String,
    /// What will happen, a sentence each.
    pub(super) will: Vec<String>,
    /// What the button that confirms it says.
    pub(super) button: &'static str,
    /// Where "cancel" goes.
    pub(super) back: String,
}

/// The page that asks to confirm a change posted with `reason` and `fields` (refused when the
/// reason is missing: nothing is confirmed without one).
pub(super) fn ask_to_confirm(
    chrome: Chrome,
    reason: &str,
    fields: Vec<(&'static str, String)>,
    confirmation: Confirmation,
) -> HttpResponse {
    if let Err(refused) = require_reason(reason) {
        return error_page(Some(chrome), &problem(refused));
    }
    let page =
        ConfirmPage { chrome: Some(chrome), title: "Confirm".into(), confirmation, reason: reason.to_owned(), fields };
    html(StatusCode::OK, &page)
}

/// A change to a payment, as the form asks for it.
enum PaymentChange {
    Retry { outside_key_window: bool },
    Resolve(Asked),
    Refund { amount: Option<i64>, reason: Option<RefundReason> },
}

impl PaymentChange {
    fn of(action: &str, form: &ChangeForm) -> Result<Self, Problem> {
        let invalid = |detail: &str| Problem::new(ProblemType::InvalidRequest, detail.to_owned());
        match action {
            "retry" => Ok(Self::Retry { outside_key_window: ChangeForm::ticked(form.outside_key_window.as_ref()) }),
            "resolve" => match form.outcome.as_deref() {
                Some("acknowledged") => Ok(Self::Resolve(Asked::Acknowledge)),
                Some("failed") => Ok(Self::Resolve(Asked::Failed {
                    charge_id: form.charge_id(),
                    force: ChangeForm::ticked(form.force.as_ref()),
                })),
                Some("succeeded") => Ok(Self::Resolve(Asked::Succeeded {
                    charge_id: Some(
                        form.charge_id()
                            .ok_or_else(|| invalid("a resolution as succeeded needs the provider's charge id"))?,
                    ),
                    amount: None,
                    currency: None,
                    charged_at: None,
                })),
                _ => Err(invalid("resolve as succeeded, failed or acknowledged")),
            },
            "refund" => Ok(Self::Refund {
                amount: form.amount()?,
                reason: refund_reason(form.refund_reason.as_deref()).map_err(problem)?,
            }),
            _ => Err(Problem::new(ProblemType::NotFound, "a payment can be retried, resolved or refunded")),
        }
    }

    /// What its audit rows are recorded under.
    const fn audit_action(&self) -> &'static str {
        match self {
            Self::Retry { .. } => "payment.retry",
            Self::Resolve(_) => "payment.resolve",
            Self::Refund { .. } => "payment.refund",
        }
    }

    /// What it will do, before it is confirmed.
    fn will(&self, payment_id: PaymentId, state: &OperatorsState) -> (Vec<String>, &'static str) {
        match self {
            Self::Retry { outside_key_window } if *outside_key_window || state.retries_need_approval => (
                vec![
                    format!("This proposes sending payment {payment_id} to the provider again."),
                    "Nothing is sent until a second operator approves the proposal.".into(),
                ],
                "Propose the resend",
            ),
            Self::Retry { .. } => (
                vec![
                    format!("Payment {payment_id} is queued to be sent to the provider again, now."),
                    "If it is still inside the provider's key window, it goes with the same idempotency key as \
                     before, so the customer is charged at most once, and the dead letter closes as retried; if \
                     not, it is refused and nothing changes."
                        .into(),
                ],
                "Send it again",
            ),
            Self::Resolve(Asked::Acknowledge) => (
                vec![
                    format!("The conflict on payment {payment_id} is closed as acknowledged."),
                    "The payment keeps the state it has; no money moves.".into(),
                ],
                "Acknowledge",
            ),
            Self::Resolve(Asked::Failed { charge_id, force }) => {
                let mut will = vec![
                    format!("This proposes settling payment {payment_id} as failed: the customer was not charged."),
                    "Nothing changes until a second operator approves the proposal.".into(),
                ];
                if let Some(charge) = charge_id {
                    will.push(format!("It names the provider's failed charge {charge}."));
                }
                if *force {
                    will.push(
                        "Forced: it settles as failed although a charge on record says the money was taken.".into(),
                    );
                }
                (will, "Propose settling as failed")
            }
            Self::Resolve(Asked::Succeeded { charge_id, .. }) => (
                vec![
                    format!(
                        "This proposes settling payment {payment_id} as succeeded with the provider's charge {}.",
                        charge_id.as_deref().unwrap_or_default()
                    ),
                    "The charge is looked up now; the ledger books it only when a second operator approves.".into(),
                ],
                "Propose settling as succeeded",
            ),
            Self::Refund { amount, reason } => {
                let how_much = amount.map_or_else(|| "all that is left".to_owned(), |a| format!("{a} (minor units)"));
                let mut will = vec![
                    format!("This proposes giving {how_much} of payment {payment_id} back to the customer."),
                    "No money moves until a second operator approves the proposal; the refund is then sent to the \
                     provider once, under a key of its own, and the payment's refunds never add up to more than \
                     it charged."
                        .into(),
                ];
                if let Some(reason) = reason {
                    will.push(format!("The provider is told why: {}.", reason.as_str()));
                }
                (will, "Propose the refund")
            }
        }
    }
}

/// `POST /console/payments/{id}/retry|resolve`: asks to confirm, then does it.
pub(super) async fn act_on_payment(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<ChangeForm>,
) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "dead-letters");
    let (payment_text, action) = path.into_inner();
    let form = form.into_inner();
    let asked = payment_id_of(&payment_text).and_then(|id| Ok((id, PaymentChange::of(&action, &form)?)));
    let (payment_id, change_asked) = match asked {
        Ok(asked) => asked,
        Err(refused) => return error_page(Some(chrome), &refused),
    };
    let page = format!("/console/payments/{payment_id}");
    if !form.confirmed() {
        let (will, button) = change_asked.will(payment_id, &state);
        let confirmation =
            Confirmation { action: format!("/console/payments/{payment_id}/{action}"), will, button, back: page };
        return ask_to_confirm(chrome, &form.reason, form.fields(), confirmation);
    }
    let entry = Entry::new(change_asked.audit_action(), Outcome::Done).on_payment(payment_id);
    let outcome = match change_asked {
        PaymentChange::Retry { outside_key_window } => match state.pool.acquire().await {
            Ok(mut conn) => {
                retry_payment(&state, &mut conn, &caller, payment_id, &form.reason, outside_key_window).await
            }
            Err(error) => Err(OperatorError::Failed(anyhow::Error::new(error).context("cannot reach the database"))),
        },
        PaymentChange::Resolve(decision) => resolve_payment(&state, &caller, payment_id, decision, &form.reason).await,
        PaymentChange::Refund { amount, reason } => {
            refund_payment(&state, &caller, payment_id, amount, reason, &form.reason).await
        }
    };
    let notice = |acted: &Acted| match (acted, action.as_str()) {
        (Acted::Proposed { .. }, _) => "proposed",
        (Acted::Done(_), "retry") => "retried",
        (Acted::Done(_), _) => "acknowledged",
    };
    let redirect = outcome.map(|acted| see_other(&format!("{page}?notice={}", notice(&acted))));
    finish(&state, &caller, chrome, entry, redirect).await
}

/// A change to a refund that waits for an operator, as the form asks for it.
enum RefundChange {
    Retry {
        outside_key_window: bool,
    },
    Resolve(AskedRefundResolution),
    /// Close the conflict on a final refund.
    Acknowledge,
}

impl RefundChange {
    fn of(action: &str, form: &ChangeForm) -> Result<Self, Problem> {
        let invalid = |detail: &str| Problem::new(ProblemType::InvalidRequest, detail.to_owned());
        match action {
            "retry" => Ok(Self::Retry { outside_key_window: ChangeForm::ticked(form.outside_key_window.as_ref()) }),
            "resolve" => match form.outcome.as_deref() {
                Some("acknowledged") => Ok(Self::Acknowledge),
                Some("failed") => Ok(Self::Resolve(AskedRefundResolution::Failed {
                    provider_refund_id: form.provider_refund_id(),
                    force: ChangeForm::ticked(form.force.as_ref()),
                })),
                Some("succeeded") => Ok(Self::Resolve(AskedRefundResolution::Succeeded {
                    provider_refund_id: Some(
                        form.provider_refund_id()
                            .ok_or_else(|| invalid("a resolution as succeeded needs the provider's refund id"))?,
                    ),
                    amount: None,
                    currency: None,
                    refunded_at: None,
                })),
                _ => Err(invalid("resolve a refund as succeeded, failed or acknowledged")),
            },
            _ => Err(Problem::new(ProblemType::NotFound, "a refund can be retried or resolved")),
        }
    }

    /// What it will do, before it is confirmed.
    fn will(&self, refund_id: RefundId, state: &OperatorsState) -> (Vec<String>, &'static str) {
        match self {
            Self::Retry { outside_key_window } if *outside_key_window || state.retries_need_approval => (
                vec![
                    format!("This proposes sending refund {refund_id} to the provider again."),
                    "Nothing is sent until a second operator approves the proposal.".into(),
                ],
                "Propose the resend",
            ),
            Self::Retry { .. } => (
                vec![
                    format!("Refund {refund_id} is queued to be sent to the provider again, now."),
                    "If it is still inside the provider's key window, it goes with the same idempotency key as \
                     before, so the money goes back at most once; if not, it is refused and nothing changes."
                        .into(),
                ],
                "Send it again",
            ),
            Self::Resolve(AskedRefundResolution::Failed { provider_refund_id, force }) => {
                let mut will = vec![
                    format!("This proposes settling refund {refund_id} as failed: no money went back."),
                    "Nothing changes until a second operator approves; then its amount can be refunded again.".into(),
                ];
                if let Some(id) = provider_refund_id {
                    will.push(format!("It names the provider's failed refund {id}."));
                }
                if *force {
                    will.push("Forced: it settles as failed although the provider reported the refund as made.".into());
                }
                (will, "Propose settling as failed")
            }
            Self::Resolve(AskedRefundResolution::Succeeded { provider_refund_id, .. }) => (
                vec![
                    format!(
                        "This proposes settling refund {refund_id} as succeeded with the provider's refund {}.",
                        provider_refund_id.as_deref().unwrap_or_default()
                    ),
                    "The provider's refund is looked up now; the ledger books it only when a second operator \
                     approves."
                        .into(),
                ],
                "Propose settling as succeeded",
            ),
            Self::Acknowledge => (
                vec![
                    format!("The conflict on refund {refund_id} is closed as acknowledged."),
                    "The refund keeps the status it has; no money moves.".into(),
                ],
                "Acknowledge",
            ),
        }
    }

    const fn audit_action(&self) -> &'static str {
        match self {
            Self::Retry { .. } => "refund.retry",
            Self::Resolve(_) => "refund.resolve",
            Self::Acknowledge => "refund.acknowledge",
        }
    }
}

/// `POST /console/refunds/{id}/retry|resolve`: asks to confirm, then does it (a resolution as
/// `acknowledged` closes a conflict on a final refund), and goes back to the refund's payment.
pub(super) async fn act_on_refund(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<ChangeForm>,
) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "dead-letters");
    let (refund_text, action) = path.into_inner();
    let form = form.into_inner();
    let not_found = || Problem::new(ProblemType::NotFound, format!("there is no refund {refund_text:?}"));
    let asked = refund_text
        .parse::<RefundId>()
        .map_err(|_| not_found())
        .and_then(|id| Ok((id, RefundChange::of(&action, &form)?)));
    let (refund_id, change_asked) = match asked {
        Ok(asked) => asked,
        Err(refused) => return error_page(Some(chrome), &refused),
    };
    // Where it is, among the tenants the operator may see: its payment's page is where they come back to.
    let located = async {
        let mut conn = connection(&state).await?;
        let tenants = caller.account.scope.to_column();
        dead_refunds::locate(&mut conn, tenants.as_deref(), refund_id).await.map_err(problem)
    };
    let payment_id = match located.await {
        Ok((_, payment_id, _)) => payment_id,
        Err(refused) => return error_page(Some(chrome), &refused),
    };
    let page = format!("/console/payments/{payment_id}");
    if !form.confirmed() {
        let (will, button) = change_asked.will(refund_id, &state);
        let confirmation =
            Confirmation { action: format!("/console/refunds/{refund_id}/{action}"), will, button, back: page };
        return ask_to_confirm(chrome, &form.reason, form.fields(), confirmation);
    }
    let entry = Entry::new(change_asked.audit_action(), Outcome::Done)
        .on_payment(payment_id)
        .detail(serde_json::json!({ "refund_id": refund_id }));
    let outcome = match change_asked {
        RefundChange::Retry { outside_key_window } => {
            retry_refund(&state, &caller, refund_id, &form.reason, outside_key_window).await
        }
        RefundChange::Resolve(decision) => resolve_refund(&state, &caller, refund_id, decision, &form.reason).await,
        RefundChange::Acknowledge => acknowledge_refund(&state, &caller, refund_id, &form.reason).await,
    };
    let notice = |acted: &Acted| match (acted, action.as_str()) {
        (Acted::Proposed { .. }, _) => "proposed",
        (Acted::Done(_), "retry") => "refund_retried",
        (Acted::Done(_), _) => "refund_acknowledged",
    };
    let redirect = outcome.map(|acted| see_other(&format!("{page}?notice={}", notice(&acted))));
    finish(&state, &caller, chrome, entry, redirect).await
}

/// `POST /console/proposals/{id}/approve|reject|withdraw`: asks to confirm, then does it.
pub(super) async fn decide(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<ChangeForm>,
) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "proposals");
    let (proposal_text, decision_text) = path.into_inner();
    let form = form.into_inner();
    let not_found = || Problem::new(ProblemType::NotFound, format!("there is no proposal {proposal_text:?}"));
    let asked = Uuid::parse_str(&proposal_text)
        .map_err(|_| not_found())
        .and_then(|id| Ok((id, Decision::from_path(&decision_text)?)));
    let (proposal_id, decision) = match asked {
        Ok(asked) => asked,
        Err(refused) => return error_page(Some(chrome), &refused),
    };
    if !form.confirmed() {
        let (will, button) = match decision {
            Decision::Approve => (
                vec![
                    format!("You approve proposal {proposal_id}, and what it proposes is done now."),
                    "Approving moves money or settles a payment for good: it needs a sign-in from the last few \
                     minutes."
                        .into(),
                ],
                "Approve",
            ),
            Decision::Close(Closing::Reject) => {
                (vec![format!("You reject proposal {proposal_id}; nothing it proposes is done.")], "Reject")
            }
            Decision::Close(Closing::Withdraw) => {
                (vec![format!("You withdraw your proposal {proposal_id}; nothing it proposes is done.")], "Withdraw")
            }
        };
        let action = format!("/console/proposals/{proposal_id}/{decision_text}");
        let confirmation = Confirmation { action, will, button, back: "/console/proposals".into() };
        return ask_to_confirm(chrome, &form.reason, form.fields(), confirmation);
    }
    let entry = Entry::new(decision.audit_action(), Outcome::Done).proposal(proposal_id);
    let outcome = decide_proposal(&state, &caller, proposal_id, decision, &form.reason).await;
    let redirect = outcome.map(|decided| {
        let (payment_id, notice) = match &decided {
            Decided::Approved(approved) => (approved.proposal.payment_id, "approved"),
            Decided::Closed(closed) if closed.status == ProposalStatus::Rejected => (closed.payment_id, "rejected"),
            Decided::Closed(closed) => (closed.payment_id, "withdrawn"),
        };
        match payment_id {
            Some(payment_id) => see_other(&format!("/console/payments/{payment_id}?notice={notice}")),
            None => see_other(&format!("/console/proposals?notice={notice}")),
        }
    });
    finish(&state, &caller, chrome, entry, redirect).await
}

/// The response to a confirmed change: where it sends the browser, or a page that says why it was
/// refused, once that is recorded.
pub(super) async fn finish(
    state: &OperatorsState,
    caller: &Caller,
    chrome: Chrome,
    entry: Entry,
    outcome: Result<HttpResponse, OperatorError>,
) -> HttpResponse {
    match change(state, caller, entry, outcome).await {
        Ok(response) => response,
        Err(refused) => error_page(Some(chrome), &refused),
    }
}
