//! The console's bulk retries: resending every open dead letter a filter of the dead-letter list
//! selects, as a job the reconciler works ([`oncepay_ops::operators::api::bulk_retries`]).
//!
//! The first post shows how many and which payments the filter selects now; the confirmation
//! carries exactly those payments back, and only they are retried, whatever the filter selects by
//! then. The job's page reports a result for each.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use oncepay_domain::ids::PaymentId;
use oncepay_http::problem::{Problem, ProblemType};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use super::forms::finish;
use super::pages::DeadLetterQuery;
use super::queries;
use super::{Chrome, caller_or_sign_in, error_page, html, see_other, visible_tenants};
use oncepay_ops::dead_letters::actions::require_reason;
use oncepay_ops::operators::api::bulk_retries::{self, MAX_PAYMENTS};
use oncepay_ops::operators::api::signing_in::Caller;
use oncepay_ops::operators::api::{OperatorsState, connection, problem};
use oncepay_ops::operators::audit::{Entry, Outcome};
use oncepay_ops::render;

/// The filter and reason of a bulk retry; with `confirmed=yes`, the payments it was shown.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BulkForm {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    older_than: String,
    #[serde(default)]
    reason: String,
    confirmed: Option<String>,
    /// The payments shown, separated by spaces.
    payments: Option<String>,
}

/// What a bulk retry will resend, before it is confirmed.
#[derive(Template)]
#[template(path = "bulk_confirm.html")]
struct ConfirmPage {
    chrome: Option<Chrome>,
    title: String,
    form: BulkForm,
    payments: Vec<PaymentId>,
    /// "1 payment", "3 payments".
    how_many: String,
    joined: String,
    needs_approval: bool,
}

/// `POST /console/bulk-retries`: shows what the filter selects and asks to confirm; confirmed,
/// writes the job and goes to its page.
pub(super) async fn create(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    form: web::Form<BulkForm>,
) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "dead-letters");
    let form = form.into_inner();
    let refused = |problem: Problem| error_page(Some(chrome.clone()), &problem);
    if let Err(why) = require_reason(&form.reason) {
        return refused(problem(why));
    }
    let filter = json!({ "kind": form.kind, "tenant": form.tenant, "older_than": form.older_than });
    if form.confirmed.as_deref() == Some("yes") {
        let shown: Result<Vec<PaymentId>, _> =
            form.payments.as_deref().unwrap_or_default().split_whitespace().map(str::parse).collect();
        let Ok(shown) = shown else {
            return refused(Problem::new(ProblemType::InvalidRequest, "the confirmed payments are not payment ids"));
        };
        let entry = Entry::new("bulk_retry.create", Outcome::Done);
        let created = async {
            let mut conn = state.pool.acquire().await.map_err(|e| anyhow::Error::new(e).context("no database"))?;
            bulk_retries::create(&mut conn, &caller, &form.reason, filter, &shown).await
        };
        let redirect = created.await.map(|id| see_other(&format!("/console/bulk-retries/{id}")));
        return finish(&state, &caller, chrome, entry, redirect).await;
    }
    let (rows, more) = match select(&state, &caller, &form).await {
        Ok(selected) => selected,
        Err(why) => return refused(why),
    };
    if more {
        let detail = format!("more than {MAX_PAYMENTS} open dead letters match: narrow the filter");
        return refused(Problem::new(ProblemType::InvalidRequest, detail));
    }
    if rows.is_empty() {
        return refused(Problem::new(ProblemType::InvalidRequest, "no open dead letter matches the filter"));
    }
    let payments: Vec<PaymentId> = rows.iter().map(|row| row.payment_id).collect();
    let joined = payments.iter().map(ToString::to_string).collect::<Vec<_>>().join(" ");
    let how_many = if payments.len() == 1 { "1 payment".to_owned() } else { format!("{} payments", payments.len()) };
    let page = ConfirmPage {
        chrome: Some(chrome.clone()),
        title: "Confirm the bulk retry".into(),
        form,
        payments,
        how_many,
        joined,
        needs_approval: state.retries_need_approval,
    };
    html(StatusCode::OK, &page)
}

/// One payment's line on a bulk retry's page.
struct ItemLine {
    payment_id: PaymentId,
    outcome: String,
    detail: String,
}

/// `GET /console/bulk-retries/{id}`.
#[derive(Template)]
#[template(path = "bulk_retry.html")]
struct JobPage {
    chrome: Option<Chrome>,
    title: String,
    operator: String,
    reason: String,
    created_at: String,
    state: String,
    counts: Vec<(&'static str, usize)>,
    items: Vec<ItemLine>,
}

/// `GET /console/bulk-retries/{id}`: where the job stands, and each payment's result.
pub(super) async fn show(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "dead-letters");
    let read = async {
        let not_found = || Problem::new(ProblemType::NotFound, format!("there is no bulk retry {:?}", path.as_str()));
        let id = Uuid::parse_str(&path).map_err(|_| not_found())?;
        let mut conn = connection(&state).await?;
        bulk_retries::read(&mut conn, &caller.account, id).await.map_err(problem)
    };
    let job = match read.await {
        Ok(job) => job,
        Err(why) => return error_page(Some(chrome), &why),
    };
    let count = |outcome: Option<&str>| job.items.iter().filter(|item| item.outcome.as_deref() == outcome).count();
    let counts = vec![
        ("waiting", count(None)),
        ("retried", count(Some("retried"))),
        ("proposed", count(Some("proposed"))),
        ("refused", count(Some("refused"))),
    ];
    let page = JobPage {
        chrome: Some(chrome),
        title: format!("Bulk retry {}", job.bulk_retry_id),
        operator: job.operator,
        reason: job.reason,
        created_at: render::timestamp(job.created_at),
        state: job.finished_at.map_or_else(|| "running".to_owned(), |at| format!("finished {}", render::timestamp(at))),
        counts,
        items: job
            .items
            .into_iter()
            .map(|item| ItemLine {
                payment_id: item.payment_id,
                outcome: item.outcome.unwrap_or_else(|| "waiting".into()),
                detail: item.detail.unwrap_or_default(),
            })
            .collect(),
    };
    html(StatusCode::OK, &page)
}

/// The open `unresolved` dead letters `form`'s filter selects, of the tenants `caller` may see: at
/// most as many as a bulk retry may hold, and whether more matched.
async fn select(
    state: &OperatorsState,
    caller: &Caller,
    form: &BulkForm,
) -> Result<(Vec<queries::DeadLetterRow>, bool), Problem> {
    // Unresolved ones only: a conflict is an operator's decision on its own page.
    if form.kind == "conflict" {
        return Err(Problem::new(
            ProblemType::InvalidRequest,
            "a bulk retry resends unresolved dead letters only: decide each conflict on its payment's page",
        ));
    }
    // The same filter, checked the same way, as the dead letters page the form was on.
    let asked = DeadLetterQuery {
        kind: Some("unresolved".to_owned()),
        tenant: Some(form.tenant.clone()),
        state: Some("open".to_owned()),
        older_than: Some(form.older_than.clone()),
        after: None,
    };
    let filter = asked.filter(&visible_tenants(state, caller).await?)?;
    let mut conn = connection(state).await?;
    let limit = i64::try_from(MAX_PAYMENTS).unwrap_or(i64::MAX);
    queries::dead_letter_page(&mut conn, &filter, limit).await.map_err(problem)
}
