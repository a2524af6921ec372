//! The console's pages (GET): sign-in, the overview and its live part, dead letters, a payment with
//! its timeline and the provider's view, proposals, the audit trail and reconciliation runs.
//!
//! Each page shows only the tenants the operator may see; a payment of another tenant is not found,
//! as in the JSON API. Opening a payment's page is recorded in the audit trail, as its JSON is.

use std::str::FromStr;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::format_amount;
use oncepay_domain::status::PaymentStatus;
use oncepay_http::problem::{Problem, ProblemType};
use oncepay_provider::{Charge, ConfiguredProvider, PaymentProvider};
use serde::Deserialize;
use serde_json::json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::provider_view::{self, Ours};
use super::queries::{self, Cursor, DeadLetterFilter, EntryState, Happened};
use super::{Chrome, caller_or_sign_in, error_page, html, visible_tenants};
use oncepay_ops::dead_letters::Kind as DeadLetterKind;
use oncepay_ops::dead_letters::refunds as dead_refunds;
use oncepay_ops::operator_error::OperatorError;
use oncepay_ops::operators::api::signing_in::Caller;
use oncepay_ops::operators::api::tenants::every_tenant;
use oncepay_ops::operators::api::{OperatorsState, connection, problem, query};
use oncepay_ops::operators::audit::{self, Entry, Outcome};
use oncepay_ops::operators::proposals::{self, ProposalStatus, ProposalView, Proposed};
use oncepay_ops::operators::refunds as operator_refunds;
use oncepay_ops::operators::{Role, Scope, masking};
use oncepay_ops::recon;
use oncepay_ops::render;

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

/// The sign-in page.
#[derive(Template)]
#[template(path = "sign_in.html")]
pub(super) struct SignInPage {
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
    pub(super) fn new(state: &OperatorsState, error: Option<String>, name: String) -> Self {
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
pub(super) async fn sign_in(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    let mut page = SignInPage::new(&state, None, String::new());
    page.notice = notice_of(&request).as_deref().and_then(super::notice_text);
    html(StatusCode::OK, &page)
}

/// One figure of the overview.
struct Figure {
    label: &'static str,
    value: String,
    link: Option<&'static str>,
}

/// Open dead letters of one kind.
struct KindRow {
    kind: String,
    /// Where they are listed: the payments' by kind, the refunds' in a section of their own.
    link: String,
    open: i64,
    older_than_an_hour: i64,
    older_than_a_day: i64,
    oldest: String,
}

/// The last reconciliation run, in words.
struct LastRun {
    run_id: Uuid,
    window: String,
    status: String,
    discrepancies: String,
}

/// The part of the overview that refreshes itself.
#[derive(Template)]
#[template(path = "live.html")]
struct Live {
    figures: Vec<Figure>,
    by_kind: Vec<KindRow>,
    last_run: Option<LastRun>,
    /// Whether the operator may read reconciliation runs.
    reads_runs: bool,
    updated: String,
}

/// `GET /console/`.
#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    chrome: Option<Chrome>,
    title: String,
    /// The live part, rendered.
    live: String,
    /// The break-glass account's name and its last uses, when an OpenID provider is configured
    /// and there is one.
    break_glass: Option<(String, Vec<BreakGlassUse>)>,
}

/// One recorded use of the break-glass account.
struct BreakGlassUse {
    at: String,
    action: String,
    outcome: String,
    what: String,
    source: String,
}

/// How many of the break-glass account's uses the overview lists.
const BREAK_GLASS_USES: i64 = 10;

/// The break-glass account's last uses, newest first (every operator sees them: that is the point).
async fn break_glass_uses(state: &OperatorsState) -> Result<Option<(String, Vec<BreakGlassUse>)>, Problem> {
    let Some(name) = state.sessions.local.break_glass() else { return Ok(None) };
    let mut conn = connection(state).await?;
    let filter = audit::Filter { operator: Some(name.to_owned()), limit: BREAK_GLASS_USES, ..audit::Filter::default() };
    let rows = audit::list(&mut conn, &filter, &Scope::Every).await.map_err(problem)?;
    let uses = rows
        .into_iter()
        .map(|row| {
            let detail = row.detail.unwrap_or_default();
            let what = match (detail["method"].as_str(), detail["path"].as_str()) {
                (Some(method), Some(path)) => format!("{method} {path}"),
                _ => String::new(),
            };
            BreakGlassUse {
                at: when(row.at),
                action: row.action,
                outcome: row.outcome,
                what,
                source: row.source.unwrap_or_default(),
            }
        })
        .collect();
    Ok(Some((name.to_owned(), uses)))
}

async fn live_of(state: &OperatorsState, caller: &Caller) -> Result<Live, Problem> {
    let tenants: Vec<Uuid> = visible_tenants(state, caller).await?.iter().map(|t| t.tenant_id.as_uuid()).collect();
    let mut conn = connection(state).await?;
    let o = queries::overview(&mut conn, &tenants).await.map_err(problem)?;
    let figures = vec![
        Figure { label: "Waiting to be sent", value: o.waiting.to_string(), link: None },
        Figure { label: "Being sent now", value: o.sending.to_string(), link: None },
        Figure { label: "Unknown (the provider may have charged)", value: o.unknown.to_string(), link: None },
        Figure {
            label: "The oldest unknown payment has waited",
            value: o.oldest_unknown.map_or_else(|| "none waits".to_owned(), age),
            link: None,
        },
        Figure { label: "Charges booked in the last hour", value: o.booked_last_hour.to_string(), link: None },
        Figure {
            label: "Proposals waiting for an approver",
            value: o.proposals_waiting.to_string(),
            link: Some("/console/proposals"),
        },
    ];
    let by_kind = o
        .open_by_kind
        .into_iter()
        .map(|k| KindRow {
            link: if KINDS.iter().any(|(kind, _)| !kind.is_empty() && *kind == k.kind) {
                format!("/console/dead-letters?kind={}", k.kind)
            } else {
                "/console/dead-letters#refunds".to_owned()
            },
            kind: k.kind,
            open: k.open,
            older_than_an_hour: k.older_than_an_hour,
            older_than_a_day: k.older_than_a_day,
            oldest: k.oldest.map(age).unwrap_or_default(),
        })
        .collect();
    let reads_runs = caller.account.scope == Scope::Every;
    let last_run = if reads_runs {
        let runs = recon::list(&mut conn, 1).await.map_err(problem)?;
        runs.0.into_iter().next().map(|run| LastRun {
            run_id: run.run_id,
            window: format!("{} to {}", when(run.window_start), when(run.window_end)),
            status: run.status.as_str().to_owned(),
            discrepancies: run.discrepancies.map_or_else(|| "not counted yet".to_owned(), |n| n.to_string()),
        })
    } else {
        None
    };
    Ok(Live { figures, by_kind, last_run, reads_runs, updated: when(OffsetDateTime::now_utc()) })
}

/// `GET /console/`: the overview.
pub(super) async fn overview(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let chrome = Chrome::of(&caller.account, "overview").noticed_by(&request);
            let live = live_of(&state, &caller).await.map_err(refused(&chrome))?;
            let live = live.render().map_err(|error| {
                tracing::error!(error = %error, "cannot render the overview");
                refused(&chrome)(Problem::new(ProblemType::ServiceUnavailable, "cannot render the overview"))
            })?;
            let break_glass = break_glass_uses(&state).await.map_err(refused(&chrome))?;
            let page = OverviewPage { chrome: Some(chrome), title: "Overview".into(), live, break_glass };
            Ok(html(StatusCode::OK, &page))
        }
        .await,
    )
}

