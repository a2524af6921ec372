//! The operator's reconciliation commands: `recon run`, `recon runs`, `recon show`.
//!
//! `recon run` reconciles a window on demand through the same [`Reconciliation::run_window`] as the
//! nightly job, so it claims the window the same way and never runs alongside another run of it.
//! The other two only read.

use std::io::{self, Write};

use oncepay_provider::PaymentProvider;
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{Date, OffsetDateTime};
use uuid::Uuid;

use crate::operator_error::OperatorError;
use crate::recon::compare::{Class, Discrepancy};
use crate::recon::runs::{self, Run, Trigger};
use crate::recon::{Reconciled, Reconciliation, Window};
use crate::render::{self, Report, Table};

/// Reads a window bound: a date (`2026-03-01`, midnight UTC) or an RFC 3339 time.
pub fn parse_bound(text: &str) -> Result<OffsetDateTime, OperatorError> {
    if let Ok(date) = Date::parse(text, format_description!("[year]-[month]-[day]")) {
        return Ok(Window::day(date).start);
    }
    OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|_| OperatorError::Invalid(format!("{text:?} is neither a date (2026-03-01) nor an RFC 3339 time")))
}

/// `recon run`: what the run found.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct RunReport {
    /// The run.
    pub run_id: Uuid,
    /// Start of the window (inclusive).
    #[serde(with = "time::serde::rfc3339")]
    pub window_start: OffsetDateTime,
    /// End of the window (exclusive).
    #[serde(with = "time::serde::rfc3339")]
    pub window_end: OffsetDateTime,
    /// Provider charges compared.
    pub provider_charges: usize,
    /// Ledger entries compared.
    pub ledger_entries: usize,
    /// Provider refunds compared.
    #[serde(default)]
    pub provider_refunds: usize,
    /// Refund ledger entries compared.
    #[serde(default)]
    pub refund_ledger_entries: usize,
    /// Discrepancies per class.
    pub discrepancies: Vec<(Class, usize)>,
}

impl Report for RunReport {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "run {} reconciled [{}, {}): {} provider charges, {} ledger entries, {} provider refunds, {} refund \
             ledger entries",
            self.run_id,
            render::timestamp(self.window_start),
            render::timestamp(self.window_end),
            self.provider_charges,
            self.ledger_entries,
            self.provider_refunds,
            self.refund_ledger_entries
        )?;
        let mut table = Table::new(&["CLASS", "FOUND"]);
        for (class, n) in &self.discrepancies {
            table.row(vec![class.as_str().to_owned(), n.to_string()]);
        }
        table.write(out, "")?;
        if self.discrepancies.iter().any(|(_, n)| *n > 0) {
            writeln!(out, "details: oncepay-reconciler recon show {}", self.run_id)?;
        }
        Ok(())
    }

    fn json(&self) -> Value {
        let mut value = render::to_json(self);
        value["discrepancies"] =
            self.discrepancies.iter().map(|(c, n)| (c.as_str().to_owned(), Value::from(*n))).collect();
        value
    }
}

/// Reconciles `[from, to)` now.
pub async fn run<P: PaymentProvider + 'static>(
    recon: &Reconciliation<P>,
    from: &str,
    to: &str,
) -> Result<RunReport, OperatorError> {
    let window = Window::new(parse_bound(from)?, parse_bound(to)?)
        .map_err(|e| OperatorError::Invalid(format!("--from {from} --to {to}: {e}")))?;
    match recon.run_window(window, Trigger::Operator).await? {
        Reconciled::Completed(summary) => Ok(RunReport {
            run_id: summary.run_id,
            window_start: window.start,
            window_end: window.end,
            provider_charges: summary.provider_charges,
            ledger_entries: summary.ledger_entries,
            provider_refunds: summary.provider_refunds,
            refund_ledger_entries: summary.refund_ledger_entries,
            discrepancies: summary.by_class,
        }),
        Reconciled::AlreadyClaimed { run_id, status } => Err(OperatorError::Refused(format!(
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
    Ok(RunList(runs::list(conn, limit).await?))
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
        .await?
        .ok_or_else(|| OperatorError::NotFound(format!("no reconciliation run {run_id}")))?;
    let discrepancies = runs::discrepancies(conn, run_id).await?;
    Ok(RunDetail { run, discrepancies })
}
