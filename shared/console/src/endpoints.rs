//! The console's view of merchants' webhook endpoints: every endpoint of the tenants an operator
//! may see, why a stopped one stopped and what waits for it, and the forms that start or stop one,
//! replay its dead-lettered deliveries since a time, or replay one event (from a payment's page).
//!
//! Each change asks for a reason, then for a confirmation, and is done by the same function the
//! JSON API calls ([`oncepay_ops::operators::api::events`]), which writes its audit row; a refusal
//! is recorded the same way. Nothing here reads an endpoint's secrets.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use oncepay_domain::ids::PaymentId;
use oncepay_http::problem::{Problem, ProblemType};
use serde::Deserialize;
use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

use super::forms::{Confirmation, ask_to_confirm, finish};
use super::queries::{self, EndpointRow};
use super::{Chrome, caller_or_sign_in, error_page, html, see_other, visible_tenants};
use oncepay_ops::operator_error::OperatorError;
use oncepay_ops::operators::api::events::{
    REPLAY_ENDPOINT_ACTION, REPLAY_EVENT_ACTION, replay_endpoint, replay_event_of, switch_action, switch_endpoint,
};
use oncepay_ops::operators::api::signing_in::Caller;
use oncepay_ops::operators::api::{OperatorsState, connection, problem};
use oncepay_ops::operators::audit::{Entry, Outcome};
use oncepay_ops::render;
use oncepay_store::merchant_deliveries::Replayed;

/// Where the endpoints page is.
const PAGE: &str = "/console/endpoints";

/// `GET /console/endpoints`.
#[derive(Template)]
#[template(path = "endpoints.html")]
struct EndpointsPage {
    chrome: Option<Chrome>,
    title: String,
    tenants: Vec<TenantEndpoints>,
}

/// A tenant and its endpoints, oldest first.
struct TenantEndpoints {
    name: String,
    endpoints: Vec<EndpointLine>,
}

/// One endpoint, as the page shows it.
struct EndpointLine {
    endpoint_id: Uuid,
    url: String,
    description: String,
    /// The types it receives, or "every type".
    event_types: String,
    enabled: bool,
    /// Whether it is enabled or why not, in words.
    state: String,
    /// Whether deliveries stopped it (it is gone or kept failing), rather than a person.
    stopped_by_delivery: bool,
    failing_since: String,
    pending: i64,
    dead_lettered: i64,
    /// Where the replay form's time starts, as the form's field takes it: when the endpoint began
    /// failing, or a day ago.
    replay_from: String,
}

impl From<EndpointRow> for EndpointLine {
    fn from(row: EndpointRow) -> Self {
        let state = match (row.enabled, row.disabled_reason.as_deref()) {
            (true, _) => "enabled".to_owned(),
            (false, Some("gone")) => "stopped: it answered 410 Gone".to_owned(),
            (false, Some("failing")) => "stopped: every delivery failed for too long".to_owned(),
            (false, Some("merchant")) => "stopped by the merchant or an operator".to_owned(),
            (false, Some(other)) => format!("stopped ({other})"),
            (false, None) => "stopped".to_owned(),
        };
        let stopped_at = row.disabled_at.map(|at| format!(" at {}", render::timestamp(at))).unwrap_or_default();
        let from = row.failing_since.unwrap_or_else(|| OffsetDateTime::now_utc() - Duration::DAY);
        Self {
            endpoint_id: row.endpoint_id,
            event_types: if row.event_types.is_empty() { "every type".to_owned() } else { row.event_types.join(", ") },
            enabled: row.enabled,
            state: if row.enabled { state } else { format!("{state}{stopped_at}") },
            stopped_by_delivery: queries::STOPPED_BY_DELIVERY.contains(&row.disabled_reason.as_deref().unwrap_or("")),
            failing_since: row.failing_since.map(render::timestamp).unwrap_or_default(),
            pending: row.pending,
            dead_lettered: row.dead_lettered,
            replay_from: form_time(from),
            url: row.url,
            description: row.description,
        }
    }
}

