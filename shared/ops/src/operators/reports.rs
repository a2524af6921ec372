//! What the operations API answers and the operator CLI prints: a payment's page, proposals, the
//! audit trail, operators and their tokens.
//!
//! Each type is the API's JSON (serialised by the server, read back by the CLI) and, through
//! [`Report`], the CLI's text. Nothing here reads the database or decides anything.

use std::io::{self, Write};

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::format_amount;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::accounts::OperatorView;
use super::audit::AuditRecord;
use super::proposals::{Approved, Effect, ProposalView};
use super::refunds::PaymentRefunds;
use super::tokens::TokenView;
use crate::dead_letters::reports::{AuditRow, Detail, Entry};
use crate::render::{self, Report, Table};

/// `GET /v1/payments/{id}`: a payment, everything known about it: its dead letters, history,
/// refunds, proposals and the operators' actions on it.
#[derive(Debug, Serialize, Deserialize)]
pub struct PaymentPage {
    /// The payment.
    pub payment_id: PaymentId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// What it asked of the customer; masked for viewers.
    pub customer: Value,
    /// Its dead letters, oldest first (none for a payment automation settled).
    pub entries: Vec<Entry>,
    /// Its status changes, oldest first.
    pub history: Vec<AuditRow>,
    /// What it charged and gave back, and its refunds, oldest first.
    pub refunds: PaymentRefunds,
    /// Its proposals, newest first.
    pub proposals: Vec<ProposalView>,
    /// The operators' audit rows about it, newest first.
    pub operator_audit: Vec<AuditRecord>,
}

impl Report for PaymentPage {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let r = &self.refunds;
        writeln!(
            out,
            "payment     {} ({}, now {})",
            self.payment_id,
            format_amount(r.amount.minor_units(), r.currency.as_str()),
            r.status.as_str()
        )?;
        writeln!(out, "customer    {}", self.customer)?;
        let detail = Detail {
            payment_id: self.payment_id,
            tenant_id: self.tenant_id,
            entries: self.entries.clone(),
            audit_trail: self.history.clone(),
        };
        detail.human(out)?;
        writeln!(out, "\nrefunds")?;
        self.refunds.write(out)?;
        writeln!(out, "\nproposals")?;
        proposal_table(&self.proposals, out)?;
        writeln!(out, "\noperators' audit trail")?;
        audit_table(&self.operator_audit, out)
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

/// What a retry, a resolution or a refund did: done at once, or proposed for an approver.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Acted {
    /// Proposed: it waits for a second operator.
    Proposed {
        /// The proposal.
        proposal: ProposalView,
    },
    /// Done.
    Done(Effect),
}

impl Report for Acted {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        match self {
            Self::Done(done) => done.human(out),
            Self::Proposed { proposal } => writeln!(
                out,
                "proposed: proposal {} for {} waits for an approver until {}; nothing is done before",
                proposal.proposal_id,
                proposal.about(),
                render::timestamp(proposal.expires_at)
            ),
        }
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

/// `proposals list`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ProposalList(pub Vec<ProposalView>);

impl Report for ProposalList {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        proposal_table(&self.0, out)
    }

    fn json(&self) -> Value {
        render::to_json(&self.0)
    }
}

fn proposal_table(proposals: &[ProposalView], out: &mut dyn Write) -> io::Result<()> {
    let mut table = Table::new(&["PROPOSAL", "ABOUT", "ACTION", "STATUS", "BY", "EXPIRES", "DECIDED BY", "REASON"]);
    for p in proposals {
        table.row(vec![
            p.proposal_id.to_string(),
            p.about(),
            p.action.to_string(),
            p.status.as_str().to_owned(),
            p.proposed_by.clone(),
            render::timestamp(p.expires_at),
            p.decided_by.clone().unwrap_or_default(),
            p.reason.clone(),
        ]);
    }
    table.write(out, "no proposals")
}

impl Report for ProposalView {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let by = self.decided_by.as_deref().map(|by| format!(" by {by}")).unwrap_or_default();
        writeln!(out, "proposal {} for {} is {}{by}", self.proposal_id, self.about(), self.status)
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

impl Report for Approved {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        self.proposal.human(out)?;
        self.result.human(out)
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

/// `audit`.
#[derive(Debug, Serialize, Deserialize)]
pub struct AuditTrail(pub Vec<AuditRecord>);

impl Report for AuditTrail {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        audit_table(&self.0, out)
    }

    fn json(&self) -> Value {
        render::to_json(&self.0)
    }
}

fn audit_table(rows: &[AuditRecord], out: &mut dyn Write) -> io::Result<()> {
    let mut table = Table::new(&["ID", "AT", "OPERATOR", "FROM", "ACTION", "OUTCOME", "TENANT", "PAYMENT", "REASON"]);
    for r in rows {
        table.row(vec![
            r.audit_id.to_string(),
            render::timestamp(r.at),
            r.operator.clone(),
            r.source.clone().unwrap_or_default(),
            r.action.clone(),
            r.outcome.clone(),
            r.tenant_id.map(|t| t.to_string()).unwrap_or_default(),
            r.payment_id.map(|p| p.to_string()).unwrap_or_default(),
            r.reason.clone().unwrap_or_default(),
        ]);
    }
    table.write(out, "no audit rows")
}

/// `operators list`.
#[derive(Debug, Serialize, Deserialize)]
pub struct OperatorList(pub Vec<OperatorView>);

impl Report for OperatorList {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut table = Table::new(&["NAME", "ROLE", "TENANTS", "CREATED", "BY"]);
        for o in &self.0 {
            table.row(vec![
                o.name.clone(),
                o.role.as_str().to_owned(),
                o.tenants.as_ref().map_or_else(|| "every tenant".to_owned(), |t| t.join(", ")),
                render::timestamp(o.created_at),
                o.created_by.clone(),
            ]);
        }
        table.write(out, "no operators")
    }

    fn json(&self) -> Value {
        render::to_json(&self.0)
    }
}

impl Report for OperatorView {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let tenants = self.tenants.as_ref().map_or_else(|| "every tenant".to_owned(), |t| t.join(", "));
        writeln!(out, "operator {} ({}, {tenants}) created by {}", self.name, self.role.as_str(), self.created_by)
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

impl Report for super::accounts::CreatedOperator {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        self.operator.human(out)?;
        match &self.enrollment {
            Some(code) => code.human(out),
            None => writeln!(out, "no enrollment code: they sign in at the OpenID provider, or with a token"),
        }
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

/// `tokens list`.
#[derive(Debug, Serialize, Deserialize)]
pub struct TokenList(pub Vec<TokenView>);

impl Report for TokenList {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut table = Table::new(&["TOKEN ID", "LABEL", "CREATED", "EXPIRES", "REVOKED"]);
        for t in &self.0 {
            table.row(vec![
                t.token_id.to_string(),
                t.label.clone(),
                render::timestamp(t.created_at),
                render::timestamp(t.expires_at),
                t.revoked_at.map(render::timestamp).unwrap_or_default(),
            ]);
        }
        table.write(out, "no tokens")
    }

    fn json(&self) -> Value {
        render::to_json(&self.0)
    }
}

/// A change with nothing to show but that it was done.
#[derive(Debug, Serialize)]
pub struct Done(pub String);

impl Report for Done {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{}", self.0)
    }

    fn json(&self) -> Value {
        serde_json::json!({ "done": self.0 })
    }
}
