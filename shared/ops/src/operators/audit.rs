//! The operators' audit trail: one append-only row for every action, read of customer data,
//! proposal, approval and refusal, with who, when, from where, what, why, and the state before and
//! after.
//!
//! [`record`] writes in the caller's transaction, so a row exists exactly when its action
//! committed; a refusal is recorded in a transaction of its own, since its action wrote nothing. The
//! table refuses UPDATE, DELETE and TRUNCATE (migrations/0240).

use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, TenantId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sqlx::PgConnection;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Account, Scope};
use crate::operator_error::OperatorError;

/// Who acted, and from where.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    /// Their account; none for a sign-in under a name no operator has.
    pub operator_id: Option<Uuid>,
    /// Their name.
    pub name: &'a str,
    /// The peer address of the request, when it came over HTTP.
    pub source: Option<&'a str>,
}

impl<'a> Actor<'a> {
    /// `account`, acting from `source`.
    pub fn of(account: &'a Account, source: Option<&'a str>) -> Self {
        Self { operator_id: Some(account.operator_id), name: &account.name, source }
    }
}

/// How an action ended: the only spelling of `operator_audit.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It was done.
    Done,
    /// It waits for a second operator's approval.
    Proposed,
    /// It was refused; nothing changed.
    Refused,
}

impl Outcome {
    /// The stored name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Proposed => "proposed",
            Self::Refused => "refused",
        }
    }
}

/// One row to write.
#[derive(Debug, Clone)]
pub struct Entry {
    action: &'static str,
    outcome: Outcome,
    tenant_id: Option<TenantId>,
    payment_id: Option<PaymentId>,
    proposal_id: Option<Uuid>,
    reason: Option<String>,
    before: Option<Value>,
    after: Option<Value>,
    detail: Option<Value>,
}

impl Entry {
    /// An `action` (`payment.retry`, `proposal.approve`, …) that ended with `outcome`.
    pub const fn new(action: &'static str, outcome: Outcome) -> Self {
        Self {
            action,
            outcome,
            tenant_id: None,
            payment_id: None,
            proposal_id: None,
            reason: None,
            before: None,
            after: None,
            detail: None,
        }
    }

    /// On this tenant's payment.
    pub const fn payment(mut self, tenant_id: TenantId, payment_id: PaymentId) -> Self {
        self.tenant_id = Some(tenant_id);
        self.payment_id = Some(payment_id);
        self
    }

    /// On this tenant, and on this payment of it if there is one.
    pub const fn on(mut self, tenant_id: TenantId, payment_id: Option<PaymentId>) -> Self {
        self.tenant_id = Some(tenant_id);
        self.payment_id = payment_id;
        self
    }

    /// On this payment, before its tenant is known (a refusal may come first).
    pub const fn on_payment(mut self, payment_id: PaymentId) -> Self {
        self.payment_id = Some(payment_id);
        self
    }

    /// On this proposal.
    pub const fn proposal(mut self, proposal_id: Uuid) -> Self {
        self.proposal_id = Some(proposal_id);
        self
    }

    /// Why, in the operator's words.
    pub fn reason(mut self, reason: &str) -> Self {
        self.reason = Some(reason.to_owned());
        self
    }

    /// The state before.
    pub fn before(mut self, before: Value) -> Self {
        self.before = Some(before);
        self
    }

    /// The state after.
    pub fn after(mut self, after: Value) -> Self {
        self.after = Some(after);
        self
    }

    /// Anything else: the refusal's message, the request's parameters.
    pub fn detail(mut self, detail: Value) -> Self {
        self.detail = Some(detail);
        self
    }

    /// The same entry, ended another way.
    pub const fn ended(mut self, outcome: Outcome) -> Self {
        self.outcome = outcome;
        self
    }

    /// The same entry, refused for `why`: the refusal joins its detail (the refund it was about,
    /// say).
    pub fn refused(mut self, why: String) -> Self {
        self.outcome = Outcome::Refused;
        let mut detail = match self.detail.take() {
            Some(Value::Object(detail)) => detail,
            Some(other) => Map::from_iter([("detail".to_owned(), other)]),
            None => Map::new(),
        };
        detail.insert("refusal".to_owned(), Value::String(why));
        self.detail = Some(Value::Object(detail));
        self
    }
}

