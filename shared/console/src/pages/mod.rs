//! The console's pages (GET), one file each: sign-in, the overview and its live part, dead letters, a payment with
//! its timeline and the provider's view, proposals, the audit trail and reconciliation runs.
//!
//! Each page shows only the tenants the operator may see; a payment of another tenant is not found,
//! as in the JSON API. Opening a payment's page is recorded in the audit trail, as its JSON is.

use actix_web::{HttpRequest, HttpResponse};
use askama::Template;
use oncepay_http::problem::{Problem, ProblemType};
use serde::Deserialize;
use time::OffsetDateTime;

use super::{Chrome, error_page};
use oncepay_ops::operator_error::OperatorError;
use oncepay_ops::operators::api::{problem, query};
use oncepay_ops::render;

mod audit_trail;
mod dead_letters;
mod overview;
mod payment;
mod proposal_list;
mod runs;
mod search;
mod sign_in;

pub(super) use audit_trail::audit;
pub(super) use dead_letters::{DeadLetterQuery, dead_letters};
pub(super) use overview::{live, overview};
pub(super) use payment::{payment, payment_id_of};
pub(super) use proposal_list::proposals;
pub(super) use runs::{recon_run, recon_runs};
pub(super) use search::{FoundLine, SearchPage};
pub(super) use sign_in::{SignInPage, sign_in};

/// Rows on a page of dead letters or audit records.
const PAGE_ROWS: i64 = 50;

/// What `Err` holds in a page handler: the response to send instead.
type Page = Result<HttpResponse, HttpResponse>;

fn done(page: Page) -> HttpResponse {
    page.unwrap_or_else(|response| response)
}

/// A problem as a page within the operator's frame.
fn refused(chrome: &Chrome) -> impl Fn(Problem) -> HttpResponse + '_ {
    move |problem| error_page(Some(chrome.clone()), &problem)
}

fn failed(chrome: &Chrome) -> impl Fn(OperatorError) -> HttpResponse + '_ {
    move |error| error_page(Some(chrome.clone()), &problem(error))
}

fn when(at: OffsetDateTime) -> String {
    render::timestamp(at)
}

fn age(at: OffsetDateTime) -> String {
    render::age(OffsetDateTime::now_utc() - at)
}

/// Something went wrong.
#[derive(Template)]
#[template(path = "error.html")]
pub(super) struct ErrorPage {
    pub(super) chrome: Option<Chrome>,
    pub(super) title: String,
    pub(super) detail: String,
    /// Whether the request was refused (a 4xx), which changes nothing; a failure underneath may
    /// have.
    pub(super) refused: bool,
}

/// After a sign-in at the OpenID provider.
#[derive(Template)]
#[template(path = "signed_in.html")]
pub(super) struct SignedInPage {
    pub(super) chrome: Option<Chrome>,
    pub(super) title: String,
    pub(super) name: String,
}

/// A choice in a filter's list.
struct Choice {
    value: String,
    label: String,
    selected: bool,
}

fn choices(options: &[(&str, &str)], chosen: &str) -> Vec<Choice> {
    options
        .iter()
        .map(|(value, label)| Choice {
            value: (*value).to_owned(),
            label: (*label).to_owned(),
            selected: *value == chosen,
        })
        .collect()
}

/// Any other path under `/console`.
pub(super) async fn not_found() -> HttpResponse {
    error_page(None, &Problem::new(ProblemType::NotFound, "there is no such page in the console"))
}

impl Chrome {
    /// With the notice a change left in the URL (`?notice=`), if it is one the console says.
    fn noticed(mut self, code: Option<&str>) -> Self {
        self.notice = code.and_then(super::notice_text);
        self
    }

    /// With the notice in the request's URL, if it is one the console says.
    pub(super) fn noticed_by(self, request: &HttpRequest) -> Self {
        self.noticed(notice_of(request).as_deref())
    }
}

#[derive(Debug, Default, Deserialize)]
struct NoticeQuery {
    notice: Option<String>,
}

/// The notice code in the request's URL, if any.
fn notice_of(request: &HttpRequest) -> Option<String> {
    query::<NoticeQuery>(request).ok().and_then(|asked| asked.notice)
}
