//! `GET /console/audit`: the operators' audit trail, filtered by operator, tenant, action and day.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_http::problem::{Problem, ProblemType};
use serde::Deserialize;
use time::OffsetDateTime;

use super::{Choice, PAGE_ROWS, done, failed, refused, when};
use crate::{Chrome, caller_or_sign_in, html, visible_tenants};
use oncepay_ops::operators::api::{OperatorsState, connection, query};
use oncepay_ops::operators::audit::{self};

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
pub(crate) async fn audit(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
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