/// Writes `entry` by `actor` in the caller's transaction.
pub async fn record(conn: &mut PgConnection, actor: &Actor<'_>, entry: &Entry) -> Result<(), OperatorError> {
    sqlx::query!(
        r#"
        INSERT INTO operator_audit (operator_id, operator_name, source, action, outcome, tenant_id, payment_id,
                                    proposal_id, reason, before, after, detail)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
        "#,
        actor.operator_id,
        actor.name,
        actor.source,
        entry.action,
        entry.outcome.as_str(),
        entry.tenant_id.map(|t| t.as_uuid()),
        entry.payment_id.map(|p| p.as_uuid()),
        entry.proposal_id,
        entry.reason.as_deref(),
        entry.before.as_ref(),
        entry.after.as_ref(),
        entry.detail.as_ref(),
    )
    .execute(conn)
    .await
    .context("cannot write the audit trail")?;
    Ok(())
}

/// One row, as read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Its place in the trail: later rows have larger ids.
    pub audit_id: i64,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// Who.
    pub operator: String,
    /// From where.
    pub source: Option<String>,
    /// What.
    pub action: String,
    /// How it ended: `done`, `proposed` or `refused`.
    pub outcome: String,
    /// The tenant it concerned.
    pub tenant_id: Option<TenantId>,
    /// The payment it concerned.
    pub payment_id: Option<PaymentId>,
    /// The proposal it concerned.
    pub proposal_id: Option<Uuid>,
    /// Why.
    pub reason: Option<String>,
    /// The state before.
    pub before: Option<Value>,
    /// The state after.
    pub after: Option<Value>,
    /// Anything else.
    pub detail: Option<Value>,
}

/// Which rows to list.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this operator's.
    pub operator: Option<String>,
    /// Only about this tenant.
    pub tenant_id: Option<TenantId>,
    /// Only about this payment.
    pub payment_id: Option<PaymentId>,
    /// Only this action.
    pub action: Option<String>,
    /// Only rows older than this one (the next page).
    pub before_id: Option<i64>,
    /// Only rows written at or after this moment.
    pub since: Option<OffsetDateTime>,
    /// Only rows written before this moment.
    pub until: Option<OffsetDateTime>,
    /// At most this many.
    pub limit: i64,
}

/// The rows `filter` selects that `scope` may see, newest first. An operator limited to some
/// tenants sees only the rows about those tenants.
pub async fn list(conn: &mut PgConnection, filter: &Filter, scope: &Scope) -> Result<Vec<AuditRecord>, OperatorError> {
    let tenants = scope.to_column();
    let rows = sqlx::query_as!(
        AuditRecord,
        r#"
        SELECT audit_id, at, operator_name AS operator, source, action, outcome,
               tenant_id AS "tenant_id: TenantId", payment_id AS "payment_id: PaymentId", proposal_id, reason,
               before, after, detail
        FROM operator_audit
        WHERE ($1::text IS NULL OR operator_name = $1)
          AND ($2::uuid IS NULL OR tenant_id = $2)
          AND ($3::uuid IS NULL OR payment_id = $3)
          AND ($4::text IS NULL OR action = $4)
          AND ($5::bigint IS NULL OR audit_id < $5)
          AND ($6::uuid[] IS NULL OR tenant_id = ANY ($6))
          AND ($8::timestamptz IS NULL OR at >= $8)
          AND ($9::timestamptz IS NULL OR at < $9)
        ORDER BY audit_id DESC
        LIMIT $7
        "#,
        filter.operator.as_deref(),
        filter.tenant_id.map(|t| t.as_uuid()),
        filter.payment_id.map(|p| p.as_uuid()),
        filter.action.as_deref(),
        filter.before_id,
        tenants.as_deref(),
        filter.limit,
        filter.since,
        filter.until,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the audit trail")?;
    Ok(rows)
}
