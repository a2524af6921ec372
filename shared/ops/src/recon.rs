//! The operator's reconciliation commands: `recon run`, `recon runs`, `recon show`.
//!
//! `recon run` queues a window; a reconciler runs it as it runs the nightly job's, so it holds the
//! window the same way and never runs alongside another run of it. The other two only read.

use std::io::{self, Write};
use std::time::Duration;

use anyhow::Context as _;
use oncepay_store::recon_runs::{self as runs, Claim, Class, Discrepancy, Run, Window};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{Date, OffsetDateTime};
use uuid::Uuid;

use crate::operator_error::OperatorError;
use crate::render::{self, Report, Table};

/// Reads a window bound: a date (`2026-03-01`, midnight UTC) or an RFC 3339 time.
pub fn parse_bound(text: &str) -> Result<OffsetDateTime, OperatorError> {
    if let Ok(date) = Date::parse(text, format_description!("[year]-[month]-[day]")) {
        return Ok(Window::day(date).start);
    }
    OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|_| OperatorError::Invalid(format!("{text:?} is neither a date (2026-03-01) nor an RFC 3339 time")))
}

/// Queues `[from, to)` for the reconciler, which starts it within `recon.queue_interval_ms`, and
/// returns the queued run. Refused when another run holds the window, unless it is a running run
/// whose heartbeat is older than `stale_after` (`recon.stale_after_secs`), which is taken over.
pub async fn queue(conn: &mut PgConnection, from: &str, to: &str, stale_after: Duration) -> Result<Run, OperatorError> {
    let window = Window::new(parse_bound(from)?, parse_bound(to)?)
        .map_err(|e| OperatorError::Invalid(format!("--from {from} --to {to}: {e}")))?;
    match runs::queue(conn, &window, stale_after).await.context("cannot queue the run")? {
        Claim::Won(run_id) => {
            Ok(runs::find(conn, run_id).await.context("cannot read the run")?.context("the queued run is gone")?)
        }
        Claim::Taken { run_id, status } => Err(OperatorError::Refused(format!(
            "run {run_id} already holds this window ({status}); see `recon show {run_id}`"
        ))),
    }
}

/// `recon runs`.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct RunList(pub Vec<Run>);

impl Report for RunList {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut table = Table::new(&[
            "RUN",
            "WINDOW START",
            "WINDOW END",
            "TRIGGER",
            "STATUS",
            "CHARGES",
            "ENTRIES",
            "REFUNDS",
            "REFUND ENTRIES",
            "FOUND",
        ]);
        let number = |n: Option<i32>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
        for run in &self.0 {
            table.row(vec![
                run.run_id.to_string(),
                render::timestamp(run.window_start),
                render::timestamp(run.window_end),
                run.trigger.as_str().to_owned(),
                run.status.as_str().to_owned(),
                number(run.provider_charges),
                number(run.ledger_entries),
                number(run.provider_refunds),
                number(run.refund_ledger_entries),
                number(run.discrepancies),
            ]);
        }
        table.write(out, "no reconciliation runs")
    }

    fn json(&self) -> Value {
        render::to_json(&self.0)
    }
}

/// The latest runs, newest first.
pub async fn list(conn: &mut PgConnection, limit: u32) -> Result<RunList, OperatorError> {
    Ok(RunList(runs::list(conn, limit).await.context("cannot list the runs")?))
}

/// `recon show`.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct RunDetail {
    /// The run.
    pub run: Run,
    /// Its discrepancies, by class.
    pub discrepancies: Vec<Discrepancy>,
}

impl Report for RunDetail {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let run = &self.run;
        writeln!(out, "run         {}", run.run_id)?;
        writeln!(out, "window      [{}, {})", render::timestamp(run.window_start), render::timestamp(run.window_end))?;
        writeln!(out, "status      {} ({})", run.status.as_str(), run.trigger.as_str())?;
        if let Some(error) = &run.error {
            writeln!(out, "error       {error}")?;
        }
        writeln!(
            out,
            "compared    {} provider charges, {} ledger entries",
            run.provider_charges.unwrap_or(0),
            run.ledger_entries.unwrap_or(0)
        )?;
        writeln!(
            out,
            "            {} provider refunds, {} refund ledger entries",
            run.provider_refunds.unwrap_or(0),
            run.refund_ledger_entries.unwrap_or(0)
        )?;
        for class in Class::ALL {
            let found: Vec<_> = self.discrepancies.iter().filter(|d| d.class == class).collect();
            writeln!(out, "\n{} ({})", class.as_str(), found.len())?;
            let text = |value: Option<String>| value.unwrap_or_default();
            let mut table = if class.is_about_refunds() {
                Table::new(&["PROVIDER REFUND", "REFUND", "PAYMENT", "DETAIL"])
            } else {
                Table::new(&["CHARGE", "PAYMENT", "DETAIL"])
            };
            for d in found {
                let payment = text(d.payment_id.map(|p| p.to_string()));
                table.row(if class.is_about_refunds() {
                    vec![
                        text(d.provider_refund_id.clone()),
                        text(d.refund_id.map(|r| r.to_string())),
                        payment,
                        d.detail.clone(),
                    ]
                } else {
                    vec![text(d.provider_charge_id.clone()), payment, d.detail.clone()]
                });
            }
            table.write(out, "  none")?;
        }
        Ok(())
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

/// One run and its discrepancies.
pub async fn show(conn: &mut PgConnection, run_id: Uuid) -> Result<RunDetail, OperatorError> {
    let run = runs::find(conn, run_id)
        .await
        .context("cannot read the run")?
        .ok_or_else(|| OperatorError::NotFound(format!("no reconciliation run {run_id}")))?;
    let discrepancies = runs::discrepancies(conn, run_id).await.context("cannot read the run's discrepancies")?;
    Ok(RunDetail { run, discrepancies })
}