/// `GET /console/live`: the overview's figures alone, for the script that refreshes them.
pub(super) async fn live(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let chrome = Chrome::of(&caller.account, "overview");
            let live = live_of(&state, &caller).await.map_err(refused(&chrome))?;
            Ok(html(StatusCode::OK, &live))
        }
        .await,
    )
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterQuery {
    kind: Option<String>,
    tenant: Option<String>,
    state: Option<String>,
    older_than: Option<String>,
    after: Option<String>,
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

/// One dead letter in the list.
struct DeadLetterLine {
    payment_id: PaymentId,
    tenant: String,
    kind: String,
    reason: String,
    age: String,
    created_at: String,
    status: String,
    resolution: String,
    amount: String,
}

/// `GET /console/dead-letters`.
#[derive(Template)]
#[template(path = "dead_letters.html")]
struct DeadLettersPage {
    chrome: Option<Chrome>,
    title: String,
    kinds: Vec<Choice>,
    tenants: Vec<Choice>,
    states: Vec<Choice>,
    ages: Vec<Choice>,
    lines: Vec<DeadLetterLine>,
    /// The next page's URL, when there is one.
    next: Option<String>,
    /// Whether the list shows open entries only, which a bulk retry can resend.
    open: bool,
    filter_kind: String,
    filter_tenant: String,
    filter_older_than: String,
    /// The refunds automation gave up on, of the tenants shown.
    dead_refunds: Vec<DeadRefundLine>,
}

/// A refund that waits for an operator, in a list: one automation gave up on, or a final one a
/// provider's report contradicts (`conflict`).
struct DeadRefundLine {
    refund_id: RefundId,
    payment_id: PaymentId,
    tenant: String,
    /// `unresolved` or `conflict`.
    kind: &'static str,
    /// The refund's status.
    status: &'static str,
    amount: String,
    reason: String,
    age: String,
    since: String,
}

impl DeadRefundLine {
    fn conflict(&self) -> bool {
        self.kind == DeadLetterKind::Conflict.as_str()
    }
}

impl From<dead_refunds::DeadRefund> for DeadRefundLine {
    fn from(refund: dead_refunds::DeadRefund) -> Self {
        Self {
            refund_id: refund.refund_id,
            payment_id: refund.payment_id,
            tenant: refund.tenant.unwrap_or_else(|| refund.tenant_id.to_string()),
            kind: refund.kind.as_str(),
            status: refund.refund_status.as_str(),
            amount: format_amount(refund.amount.minor_units(), refund.currency.as_str()),
            reason: refund.reason,
            age: age(refund.since),
            since: when(refund.since),
        }
    }
}

const KINDS: [(&str, &str); 3] = [("", "any kind"), ("unresolved", "unresolved"), ("conflict", "conflict")];
const STATES: [(&str, &str); 3] = [("open", "open"), ("resolved", "resolved"), ("all", "open or resolved")];
const AGES: [(&str, &str); 4] = [("", "any age"), ("3600", "an hour"), ("86400", "a day"), ("604800", "a week")];

/// `GET /console/dead-letters[?kind=][&tenant=][&state=][&older_than=][&after=]`: oldest first, a
/// page at a time; every filter is in the URL, so a page can be bookmarked.
pub(super) async fn dead_letters(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let chrome = Chrome::of(&caller.account, "dead-letters");
            let asked: DeadLetterQuery = query(&request).map_err(refused(&chrome))?;
            let visible = visible_tenants(&state, &caller).await.map_err(refused(&chrome))?;
            let bad = |what: &str| refused(&chrome)(Problem::new(ProblemType::InvalidRequest, what.to_owned()));
            let kind = asked.kind.clone().filter(|kind| !kind.is_empty());
            if kind.as_deref().is_some_and(|kind| !KINDS.iter().any(|(k, _)| *k == kind)) {
                return Err(bad("kind must be unresolved or conflict"));
            }
            let entry_state = match asked.state.as_deref().unwrap_or("open") {
                "open" => EntryState::Open,
                "resolved" => EntryState::Resolved,
                "all" => EntryState::All,
                _ => return Err(bad("state must be open, resolved or all")),
            };
            let older_than = asked.older_than.clone().filter(|age| !age.is_empty());
            let older_than_secs = match older_than.as_deref() {
                None => None,
                Some(secs) => Some(
                    secs.parse::<i64>()
                        .ok()
                        .filter(|secs| *secs >= 0)
                        .ok_or_else(|| bad("older_than must be a whole number of seconds"))?,
                ),
            };
            let tenant = asked.tenant.clone().filter(|tenant| !tenant.is_empty());
            let tenants: Vec<Uuid> = match &tenant {
                None => visible.iter().map(|t| t.tenant_id.as_uuid()).collect(),
                // A tenant the operator may not see is as absent as one that does not exist.
                Some(name) => visible.iter().filter(|t| &t.name == name).map(|t| t.tenant_id.as_uuid()).collect(),
            };
            let after = match asked.after.as_deref() {
                None | Some("") => None,
                Some(text) => Some(Cursor::decode(text).ok_or_else(|| bad("after is not a page of this list"))?),
            };
            let filter = DeadLetterFilter { kind: kind.clone(), tenants, state: entry_state, older_than_secs, after };
            let mut conn = connection(&state).await.map_err(refused(&chrome))?;
            let (rows, more) =
                queries::dead_letter_page(&mut conn, &filter, PAGE_ROWS).await.map_err(failed(&chrome))?;
            let dead_refunds = dead_refunds::list(&mut conn, Some(&filter.tenants), None)
                .await
                .map_err(failed(&chrome))?
                .into_iter()
                .map(DeadRefundLine::from)
                .collect();
            let next = rows.last().filter(|_| more).map(|last| {
                let cursor = Cursor { created_at: last.created_at, dead_letter_id: last.dead_letter_id };
                let pairs = [
                    ("kind", kind.clone().unwrap_or_default()),
                    ("tenant", tenant.clone().unwrap_or_default()),
                    ("state", asked.state.clone().unwrap_or_else(|| "open".into())),
                    ("older_than", older_than.clone().unwrap_or_default()),
                    ("after", cursor.encode()),
                ];
                format!("/console/dead-letters?{}", serde_urlencoded::to_string(pairs).unwrap_or_default())
            });
            let lines = rows
                .into_iter()
                .map(|r| DeadLetterLine {
                    payment_id: r.payment_id,
                    tenant: r.tenant,
                    kind: r.kind,
                    reason: r.reason,
                    age: age(r.created_at),
                    created_at: when(r.created_at),
                    status: r.status.as_str().to_owned(),
                    resolution: r.resolution.unwrap_or_else(|| "open".into()),
                    amount: format_amount(r.amount.minor_units(), r.currency.as_str()),
                })
                .collect();
            let mut tenant_choices = vec![Choice { value: String::new(), label: "any tenant".into(), selected: false }];
            tenant_choices.extend(visible.iter().map(|t| Choice {
                value: t.name.clone(),
                label: t.name.clone(),
                selected: tenant.as_deref() == Some(t.name.as_str()),
            }));
            let page = DeadLettersPage {
                chrome: Some(chrome),
                title: "Dead letters".into(),
                kinds: choices(&KINDS, kind.as_deref().unwrap_or("")),
                tenants: tenant_choices,
                states: choices(&STATES, asked.state.as_deref().unwrap_or("open")),
                ages: choices(&AGES, older_than.as_deref().unwrap_or("")),
                lines,
                next,
                open: entry_state == EntryState::Open,
                filter_kind: kind.unwrap_or_default(),
                filter_tenant: tenant.unwrap_or_default(),
                filter_older_than: older_than.unwrap_or_default(),
                dead_refunds,
            };
            Ok(html(StatusCode::OK, &page))
        }
        .await,
    )
}

