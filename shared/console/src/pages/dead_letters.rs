//! `GET /console/dead-letters`: open or resolved dead letters, filtered in the URL and paged by
//! age, and below them the refunds that wait for an operator.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use oncepay_domain::ids::{PaymentId, RefundId};
use oncepay_domain::money::format_amount;
use oncepay_http::problem::{Problem, ProblemType};
use serde::Deserialize;
use uuid::Uuid;

use super::{Choice, PAGE_ROWS, age, choices, done, failed, refused, when};
use crate::queries::{self, Cursor, DeadLetterFilter, EntryState};
use crate::{Chrome, caller_or_sign_in, html, visible_tenants};
use oncepay_ops::dead_letters::Kind as DeadLetterKind;
use oncepay_ops::dead_letters::refunds as dead_refunds;
use oncepay_ops::operators::api::{OperatorsState, connection, query};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeadLetterQuery {
    pub(crate) kind: Option<String>,
    pub(crate) tenant: Option<String>,
    pub(crate) state: Option<String>,
    pub(crate) older_than: Option<String>,
    pub(crate) after: Option<String>,
}

impl DeadLetterQuery {
    /// The kind asked for; a blank field (the form's "any kind") asks for none.
    fn kind(&self) -> Option<String> {
        self.kind.clone().filter(|kind| !kind.is_empty())
    }

    /// The tenant asked for, by name; blank asks for every tenant the operator may see.
    fn tenant(&self) -> Option<String> {
        self.tenant.clone().filter(|tenant| !tenant.is_empty())
    }

    /// The least age asked for, in seconds as typed; blank asks for any age.
    fn older_than(&self) -> Option<String> {
        self.older_than.clone().filter(|age| !age.is_empty())
    }

    /// The filter this query asks for, of the `visible` tenants; a value the page never offers is
    /// refused.
    pub(crate) fn filter(&self, visible: &[queries::Tenant]) -> Result<DeadLetterFilter, Problem> {
        let bad = |what: &str| Problem::new(ProblemType::InvalidRequest, what.to_owned());
        let kind = self.kind();
        if kind.as_deref().is_some_and(|kind| !KINDS.iter().any(|(k, _)| *k == kind)) {
            return Err(bad("kind must be unresolved or conflict"));
        }
        let state = match self.state.as_deref().unwrap_or("open") {
            "open" => EntryState::Open,
            "resolved" => EntryState::Resolved,
            "all" => EntryState::All,
            _ => return Err(bad("state must be open, resolved or all")),
        };
        let older_than_secs = match self.older_than() {
            None => None,
            Some(secs) => Some(
                secs.parse::<i64>()
                    .ok()
                    .filter(|secs| *secs >= 0)
                    .ok_or_else(|| bad("older_than must be a whole number of seconds"))?,
            ),
        };
        let tenants: Vec<Uuid> = match self.tenant() {
            None => visible.iter().map(|t| t.tenant_id.as_uuid()).collect(),
            // A tenant the operator may not see is as absent as one that does not exist.
            Some(name) => visible.iter().filter(|t| t.name == name).map(|t| t.tenant_id.as_uuid()).collect(),
        };
        let after = match self.after.as_deref() {
            None | Some("") => None,
            Some(text) => Some(Cursor::decode(text).ok_or_else(|| bad("after is not a page of this list"))?),
        };
        Ok(DeadLetterFilter { kind, tenants, state, older_than_secs, after })
    }

    /// The URL of the page after `cursor`, with the same filters.
    fn page_after(&self, cursor: &Cursor) -> String {
        let pairs = [
            ("kind", self.kind().unwrap_or_default()),
            ("tenant", self.tenant().unwrap_or_default()),
            ("state", self.state.clone().unwrap_or_else(|| "open".into())),
            ("older_than", self.older_than().unwrap_or_default()),
            ("after", cursor.encode()),
        ];
        format!("/console/dead-letters?{}", serde_urlencoded::to_string(pairs).unwrap_or_default())
    }
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
pub(super) struct DeadRefundLine {
    pub(super) refund_id: RefundId,
    pub(super) payment_id: PaymentId,
    pub(super) tenant: String,
    /// `unresolved` or `conflict`.
    pub(super) kind: &'static str,
    /// The refund's status.
    pub(super) status: &'static str,
    pub(super) amount: String,
    pub(super) reason: String,
    pub(super) age: String,
    pub(super) since: String,
}

impl DeadRefundLine {
    pub(super) fn conflict(&self) -> bool {
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

pub(crate) const KINDS: [(&str, &str); 3] = [("", "any kind"), ("unresolved", "unresolved"), ("conflict", "conflict")];
const STATES: [(&str, &str); 3] = [("open", "open"), ("resolved", "resolved"), ("all", "open or resolved")];
const AGES: [(&str, &str); 4] = [("", "any age"), ("3600", "an hour"), ("86400", "a day"), ("604800", "a week")];

/// `GET /console/dead-letters[?kind=][&tenant=][&state=][&older_than=][&after=]`: oldest first, a
/// page at a time; every filter is in the URL, so a page can be bookmarked.
pub(crate) async fn dead_letters(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let chrome = Chrome::of(&caller.account, "dead-letters");
            let asked: DeadLetterQuery = query(&request).map_err(refused(&chrome))?;
            let visible = visible_tenants(&state, &caller).await.map_err(refused(&chrome))?;
            let filter = asked.filter(&visible).map_err(refused(&chrome))?;
            let (kind, tenant, older_than) = (asked.kind(), asked.tenant(), asked.older_than());
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
                asked.page_after(&Cursor { created_at: last.created_at, dead_letter_id: last.dead_letter_id })
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
                open: filter.state == EntryState::Open,
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
