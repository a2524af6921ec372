//! `GET /console/recon` and `GET /console/recon/{id}`: reconciliation runs and what one found.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use oncepay_domain::ids::PaymentId;
use oncepay_http::problem::{Problem, ProblemType};
use uuid::Uuid;

use super::{done, failed, refused, when};
use crate::{Chrome, caller_or_sign_in, html};
use oncepay_ops::operators::api::tenants::every_tenant;
use oncepay_ops::operators::api::{OperatorsState, connection};
use oncepay_ops::recon;

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
pub(crate) async fn recon_runs(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
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
pub(crate) async fn recon_run(
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