/// A payment the search found.
pub(super) struct FoundLine {
    pub(super) payment_id: PaymentId,
    pub(super) matched: String,
    pub(super) tenant: String,
    pub(super) status: String,
    pub(super) amount: String,
    pub(super) created_at: String,
}

/// What a search found.
#[derive(Template)]
#[template(path = "search.html")]
pub(super) struct SearchPage {
    pub(super) chrome: Option<Chrome>,
    pub(super) title: String,
    pub(super) asked: String,
    pub(super) found: Vec<FoundLine>,
}

/// A label and a value on a payment's page.
struct Fact {
    label: &'static str,
    value: String,
}

/// What the provider holds for a payment, asked on demand.
struct ProviderView {
    charges: Vec<Charge>,
    contradictions: Vec<String>,
    /// Why the provider could not be asked.
    error: Option<String>,
}

impl ProviderView {
    /// A charge's amount as people read money.
    fn amount_of(&self, charge: &Charge) -> String {
        format_amount(charge.amount, &charge.currency)
    }
}

/// A proposal, as a page lists it.
struct ProposalLine {
    proposal_id: Uuid,
    /// The payment it is about; none for a proposal on a tenant.
    payment_id: Option<PaymentId>,
    /// What it is about, in words.
    about: String,
    action: String,
    reason: String,
    status: ProposalStatus,
    proposed_by: String,
    proposed_at: String,
    expires_at: String,
    /// Who decided, when and why.
    decided: String,
    /// Whether it is the operator's own (they may withdraw it, not approve it).
    own: bool,
    /// Whether the operator may collect the API key its approval made: their own, approved, and not
    /// collected yet.
    collectable: bool,
}

