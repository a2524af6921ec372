//! The dead-letter table: payments automation could not settle, for operators; and refunds it gave
//! up on, which need no table of their own ([`refunds`]).
//!
//! A payment has at most one open entry; further evidence is appended to it. Only an operator closes
//! an entry ([`actions`]), and is recorded with the reason. Nothing here moves a payment.

pub mod actions;
pub mod queries;
pub mod refunds;
pub mod reports;

use std::str::FromStr;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_store::StoreError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgConnection;

use oncepay_store::stored_name::{self, UnknownName};

/// Dead letters opened, by `kind`: a payment's ([`Kind`]) or [`REFUND_CONFLICT`].
pub const DEAD_LETTERS: &str = "oncepay_reconciler_dead_letters_total";
/// Dead letters not yet resolved by an operator, by `kind`: a payment's ([`Kind`]),
/// [`REFUND_UNRESOLVED`] or [`REFUND_CONFLICT`].
pub const OPEN_DEAD_LETTERS: &str = "oncepay_reconciler_open_dead_letters";
/// The `kind` of [`DEAD_LETTERS`] and [`OPEN_DEAD_LETTERS`] for a refund's conflict
/// (`refund_dead_letters`).
pub const REFUND_CONFLICT: &str = "refund_conflict";
/// The `kind` of [`OPEN_DEAD_LETTERS`] for a refund automation gave up on (`dead_lettered`). Its
/// opening is counted as `oncepay_reconciler_unknown_refunds_resolved_total{how="dead_lettered"}`.
pub const REFUND_UNRESOLVED: &str = "refund_unresolved";

/// Which kind of entry: the only spelling of the names stored in `dead_letters.kind`. Rows are parsed
/// into it when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The payment is `dead_lettered`: an operator must settle or retry it. Written with the move
    /// `unknown → dead_lettered` when polling ran out of attempts or time.
    Unresolved,
    /// The payment is terminal and later evidence contradicts it. The payment's state is kept.
    Conflict,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Self; 2] = [Self::Unresolved, Self::Conflict];

    /// The name stored in `dead_letters.kind`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unresolved => "unresolved",
            Self::Conflict => "conflict",
        }
    }
}

impl FromStr for Kind {
    type Err = UnknownName;

    fn from_str(text: &str) -> Result<Self, UnknownName> {
        stored_name::parse(&Self::ALL, Self::as_str, "dead-letter kind", text)
    }
}

/// How an operator closed an entry: the only spelling of the names stored in
/// `dead_letters.resolution`. Rows are parsed into it when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResolutionKind {
    /// The payment was settled as succeeded.
    Succeeded,
    /// The payment was settled as failed.
    Failed,
    /// The payment was queued to be sent again.
    Retried,
    /// A conflict was seen; the terminal payment stays as it is.
    Acknowledged,
}

impl ResolutionKind {
    /// Every kind.
    pub const ALL: [Self; 4] = [Self::Succeeded, Self::Failed, Self::Retried, Self::Acknowledged];

    /// The name stored in `dead_letters.resolution`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Retried => "retried",
            Self::Acknowledged => "acknowledged",
        }
    }
}

impl FromStr for ResolutionKind {
    type Err = UnknownName;

    fn from_str(text: &str) -> Result<Self, UnknownName> {
        stored_name::parse(&Self::ALL, Self::as_str, "dead-letter resolution", text)
    }
}

/// Opens an entry for the payment, or appends `evidence` (a JSON array) to its open one. Counts new
/// entries in `oncepay_reconciler_dead_letters_total{kind}`.
///
/// Takes the caller's connection, so the entry is written in the same transaction as the change
/// that caused it.
pub async fn record(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    kind: Kind,
    reason: &str,
    evidence: Value,
    attempts: i32,
) -> Result<(), StoreError> {
    // A partial unique index allows one open entry per payment; a second one adds to the first.
    let opened = sqlx::query_scalar!(
        r#"
        INSERT INTO dead_letters (tenant_id, payment_id, kind, reason, evidence, attempts)
        VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT (tenant_id, payment_id) WHERE resolved_at IS NULL DO UPDATE
        SET evidence = dead_letters.evidence || EXCLUDED.evidence,
            attempts = GREATEST(dead_letters.attempts, EXCLUDED.attempts)
        RETURNING xmax = 0 AS "opened!"
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
        kind.as_str(),
        reason,
        evidence,
        attempts,
    )
    .fetch_one(conn)
    .await?;
    if opened {
        metrics::counter!(DEAD_LETTERS, "kind" => kind.as_str()).increment(1);
        tracing::warn!(payment.id = %payment_id, dead_letter.kind = kind.as_str(), reason, "dead-lettered for an operator");
    }
    Ok(())
}

/// Appends `evidence` (a JSON array) to the payment's open entry, if it has one, in the caller's
/// transaction. Returns whether it did.
pub async fn attach_evidence(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    evidence: Value,
) -> Result<bool, StoreError> {
    let attached = sqlx::query!(
        r#"
        UPDATE dead_letters SET evidence = evidence || $3
        WHERE tenant_id = $1 AND payment_id = $2 AND resolved_at IS NULL
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
        evidence,
    )
    .execute(conn)
    .await?;
    Ok(attached.rows_affected() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_read_back_and_serialise_unchanged() {
        for kind in Kind::ALL {
            assert_eq!(kind.as_str().parse::<Kind>().unwrap(), kind);
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        for kind in ResolutionKind::ALL {
            assert_eq!(kind.as_str().parse::<ResolutionKind>().unwrap(), kind);
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        let unknown = "pending".parse::<Kind>().unwrap_err();
        assert_eq!(unknown.to_string(), r#""pending" is not a known dead-letter kind"#);
        let unknown = "open".parse::<ResolutionKind>().unwrap_err();
        assert_eq!(unknown.to_string(), r#""open" is not a known dead-letter resolution"#);
    }
}
