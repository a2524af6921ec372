//! What the dead-letter commands print: the entries, one payment's detail, and what an action did.
//!
//! Each type here is both the text table and the `--json` shape. The JSON is the serialised
//! struct, so a field's name and order are part of the CLI's output. Nothing here reads the
//! database or decides anything.

use std::io::{self, Write};

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency, format_amount};
use oncepay_domain::status::PaymentStatus;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use super::{Kind, ResolutionKind};
use crate::render::{self, Report, Table};

/// One entry, as listed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    /// The entry's id.
    pub dead_letter_id: i64,
    /// The payment.
    pub payment_id: PaymentId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// The tenant's name.
    pub tenant: Option<String>,
    /// Which kind of entry.
    pub kind: Kind,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Provider lookups made before giving up.
    pub attempts: i32,
    /// The payment's status now.
    pub payment_status: PaymentStatus,
    /// What it asked to charge.
    pub amount: Amount,
    /// In which currency.
    pub currency: Currency,
    /// When the entry was opened.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// How long it has been (or was) open.
    pub age_secs: i64,
    /// When an operator closed it.
    #[serde(with = "time::serde::rfc3339::option")]
    pub resolved_at: Option<OffsetDateTime>,
    /// Who closed it (`operator:<name>`).
    pub resolved_by: Option<String>,
    /// How an operator closed it.
    pub resolution: Option<ResolutionKind>,
    /// The operator's reason.
    pub resolution_note: Option<String>,
    /// What was gathered, oldest first.
    pub evidence: Value,
}

impl Entry {
    /// The tenant's name, or its id if it has none.
    fn tenant_label(&self) -> String {
        self.tenant.clone().unwrap_or_else(|| self.tenant_id.to_string())
    }

    /// How long it has been (or was) open, as operators read it.
    fn age(&self) -> String {
        render::age(time::Duration::seconds(self.age_secs))
    }
}

/// `dead-letters list`.
#[derive(Debug, Serialize, Deserialize)]
pub struct EntryList(pub Vec<Entry>);

impl Report for EntryList {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut table =
            Table::new(&["PAYMENT", "TENANT", "KIND", "STATUS", "AMOUNT", "ATTEMPTS", "AGE", "RESOLUTION", "REASON"]);
        for e in &self.0 {
            table.row(vec![
                e.payment_id.to_string(),
                e.tenant_label(),
                e.kind.as_str().to_owned(),
                e.payment_status.as_str().to_owned(),
                format_amount(e.amount.minor_units(), e.currency.as_str()),
                e.attempts.to_string(),
                e.age(),
                e.resolution.map_or("open", ResolutionKind::as_str).to_owned(),
                e.reason.clone(),
            ]);
        }
        table.write(out, "no dead letters")
    }

    fn json(&self) -> Value {
        render::to_json(&self.0)
    }
}

/// One row of a payment's audit trail.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditRow {
    /// From where (none for the creation).
    pub from_status: Option<PaymentStatus>,
    /// To where.
    pub to_status: PaymentStatus,
    /// Who.
    pub actor: String,
    /// Why.
    pub reason: String,
    /// Supporting evidence.
    pub detail: Option<Value>,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// `dead-letters show`: every entry of one payment, with its evidence and audit trail.
#[derive(Debug, Serialize, Deserialize)]
pub struct Detail {
    /// The payment.
    pub payment_id: PaymentId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// Its entries, oldest first (at most one open).
    pub entries: Vec<Entry>,
    /// Its status changes, oldest first.
    pub audit_trail: Vec<AuditRow>,
}

impl Report for Detail {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        for e in &self.entries {
            writeln!(
                out,
                "payment     {} ({} {}, now {})",
                e.payment_id,
                e.amount,
                e.currency,
                e.payment_status.as_str()
            )?;
            writeln!(out, "tenant      {}", e.tenant_label())?;
            writeln!(out, "kind        {}", e.kind.as_str())?;
            writeln!(out, "why         {}", e.reason)?;
            writeln!(out, "attempts    {}", e.attempts)?;
            writeln!(out, "opened      {} ({} ago)", render::timestamp(e.created_at), e.age())?;
            match (e.resolution, e.resolved_at, &e.resolved_by) {
                (Some(resolution), Some(at), Some(by)) => writeln!(
                    out,
                    "resolved    {} by {by} at {}: {}",
                    resolution.as_str(),
                    render::timestamp(at),
                    e.resolution_note.as_deref().unwrap_or_default()
                )?,
                _ => writeln!(out, "resolved    not yet")?,
            }
            writeln!(out, "evidence")?;
            for item in e.evidence.as_array().into_iter().flatten() {
                writeln!(out, "  {item}")?;
            }
            writeln!(out)?;
        }
        writeln!(out, "audit trail")?;
        let mut table = Table::new(&["AT", "FROM", "TO", "ACTOR", "REASON"]);
        for row in &self.audit_trail {
            table.row(vec![
                render::timestamp(row.created_at),
                row.from_status.map_or("-", PaymentStatus::as_str).to_owned(),
                row.to_status.as_str().to_owned(),
                row.actor.clone(),
                row.reason.clone(),
            ]);
        }
        table.write(out, "(empty)")
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

/// What an operator action did.
#[derive(Debug, Serialize, Deserialize)]
pub struct Resolved {
    /// The payment.
    pub payment_id: PaymentId,
    /// The entry closed.
    pub dead_letter_id: i64,
    /// How the entry was closed.
    pub resolution: ResolutionKind,
    /// Who.
    pub resolved_by: String,
    /// Why.
    pub note: String,
    /// The payment's status afterwards.
    pub payment_status: PaymentStatus,
}

impl Report for Resolved {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "dead letter {} of payment {}: {} by {}; the payment is now {}",
            self.dead_letter_id,
            self.payment_id,
            self.resolution.as_str(),
            self.resolved_by,
            self.payment_status.as_str()
        )
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}