impl ProposalLine {
    fn of(proposal: ProposalView, operator: &str) -> Self {
        let action = proposal_action(&proposal);
        let decided = match (&proposal.decided_by, proposal.decided_at) {
            (Some(by), Some(at)) => {
                format!("{by}, {}: {}", when(at), proposal.decision_note.as_deref().unwrap_or_default())
            }
            _ => String::new(),
        };
        let own = proposal.proposed_by == operator;
        let issues_a_key = serde_json::from_value::<Proposed>(proposal.action.clone()).is_ok_and(|p| p.issues_a_key());
        let collectable =
            own && issues_a_key && proposal.status == ProposalStatus::Approved && proposal.key_collected_at.is_none();
        Self {
            proposal_id: proposal.proposal_id,
            payment_id: proposal.payment_id,
            about: proposal.about(),
            action,
            own,
            collectable,
            reason: proposal.reason,
            status: proposal.status,
            proposed_by: proposal.proposed_by,
            proposed_at: when(proposal.proposed_at),
            expires_at: when(proposal.expires_at),
            decided,
        }
    }
}

/// One line of a payment's timeline.
struct TimelineLine {
    at: String,
    source: &'static str,
    by: String,
    what: String,
}

impl From<Happened> for TimelineLine {
    fn from(happened: Happened) -> Self {
        Self { at: when(happened.at), source: happened.source, by: happened.by, what: happened.what }
    }
}

/// The payment's open dead letter.
struct OpenEntry {
    kind: String,
    reason: String,
    since: String,
}

/// One of the payment's refunds.
struct RefundLine {
    refund_id: RefundId,
    amount: String,
    status: String,
    provider_refund_id: String,
    requested_by: String,
    created_at: String,
    /// Why it failed, when it did.
    failure: String,
}

impl From<operator_refunds::RefundView> for RefundLine {
    fn from(refund: operator_refunds::RefundView) -> Self {
        Self {
            refund_id: refund.refund_id,
            amount: format_amount(refund.amount.minor_units(), refund.currency.as_str()),
            status: refund.status.as_str().to_owned(),
            provider_refund_id: refund.provider_refund_id.unwrap_or_default(),
            requested_by: refund.requested_by,
            created_at: when(refund.created_at),
            failure: refund.failure.unwrap_or_default(),
        }
    }
}

/// The reasons a refund may give, for the form's list: the provider's words and what they say.
const REFUND_REASONS: [(&str, &str); 3] = [
    ("duplicate", "charged twice for one thing"),
    ("fraudulent", "the charge was fraudulent"),
    ("requested_by_customer", "the customer asked for it"),
];

