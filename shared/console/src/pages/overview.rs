//! `GET /console/` and `GET /console/live`: the overview and the part of it that refreshes itself:
//! payments and refunds in flight, open dead letters by kind and age, proposals waiting, the last
//! reconciliation run, the broker's queues (when an api takes payments from RabbitMQ), and the
//! break-glass account's last uses; above them, a warning when the worker stopped a webhook
//! endpoint.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use oncepay_http::problem::{Problem, ProblemType};
use time::OffsetDateTime;
use uuid::Uuid;

use super::dead_letters::KINDS;
use super::{age, done, refused, when};
use crate::endpoints::stopped_banner;
use crate::queries::{self};
use crate::{Chrome, caller_or_sign_in, html, visible_tenants};
use oncepay_ops::operators::Scope;
use oncepay_ops::operators::api::signing_in::Caller;
use oncepay_ops::operators::api::{OperatorsState, connection, problem};
use oncepay_ops::operators::audit::{self};
use oncepay_ops::recon;
use oncepay_store::broker_queues::{self, Queue};

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

/// RabbitMQ's queues as the api last sampled them, in words.
struct BrokerQueues {
    waiting: i64,
    dead_letters: i64,
    /// How long ago the oldest dead letter was refused, or why that is not said.
    oldest: String,
    sampled: String,
}

impl BrokerQueues {
    /// From the samples, if any api samples a broker.
    fn of(samples: &[broker_queues::QueueSample]) -> Option<Self> {
        let payments = samples.iter().find(|s| s.queue == Queue::Payments.as_str())?;
        let dead = samples.iter().find(|s| s.queue == Queue::DeadLetters.as_str())?;
        let oldest = match (dead.messages, dead.oldest_failed_at) {
            (0, _) => "none is waiting".to_owned(),
            (_, Some(at)) => format!("{} ago", age(at)),
            (_, None) => "not known".to_owned(),
        };
        Some(Self {
            waiting: payments.messages,
            dead_letters: dead.messages,
            oldest,
            sampled: format!("{} ago", age(payments.sampled_at.min(dead.sampled_at))),
        })
    }
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
    /// For operators of every tenant, when an api takes payments from RabbitMQ.
    broker: Option<BrokerQueues>,
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
        Figure { label: "Payments waiting to be sent", value: o.waiting.to_string(), link: None },
        Figure { label: "Payments being sent now", value: o.sending.to_string(), link: None },
        Figure { label: "Payments unknown (the provider may have charged)", value: o.unknown.to_string(), link: None },
        Figure {
            label: "The oldest unknown payment has waited",
            value: o.oldest_unknown.map_or_else(|| "none waits".to_owned(), age),
            link: None,
        },
        Figure { label: "Charges booked in the last hour", value: o.booked_last_hour.to_string(), link: None },
        Figure { label: "Refunds waiting to be sent", value: o.refunds_waiting.to_string(), link: None },
        Figure { label: "Refunds being sent now", value: o.refunds_sending.to_string(), link: None },
        Figure {
            label: "Refunds unknown (the provider may have given the money back)",
            value: o.refunds_unknown.to_string(),
            link: None,
        },
        Figure {
            label: "The oldest unknown refund has waited",
            value: o.oldest_unknown_refund.map_or_else(|| "none waits".to_owned(), age),
            link: None,
        },
        Figure { label: "Refunds given back in the last hour", value: o.refunded_last_hour.to_string(), link: None },
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
    // The queues hold every tenant's messages: their figures are for operators of every tenant.
    let broker = if reads_runs {
        let samples =
            broker_queues::latest(&mut conn).await.map_err(|error| problem(anyhow::Error::from(error).into()))?;
        BrokerQueues::of(&samples)
    } else {
        None
    };
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
    Ok(Live { figures, by_kind, last_run, reads_runs, broker, updated: when(OffsetDateTime::now_utc()) })
}

/// `GET /console/`: the overview.
pub(crate) async fn overview(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    done(
        async {
            let caller = caller_or_sign_in(&state, &request).await?;
            let mut chrome = Chrome::of(&caller.account, "overview").noticed_by(&request);
            let tenants: Vec<Uuid> = visible_tenants(&state, &caller)
                .await
                .map_err(refused(&chrome))?
                .iter()
                .map(|t| t.tenant_id.as_uuid())
                .collect();
            let stopped = stopped_banner(&state, &tenants).await.map_err(refused(&chrome))?;
            chrome.endpoints_stopped = stopped;
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
pub(crate) async fn live(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
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