/// `at` as a `datetime-local` field takes it, in UTC: `2026-11-30T06:00`.
fn form_time(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}", at.year(), u8::from(at.month()), at.day(), at.hour(), at.minute())
}

/// A time from the replay form: `2026-11-30T06:00` or with seconds, in UTC, as a `datetime-local`
/// field sends it, or RFC 3339.
fn since_of(text: &str) -> Result<OffsetDateTime, OperatorError> {
    let text = text.trim();
    let full = match text.len() {
        16 => format!("{text}:00Z"),
        19 => format!("{text}Z"),
        _ => text.to_owned(),
    };
    OffsetDateTime::parse(&full, &Rfc3339)
        .map_err(|_| OperatorError::Invalid(format!("{text:?} is not a time: write it as 2026-11-30T06:00, in UTC")))
}

/// `GET /console/endpoints`: the endpoints of every tenant the operator may see.
pub(super) async fn endpoints_page(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    let caller = match caller_or_sign_in(&state, &request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let chrome = Chrome::of(&caller.account, "endpoints").noticed_by(&request);
    let read = async {
        let visible = visible_tenants(&state, &caller).await?;
        let ids: Vec<Uuid> = visible.iter().map(|t| t.tenant_id.as_uuid()).collect();
        let mut conn = connection(&state).await?;
        let mut rows = queries::endpoints(&mut conn, &ids).await.map_err(problem)?.into_iter().peekable();
        let mut tenants = Vec::new();
        // Both are in tenant name order.
        for tenant in visible {
            let mut endpoints = Vec::new();
            while let Some(row) = rows.next_if(|row| row.tenant == tenant.name) {
                endpoints.push(EndpointLine::from(row));
            }
            tenants.push(TenantEndpoints { name: tenant.name, endpoints });
        }
        Ok::<_, Problem>(tenants)
    };
    match read.await {
        Ok(tenants) => {
            html(StatusCode::OK, &EndpointsPage { chrome: Some(chrome), title: "Webhook endpoints".into(), tenants })
        }
        Err(why) => error_page(Some(chrome), &why),
    }
}

/// The fields of every endpoint form; which count depends on the change.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EndpointForm {
    #[serde(default)]
    reason: String,
    /// `yes` once the operator has read what will happen.
    confirmed: Option<String>,
    /// Replay the deliveries of events written since then ([`since_of`]).
    since: Option<String>,
    /// The payment whose page an event's replay was asked from, to go back to.
    payment_id: Option<String>,
}

impl EndpointForm {
    /// The fields to post again with the confirmation.
    fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![("reason", self.reason.clone()), ("confirmed", "yes".to_owned())];
        let optional = [("since", &self.since), ("payment_id", &self.payment_id)];
        fields.extend(optional.into_iter().filter_map(|(name, value)| value.clone().map(|value| (name, value))));
        fields
    }

    /// The page the form was on: the payment's, if it names one, else the endpoints page.
    fn back(&self) -> String {
        let payment = self.payment_id.as_deref().and_then(|text| text.parse::<PaymentId>().ok());
        payment.map_or_else(|| PAGE.to_owned(), |id| format!("/console/payments/{id}"))
    }
}

/// A change the endpoint forms ask for.
enum EndpointChange {
    /// Start (`true`) or stop endpoint `endpoint` of `tenant`.
    Switch { tenant: String, endpoint: String, enabled: bool },
    /// Replay the endpoint's dead-lettered deliveries of events written since `since`.
    ReplayFailed { tenant: String, endpoint: String, since: OffsetDateTime },
    /// Replay one event of `tenant` to every enabled endpoint that takes it.
    ReplayEvent { tenant: String, event: String },
}