/// `GET /console/payments/{id}`.
#[derive(Template)]
#[template(path = "payment.html")]
struct PaymentPage {
    chrome: Option<Chrome>,
    title: String,
    payment_id: PaymentId,
    facts: Vec<Fact>,
    open_entry: Option<OpenEntry>,
    pending: Option<ProposalLine>,
    proposals: Vec<ProposalLine>,
    timeline: Vec<TimelineLine>,
    provider: Option<ProviderView>,
    /// Whether the payment succeeded, and so has a list of refunds.
    refundable_payment: bool,
    /// Its refunds, oldest first.
    refunds: Vec<RefundLine>,
    /// What is left to refund, when anything is: as people read it, and in minor units.
    left_to_refund: Option<(String, i64)>,
    /// The reasons a refund may give.
    refund_reasons: &'static [(&'static str, &'static str)],
    /// Its refunds automation gave up on, for an operator to resend or settle.
    dead_refunds: Vec<DeadRefundLine>,
    /// Its final refunds a provider's report contradicts, for an operator to acknowledge.
    refund_conflicts: Vec<DeadRefundLine>,
}

/// A proposal's action, in words; as stored, should it be one this version does not know.
fn proposal_action(proposal: &ProposalView) -> String {
    serde_json::from_value::<Proposed>(proposal.action.clone())
        .map_or_else(|_| proposal.action.to_string(), |proposed| proposed.to_string())
}

#[derive(Debug, Default, Deserialize)]
struct PaymentQuery {
    /// `ask`: fetch the provider's view now.
    provider: Option<String>,
    notice: Option<String>,
}

/// A payment's id from a URL; a payment that cannot exist is not found.
pub(super) fn payment_id_of(text: &str) -> Result<PaymentId, Problem> {
    PaymentId::from_str(text).map_err(|_| Problem::new(ProblemType::NotFound, format!("there is no payment {text:?}")))
}

fn no_payment(payment_id: PaymentId) -> Problem {
    Problem::new(ProblemType::NotFound, format!("there is no payment {payment_id}"))
}

/// `GET /console/payments/{id}[?provider=ask]`: the payment, its dead letters, proposals and
/// timeline, and, when asked, the provider's charges for it beside the ledger.
pub(super) async fn payment(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let asked: PaymentQuery = query(&request).unwrap_or_default();
            let chrome = Chrome::of(&caller.account, "dead-letters").noticed(asked.notice.as_deref());
            let fail = refused(&chrome);
            let payment_id = payment_id_of(&path).map_err(&fail)?;
            let visible: Vec<Uuid> =
                visible_tenants(&state, &caller).await.map_err(&fail)?.iter().map(|t| t.tenant_id.as_uuid()).collect();
            let mut conn = connection(&state).await.map_err(&fail)?;
            let payment = queries::payment(&mut conn, &visible, payment_id)
                .await
                .map_err(failed(&chrome))?
                .ok_or_else(|| fail(no_payment(payment_id)))?;
            let (timeline, dead_letters) =
                queries::timeline(&mut conn, payment.tenant_id, payment_id).await.map_err(failed(&chrome))?;
            let proposals = proposals::list(&mut conn, &caller.account.scope, Some(payment_id), None)
                .await
                .map_err(failed(&chrome))?;
            let refunds = operator_refunds::of_payment(&mut conn, payment.tenant_id, payment_id)
                .await
                .map_err(failed(&chrome))?;
            let tenant = [payment.tenant_id.as_uuid()];
            let (refund_conflicts, dead_refunds): (Vec<_>, Vec<_>) =
                dead_refunds::list(&mut conn, Some(&tenant), Some(payment_id))
                    .await
                    .map_err(failed(&chrome))?
                    .into_iter()
                    .map(DeadRefundLine::from)
                    .partition(DeadRefundLine::conflict);
            let masked = caller.account.role == Role::Viewer;
            let read = Entry::new("payment.read", Outcome::Done)
                .payment(payment.tenant_id, payment_id)
                .detail(json!({ "customer_data": if masked { "masked" } else { "shown" }, "via": "console" }));
            audit::record(&mut conn, &caller.actor(), &read).await.map_err(failed(&chrome))?;
            drop(conn);
            let provider = if asked.provider.as_deref() == Some("ask") {
                Some(provider_view(&state, &payment, payment_id).await)
            } else {
                None
            };
            let facts = facts(&payment, masked);
            let name = caller.account.name.as_str();
            let proposals: Vec<ProposalLine> = proposals.into_iter().map(|p| ProposalLine::of(p, name)).collect();
            let (pending, proposals): (Vec<_>, Vec<_>) =
                proposals.into_iter().partition(|p| p.status == ProposalStatus::Pending);
            let open_entry = dead_letters.into_iter().find(|d| d.resolved_at.is_none()).map(|d| OpenEntry {
                kind: d.kind,
                reason: d.reason,
                since: when(d.created_at),
            });
            let page = PaymentPage {
                chrome: Some(chrome.clone()),
                title: format!("Payment {payment_id}"),
                payment_id,
                facts,
                open_entry,
                pending: pending.into_iter().next(),
                proposals,
                timeline: timeline.into_iter().map(TimelineLine::from).collect(),
                provider,
                refundable_payment: refunds.status == PaymentStatus::Succeeded,
                left_to_refund: (refunds.status == PaymentStatus::Succeeded && refunds.left() > 0)
                    .then(|| (format_amount(refunds.left(), refunds.currency.as_str()), refunds.left())),
                refunds: refunds.refunds.into_iter().map(RefundLine::from).collect(),
                refund_reasons: &REFUND_REASONS,
                dead_refunds,
                refund_conflicts,
            };
            Ok(html(StatusCode::OK, &page))
        }
        .await,
    )
}

fn facts(payment: &queries::Payment, masked: bool) -> Vec<Fact> {
    let mask = |text: &str| if masked { masking::reference(text) } else { text.to_owned() };
    let mut facts = vec![
        Fact { label: "Tenant", value: payment.tenant.clone() },
        Fact { label: "Status", value: payment.status.as_str().to_owned() },
        Fact { label: "Amount", value: format_amount(payment.amount.minor_units(), payment.currency.as_str()) },
        Fact { label: "Customer reference", value: mask(&payment.customer_id) },
        Fact {
            label: "Idempotency-Key",
            value: payment.idempotency_key.clone().unwrap_or_else(|| "(reaped after its retention)".into()),
        },
        Fact { label: "Accepted", value: when(payment.created_at) },
        Fact { label: "Last changed", value: when(payment.updated_at) },
        Fact { label: "Sends", value: payment.send_attempts.to_string() },
    ];
    if let Some(first) = payment.first_sent_at {
        facts.push(Fact { label: "First sent", value: when(first) });
    }
    if let Some(method) = &payment.payment_method {
        facts.push(Fact { label: "Payment method", value: mask(method) });
    }
    if !masked {
        if let Some(description) = &payment.description {
            facts.push(Fact { label: "Description", value: description.clone() });
        }
        if payment.metadata.as_object().is_some_and(|m| !m.is_empty()) {
            facts.push(Fact { label: "Metadata", value: payment.metadata.to_string() });
        }
    }
    if let Some(account) = &payment.provider_account {
        facts.push(Fact { label: "Provider account", value: account.to_string() });
    }
    if let Some(charge) = &payment.provider_charge_id {
        facts.push(Fact { label: "Provider charge", value: charge.clone() });
    }
    match (&payment.booked_charge, payment.booked_amount, &payment.booked_currency) {
        (Some(charge), Some(amount), Some(currency)) => {
            facts.push(Fact {
                label: "Ledger",
                value: format!("{} booked with charge {charge}", format_amount(amount, currency)),
            });
        }
        _ => facts.push(Fact { label: "Ledger", value: "no charge booked".into() }),
    }
    if let (Some(code), Some(message)) = (&payment.failure_code, &payment.failure_message) {
        facts.push(Fact { label: "Failure", value: format!("{code}: {message}") });
    }
    if payment.status == PaymentStatus::Succeeded {
        let money = |minor_units: i64| format_amount(minor_units, payment.currency.as_str());
        facts.push(Fact {
            label: "Refunded",
            value: format!(
                "{} of {} ({} promised back, counting refunds not yet final)",
                money(payment.refunded),
                money(payment.amount.minor_units()),
                money(payment.refunds_reserved)
            ),
        });
    }
    facts
}

/// Asks the provider for the payment's charges now, and compares them with the ledger.
async fn provider_view(state: &OperatorsState, payment: &queries::Payment, payment_id: PaymentId) -> ProviderView {
    let asked = async {
        let provider = ConfiguredProvider::new(&state.provider).map_err(|error| format!("{error:#}"))?;
        provider
            .find_by_key(&payment_id.downstream_key(), payment.provider_account.as_ref())
            .await
            .map_err(|error| error.to_string())
    };
    match asked.await {
        Ok(charges) => {
            let booked = match (&payment.booked_charge, payment.booked_amount, &payment.booked_currency) {
                (Some(charge), Some(amount), Some(currency)) => Some((charge.as_str(), amount, currency.as_str())),
                _ => None,
            };
            let ours = Ours {
                status: payment.status,
                amount: payment.amount.minor_units(),
                currency: payment.currency.as_str(),
                booked,
            };
            let contradictions = provider_view::contradictions(&ours, &charges);
            ProviderView { charges, contradictions, error: None }
        }
        Err(error) => {
            tracing::warn!(error, "the console cannot ask the provider about a payment");
            ProviderView {
                charges: Vec::new(),
                contradictions: Vec::new(),
                error: Some("the provider cannot be asked now; the reconciler's log has the cause".into()),
            }
        }
    }
}