impl EndpointChange {
    /// Where the form posts.
    fn action(&self) -> String {
        match self {
            Self::Switch { tenant, endpoint, enabled } => {
                let switch = if *enabled { "enable" } else { "disable" };
                format!("/console/tenants/{tenant}/endpoints/{endpoint}/{switch}")
            }
            Self::ReplayFailed { tenant, endpoint, .. } => {
                format!("/console/tenants/{tenant}/endpoints/{endpoint}/replay")
            }
            Self::ReplayEvent { tenant, event } => format!("/console/tenants/{tenant}/events/{event}/replay"),
        }
    }

    /// What it will do, in words, and the button that confirms it.
    fn will(&self) -> (Vec<String>, &'static str) {
        match self {
            Self::Switch { tenant, endpoint, enabled: true } => (
                vec![
                    format!(
                        "{tenant}'s endpoint {endpoint} is started again now, and its record of failing is cleared."
                    ),
                    "The deliveries that wait for it are sent, oldest first. Dead-lettered ones stay so until you \
                     replay them, and events written while it was stopped are not sent to it."
                        .into(),
                ],
                "Start it",
            ),
            Self::Switch { tenant, endpoint, enabled: false } => (
                vec![
                    format!("{tenant}'s endpoint {endpoint} is stopped now: nothing more is sent to it."),
                    "Its waiting deliveries wait until it is started again, and events written meanwhile are not \
                     queued for it."
                        .into(),
                ],
                "Stop it",
            ),
            Self::ReplayFailed { tenant, endpoint, since } => (
                vec![
                    format!(
                        "Every dead-lettered delivery to {tenant}'s endpoint {endpoint} of an event written since {} \
                         is queued again now.",
                        render::timestamp(*since)
                    ),
                    "Each keeps its webhook-id, so the merchant can drop any it already has, and starts the retry \
                     schedule again. A stopped endpoint gets them once it is started."
                        .into(),
                ],
                "Replay them",
            ),
            Self::ReplayEvent { tenant, event } => (
                vec![
                    format!("Event {event} of {tenant} is queued again now for every enabled endpoint that takes it."),
                    "It keeps its webhook-id, so the merchant can drop it if it already has it.".into(),
                ],
                "Replay it",
            ),
        }
    }

    /// Does it, as `caller`, with `reason`, and says the notice for the page the browser goes back
    /// to: a replay that matched no delivery says that nothing was queued.
    async fn run(&self, state: &OperatorsState, caller: &Caller, reason: &str) -> Result<&'static str, OperatorError> {
        let replayed = |replayed: Replayed| if replayed.deliveries == 0 { "replayed_none" } else { "replayed" };
        match self {
            Self::Switch { tenant, endpoint, enabled } => {
                switch_endpoint(state, caller, tenant, endpoint, *enabled, reason).await?;
                Ok(if *enabled { "endpoint_enabled" } else { "endpoint_disabled" })
            }
            Self::ReplayFailed { tenant, endpoint, since } => {
                replay_endpoint(state, caller, tenant, endpoint, *since, reason).await.map(replayed)
            }
            Self::ReplayEvent { tenant, event } => {
                replay_event_of(state, caller, tenant, event, reason).await.map(replayed)
            }
        }
    }
}

/// Asks to confirm `asked`, then does it and goes back to the page the form was on, with a notice.
/// A form that cannot be read (`Err`) is refused, and recorded as `action` once it was confirmed.
async fn confirm_then_run(
    state: &OperatorsState,
    request: &HttpRequest,
    action: &'static str,
    asked: Result<EndpointChange, OperatorError>,
    form: EndpointForm,
) -> HttpResponse {
    let caller = match caller_or_sign_in(state, request).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    let section = if form.payment_id.is_some() { "dead-letters" } else { "endpoints" };
    let chrome = Chrome::of(&caller.account, section);
    let back = form.back();
    if form.confirmed.as_deref() != Some("yes") {
        return match asked {
            Ok(asked) => {
                let (will, button) = asked.will();
                let confirmation = Confirmation { action: asked.action(), will, button, back };
                ask_to_confirm(chrome, &form.reason, form.fields(), confirmation)
            }
            Err(refused) => error_page(Some(chrome), &problem(refused)),
        };
    }
    let outcome = match asked {
        Ok(asked) => {
            asked.run(state, &caller, &form.reason).await.map(|notice| see_other(&format!("{back}?notice={notice}")))
        }
        Err(refused) => Err(refused),
    };
    finish(state, &caller, chrome, Entry::new(action, Outcome::Done), outcome).await
}