/// `GET /console/proposals`.
#[derive(Template)]
#[template(path = "proposals.html")]
struct ProposalsPage {
    chrome: Option<Chrome>,
    title: String,
    pending: Vec<ProposalLine>,
    decided: Vec<ProposalLine>,
}

/// `GET /console/proposals`: those waiting for an approver, then the latest decided.
pub(super) async fn proposals(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let chrome = Chrome::of(&caller.account, "proposals").noticed_by(&request);
            let mut conn = connection(&state).await.map_err(refused(&chrome))?;
            let all = proposals::list(&mut conn, &caller.account.scope, None, None).await.map_err(failed(&chrome))?;
            let name = caller.account.name.as_str();
            let (pending, decided): (Vec<_>, Vec<_>) =
                all.into_iter().map(|p| ProposalLine::of(p, name)).partition(|p| p.status == ProposalStatus::Pending);
            let page = ProposalsPage { chrome: Some(chrome), title: "Proposals".into(), pending, decided };
            Ok(html(StatusCode::OK, &page))
        }
        .await,
    )
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    operator: Option<String>,
    tenant: Option<String>,
    action: Option<String>,
    /// The first day, `YYYY-MM-DD` (UTC).
    from: Option<String>,
    /// The last day, `YYYY-MM-DD` (UTC), included.
    to: Option<String>,
    before: Option<i64>,
}

/// The start of day `text` (`YYYY-MM-DD`), UTC; `None` for an empty field.
fn day(text: Option<&str>) -> Result<Option<OffsetDateTime>, Problem> {
    let Some(text) = text.filter(|t| !t.is_empty()) else { return Ok(None) };
    let format = time::macros::format_description!("[year]-[month]-[day]");
    let date = time::Date::parse(text, format)
        .map_err(|_| Problem::new(ProblemType::InvalidRequest, format!("{text:?} is not a day (YYYY-MM-DD)")))?;
    Ok(Some(date.midnight().assume_utc()))
}

/// One row of the audit trail.
struct AuditLine {
    at: String,
    operator: String,
    action: String,
    outcome: String,
    payment_id: Option<PaymentId>,
    reason: String,
}

/// `GET /console/audit`.
#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    chrome: Option<Chrome>,
    title: String,
    operator: String,
    action: String,
    from: String,
    to: String,
    tenants: Vec<Choice>,
    lines: Vec<AuditLine>,
    older: Option<String>,
}

/// `GET /console/audit[?operator=][&tenant=][&action=][&before=]`: newest first, a page at a time.
pub(super) async fn audit(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let chrome = Chrome::of(&caller.account, "audit");
            let asked: AuditQuery = query(&request).map_err(refused(&chrome))?;
            let visible = visible_tenants(&state, &caller).await.map_err(refused(&chrome))?;
            let operator = asked.operator.clone().filter(|o| !o.is_empty());
            let action = asked.action.clone().filter(|a| !a.is_empty());
            let tenant = asked.tenant.clone().filter(|t| !t.is_empty());
            let tenant_id: Option<TenantId> = match &tenant {
                None => None,
                Some(name) => Some(visible.iter().find(|t| &t.name == name).map(|t| t.tenant_id).ok_or_else(|| {
                    refused(&chrome)(Problem::new(ProblemType::NotFound, format!("no tenant named {name}")))
                })?),
            };
            let since = day(asked.from.as_deref()).map_err(refused(&chrome))?;
            let until = day(asked.to.as_deref()).map_err(refused(&chrome))?.map(|to| to + time::Duration::DAY);
            let filter = audit::Filter {
                operator: operator.clone(),
                tenant_id,
                payment_id: None,
                action: action.clone(),
                before_id: asked.before,
                since,
                until,
                limit: PAGE_ROWS,
            };
            let mut conn = connection(&state).await.map_err(refused(&chrome))?;
            let rows = audit::list(&mut conn, &filter, &caller.account.scope).await.map_err(failed(&chrome))?;
            let older = rows.last().filter(|_| rows.len() as i64 == PAGE_ROWS).map(|last| {
                let pairs = [
                    ("operator", operator.clone().unwrap_or_default()),
                    ("tenant", tenant.clone().unwrap_or_default()),
                    ("action", action.clone().unwrap_or_default()),
                    ("from", asked.from.clone().unwrap_or_default()),
                    ("to", asked.to.clone().unwrap_or_default()),
                    ("before", last.audit_id.to_string()),
                ];
                format!("/console/audit?{}", serde_urlencoded::to_string(pairs).unwrap_or_default())
            });
            let lines = rows
                .into_iter()
                .map(|r| AuditLine {
                    at: when(r.at),
                    operator: r.operator,
                    action: r.action,
                    outcome: r.outcome,
                    payment_id: r.payment_id,
                    reason: r.reason.unwrap_or_default(),
                })
                .collect();
            let mut tenants = vec![Choice { value: String::new(), label: "any tenant".into(), selected: false }];
            tenants.extend(visible.iter().map(|t| Choice {
                value: t.name.clone(),
                label: t.name.clone(),
                selected: tenant.as_deref() == Some(t.name.as_str()),
            }));
            let page = AuditPage {
                chrome: Some(chrome),
                title: "Audit trail".into(),
                operator: operator.unwrap_or_default(),
                action: action.unwrap_or_default(),
                from: asked.from.clone().unwrap_or_default(),
                to: asked.to.clone().unwrap_or_default(),
                tenants,
                lines,
                older,
            };
            Ok(html(StatusCode::OK, &page))
        }
        .await,
    )
}

/// One reconciliation run in the list.
struct RunLine {
    run_id: Uuid,
    window: String,
    trigger: String,
    status: String,
    discrepancies: String,
}

/// `GET /console/recon`.
#[derive(Template)]
#[template(path = "recon.html")]
struct ReconPage {
    chrome: Option<Chrome>,
    title: String,
    runs: Vec<RunLine>,
}

/// `GET /console/recon`: the latest reconciliation runs (operators of every tenant only).
pub(super) async fn recon_runs(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let chrome = Chrome::of(&caller.account, "recon");
            every_tenant(&caller).map_err(failed(&chrome))?;
            let mut conn = connection(&state).await.map_err(refused(&chrome))?;
            let list = recon::list(&mut conn, 50).await.map_err(failed(&chrome))?;
            let runs = list
                .0
                .into_iter()
                .map(|run| RunLine {
                    run_id: run.run_id,
                    window: format!("{} to {}", when(run.window_start), when(run.window_end)),
                    trigger: run.trigger.as_str().to_owned(),
                    status: run.status.as_str().to_owned(),
                    discrepancies: run.discrepancies.map(|n| n.to_string()).unwrap_or_default(),
                })
                .collect();
            Ok(html(StatusCode::OK, &ReconPage { chrome: Some(chrome), title: "Reconciliation".into(), runs }))
        }
        .await,
    )
}

/// One discrepancy of a run.
struct DiscrepancyLine {
    payment_id: Option<PaymentId>,
    charge: String,
    detail: String,
}

/// Discrepancies of one class.
struct ClassGroup {
    class: String,
    lines: Vec<DiscrepancyLine>,
}

/// `GET /console/recon/{id}`.
#[derive(Template)]
#[template(path = "recon_run.html")]
struct RunPage {
    chrome: Option<Chrome>,
    title: String,
    window: String,
    status: String,
    error: Option<String>,
    compared: String,
    classes: Vec<ClassGroup>,
}

/// `GET /console/recon/{id}`: a run, and its discrepancies by class, each linked to its payment.
pub(super) async fn recon_run(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let chrome = Chrome::of(&caller.account, "recon");
            every_tenant(&caller).map_err(failed(&chrome))?;
            let not_found = || {
                refused(&chrome)(Problem::new(ProblemType::NotFound, format!("there is no run {:?}", path.as_str())))
            };
            let run_id = Uuid::parse_str(&path).map_err(|_| not_found())?;
            let mut conn = connection(&state).await.map_err(refused(&chrome))?;
            let detail = recon::show(&mut conn, run_id).await.map_err(failed(&chrome))?;
            let mut classes: Vec<ClassGroup> = Vec::new();
            for d in detail.discrepancies {
                let class = d.class.as_str().to_owned();
                let line = DiscrepancyLine {
                    payment_id: d.payment_id,
                    charge: d.provider_charge_id.unwrap_or_default(),
                    detail: d.detail,
                };
                match classes.iter_mut().find(|group| group.class == class) {
                    Some(group) => group.lines.push(line),
                    None => classes.push(ClassGroup { class, lines: vec![line] }),
                }
            }
            let run = detail.run;
            let page = RunPage {
                chrome: Some(chrome),
                title: format!("Reconciliation run {run_id}"),
                window: format!("{} to {}", when(run.window_start), when(run.window_end)),
                status: format!("{} ({})", run.status.as_str(), run.trigger.as_str()),
                error: run.error,
                compared: format!(
                    "{} provider charges against {} ledger entries, {} provider refunds against {} refund ledger \
                     entries",
                    run.provider_charges.unwrap_or_default(),
                    run.ledger_entries.unwrap_or_default(),
                    run.provider_refunds.unwrap_or_default(),
                    run.refund_ledger_entries.unwrap_or_default()
                ),
                classes,
            };
            Ok(html(StatusCode::OK, &page))
        }
        .await,
    )
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

#[cfg(test)]
mod tests {
    use oncepay_domain::refund::RefundReason;

    use super::*;

    #[test]
    fn the_refund_forms_list_offers_every_reason_the_intake_knows() {
        let offered: Vec<&str> = REFUND_REASONS.iter().map(|(value, _)| *value).collect();
        let known: Vec<&str> = RefundReason::ALL.iter().map(|reason| reason.as_str()).collect();
        assert_eq!(offered, known);
    }
}