/// `POST /console/tenants/{name}/endpoints/{id}/enable|disable`: starts or stops an endpoint.
pub(super) async fn switch_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String, String)>,
    form: web::Form<EndpointForm>,
) -> HttpResponse {
    let (tenant, endpoint, switch) = path.into_inner();
    let enabled = match switch.as_str() {
        "enable" => true,
        "disable" => false,
        _ => return error_page(None, &Problem::new(ProblemType::NotFound, "an endpoint can be enabled or disabled")),
    };
    let asked = Ok(EndpointChange::Switch { tenant, endpoint, enabled });
    confirm_then_run(&state, &request, switch_action(enabled), asked, form.into_inner()).await
}

/// `POST /console/tenants/{name}/endpoints/{id}/replay`: replays an endpoint's dead-lettered
/// deliveries since a time.
pub(super) async fn replay_failed_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<EndpointForm>,
) -> HttpResponse {
    let (tenant, endpoint) = path.into_inner();
    let form = form.into_inner();
    let asked = since_of(form.since.as_deref().unwrap_or_default()).map(|since| EndpointChange::ReplayFailed {
        tenant,
        endpoint,
        since,
    });
    confirm_then_run(&state, &request, REPLAY_ENDPOINT_ACTION, asked, form).await
}

/// `POST /console/tenants/{name}/events/{id}/replay`: replays one event.
pub(super) async fn replay_event_form(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    form: web::Form<EndpointForm>,
) -> HttpResponse {
    let (tenant, event) = path.into_inner();
    let asked = Ok(EndpointChange::ReplayEvent { tenant, event });
    confirm_then_run(&state, &request, REPLAY_EVENT_ACTION, asked, form.into_inner()).await
}

/// The banner about `tenants`' endpoints that deliveries stopped, if there are any: their
/// merchants receive no events until someone starts them again.
pub(super) async fn stopped_banner(state: &OperatorsState, tenants: &[Uuid]) -> Result<Option<String>, Problem> {
    let mut conn = connection(state).await?;
    let stopped = queries::stopped_endpoints(&mut conn, tenants).await.map_err(problem)?;
    Ok(match stopped {
        0 => None,
        1 => Some(
            "1 webhook endpoint is stopped because it is gone or kept failing: its merchant receives no events.".into(),
        ),
        n => Some(format!(
            "{n} webhook endpoints are stopped because they are gone or kept failing: their merchants receive no \
             events."
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replay_form_takes_a_browsers_local_time_as_utc_and_rfc_3339() {
        let cases = [
            ("2026-11-30T06:00", Some("2026-11-30T06:00:00Z")),
            ("2026-11-30T06:00:30", Some("2026-11-30T06:00:30Z")),
            (" 2026-11-30T07:00:00+01:00 ", Some("2026-11-30T06:00:00Z")),
            ("yesterday", None),
            ("", None),
        ];
        for (typed, expected) in cases {
            let parsed = since_of(typed).ok().map(render::timestamp);
            assert_eq!(parsed.as_deref(), expected, "{typed:?}");
        }
    }

    #[test]
    fn the_replay_forms_time_is_what_the_form_takes_back() {
        let at = OffsetDateTime::parse("2026-01-02T03:04:59Z", &Rfc3339).unwrap();
        assert_eq!(form_time(at), "2026-01-02T03:04");
        assert_eq!(since_of(&form_time(at)).map(render::timestamp).unwrap(), "2026-01-02T03:04:00Z");
    }
}
