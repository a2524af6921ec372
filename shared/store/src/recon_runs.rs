//! Reconciliation runs as stored: the window a run covers ([`Window`]), who started it and where it
//! stands, holding a window (one queued, running or completed run each), and reading runs and the
//! discrepancies they found back for operators.
//!
//! The reconciler does the runs; the operators' side queues them and reads them. What a run does
//! while it runs (heartbeats, completing, failing) is the reconciler's own.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use serde::Serialize;
use serde_json::Value;
use sqlx::{Acquire, PgConnection};
use time::{Date, OffsetDateTime, Time};
use uuid::Uuid;

use crate::StoreError;
use crate::stored_name::{self, UnknownName};

/// A half-open window of time, `[start, end)`, in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Inclusive.
    pub start: OffsetDateTime,
    /// Exclusive.
    pub end: OffsetDateTime,
}

/// A window that ends before it starts, or is not in whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a reconciliation window must start before it ends, on whole seconds")]
pub struct BadWindow;

impl Window {
    /// Checks the bounds.
    pub fn new(start: OffsetDateTime, end: OffsetDateTime) -> Result<Self, BadWindow> {
        if start < end && start.nanosecond() == 0 && end.nanosecond() == 0 {
            Ok(Self { start, end })
        } else {
            Err(BadWindow)
        }
    }

    /// The UTC day `date`.
    pub fn day(date: Date) -> Self {
        let start = date.with_time(Time::MIDNIGHT).assume_utc();
        Self { start, end: start + time::Duration::DAY }
    }

    /// The UTC day before the one containing `now`.
    pub fn previous_day(now: OffsetDateTime) -> Self {
        Self::day(now.to_offset(time::UtcOffset::UTC).date().previous_day().unwrap_or(Date::MIN))
    }
}

/// Who started a run: the `recon_run_trigger` column type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "recon_run_trigger", rename_all = "snake_case")]
pub enum Trigger {
    /// The nightly schedule.
    Schedule,
    /// An operator's `recon run`.
    Operator,
}

impl Trigger {
    /// The name, as stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Schedule => "schedule",
            Self::Operator => "operator",
        }
    }
}

/// Where a run stands: the `recon_run_status` column type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "recon_run_status", rename_all = "snake_case")]
pub enum RunStatus {
    /// Asked for by an operator; the next reconciler to look starts it.
    Queued,
    /// Still comparing, and proving it is alive with heartbeats.
    Running,
    /// Finished; its discrepancies are recorded.
    Completed,
    /// Stopped with an error, or taken over after its heartbeat stopped.
    Failed,
}

impl RunStatus {
    /// The name, as stored and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of trying to claim or queue a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The window is this new run's.
    Won(Uuid),
    /// Another run already covers it (queued, running or completed).
    Taken {
        /// That run.
        run_id: Uuid,
        /// `Queued`, `Running` or `Completed`.
        status: RunStatus,
    },
}

/// Queues `window` for an operator: the next reconciler to look runs it. A running run of the window
/// whose heartbeat is older than `stale_after` is taken over, as a reconciler's claim takes it over.
pub async fn queue(conn: &mut PgConnection, window: &Window, stale_after: Duration) -> Result<Claim, StoreError> {
    let mut tx = conn.begin().await?;
    let claim = hold(&mut tx, window, Trigger::Operator, RunStatus::Queued, stale_after).await?;
    tx.commit().await?;
    Ok(claim)
}

/// Inserts a run of `window` in `status`, in the caller's transaction, unless a queued, running or
/// completed run holds it. A running run whose heartbeat is older than `stale_after` is presumed dead
/// first: it is marked `failed` ("abandoned"), which frees the window.
pub async fn hold(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    window: &Window,
    trigger: Trigger,
    status: RunStatus,
    stale_after: Duration,
) -> Result<Claim, StoreError> {
    let abandoned = sqlx::query!(
        r#"
        UPDATE recon_runs
        SET status = 'failed', finished_at = now(),
            error = 'abandoned: no heartbeat since ' || heartbeat_at::text || '; taken over'
        WHERE window_start = $1 AND window_end = $2 AND status = 'running'
          AND heartbeat_at < now() - make_interval(secs => $3)
        "#,
        window.start,
        window.end,
        stale_after.as_secs_f64(),
    )
    .execute(&mut **tx)
    .await?;
    if abandoned.rows_affected() > 0 {
        tracing::warn!(window.start = %window.start, "took over a reconciliation run whose heartbeat stopped");
    }
    let run_id = Uuid::now_v7();
    // A partial unique index allows one live or completed run per window: among reconcilers racing
    // for it, one insert wins and the others read its run.
    let won = sqlx::query_scalar!(
        r#"
        INSERT INTO recon_runs (run_id, window_start, window_end, trigger, status)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (window_start, window_end) WHERE status <> 'failed' DO NOTHING
        RETURNING run_id
        "#,
        run_id,
        window.start,
        window.end,
        trigger as _,
        status as _,
    )
    .fetch_optional(&mut **tx)
    .await?;
    Ok(match won {
        Some(run_id) => Claim::Won(run_id),
        None => {
            let existing = sqlx::query!(
                r#"
                SELECT run_id, status AS "status: RunStatus" FROM recon_runs
                WHERE window_start = $1 AND window_end = $2 AND status <> 'failed'
                "#,
                window.start,
                window.end,
            )
            .fetch_one(&mut **tx)
            .await?;
            Claim::Taken { run_id: existing.run_id, status: existing.status }
        }
    })
}

/// A discrepancy class, as stored in `recon_discrepancies.class`.
///
/// Refunds have classes of their own, each the twin of a charge's (`refund_` before its name, or
/// `_refund` for `_charge`), so that a run's counts and the discrepancy metric tell money that went
/// back from money taken; [`Class::UnrequestedRefund`] has no twin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Charged at the provider, not in our ledger: a succeeded charge that no ledger entry books (the
    /// payment has no entry at all, or its entry books another charge).
    MissingInLedger,
    /// In our ledger, not at the provider: an entry charged in the window whose charge the provider
    /// does not list in the window as succeeded.
    MissingAtProvider,
    /// Both sides have the charge, with different money.
    AmountOrCurrencyMismatch,
    /// More than one succeeded charge for one payment. Reported once, naming every charge; the extra
    /// charges are not reported again as missing in the ledger.
    DuplicateCharge,
    /// A charge the provider has not finished: no money yet, but it may still take some. It is read
    /// again on every later run, and compared like any other charge once it is final.
    Unfinished,
    /// Refunded at the provider, not in our ledger: a succeeded refund made for an oncepay refund
    /// that no refund ledger entry books (the refund is still `unknown`, was settled `failed`, or
    /// its entry books another provider refund).
    RefundMissingInLedger,
    /// In our refund ledger, not at the provider: an entry of the window whose refund the provider
    /// does not list in the window as succeeded (it lists it failed, canceled or not finished, or
    /// not at all).
    RefundMissingAtProvider,
    /// Both sides have the refund, with different money.
    RefundAmountOrCurrencyMismatch,
    /// More than one succeeded provider refund for one oncepay refund. Reported once, naming every
    /// refund; the extra refunds are not reported again as missing in the ledger.
    DuplicateRefund,
    /// A succeeded provider refund that no oncepay refund asked for: it names none (made on the
    /// provider's dashboard, say), or one that oncepay does not have.
    UnrequestedRefund,
    /// A refund the provider has not finished: no money back yet, but it may still go back. It is
    /// read again on every later run, and compared like any other refund once it is final.
    RefundUnfinished,
}

impl Class {
    /// Every class.
    pub const ALL: [Self; 11] = [
        Self::MissingInLedger,
        Self::MissingAtProvider,
        Self::AmountOrCurrencyMismatch,
        Self::DuplicateCharge,
        Self::Unfinished,
        Self::RefundMissingInLedger,
        Self::RefundMissingAtProvider,
        Self::RefundAmountOrCurrencyMismatch,
        Self::DuplicateRefund,
        Self::UnrequestedRefund,
        Self::RefundUnfinished,
    ];

    /// The stored name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MissingInLedger => "missing_in_ledger",
            Self::MissingAtProvider => "missing_at_provider",
            Self::AmountOrCurrencyMismatch => "amount_or_currency_mismatch",
            Self::DuplicateCharge => "duplicate_charge",
            Self::Unfinished => "unfinished",
            Self::RefundMissingInLedger => "refund_missing_in_ledger",
            Self::RefundMissingAtProvider => "refund_missing_at_provider",
            Self::RefundAmountOrCurrencyMismatch => "refund_amount_or_currency_mismatch",
            Self::DuplicateRefund => "duplicate_refund",
            Self::UnrequestedRefund => "unrequested_refund",
            Self::RefundUnfinished => "refund_unfinished",
        }
    }

    /// Whether the class is about refunds rather than charges.
    pub const fn is_about_refunds(self) -> bool {
        match self {
            Self::MissingInLedger
            | Self::MissingAtProvider
            | Self::AmountOrCurrencyMismatch
            | Self::DuplicateCharge
            | Self::Unfinished => false,
            Self::RefundMissingInLedger
            | Self::RefundMissingAtProvider
            | Self::RefundAmountOrCurrencyMismatch
            | Self::DuplicateRefund
            | Self::UnrequestedRefund
            | Self::RefundUnfinished => true,
        }
    }
}

impl FromStr for Class {
    type Err = UnknownName;

    fn from_str(text: &str) -> Result<Self, UnknownName> {
        stored_name::parse(&Self::ALL, Self::as_str, "discrepancy class", text)
    }
}

/// One discrepancy, as found and as stored in `recon_discrepancies`.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Discrepancy {
    /// Which class.
    pub class: Class,
    /// The payment's owner, when known.
    pub tenant_id: Option<TenantId>,
    /// The payment, when known.
    pub payment_id: Option<PaymentId>,
    /// The charge it is about (the first, for a duplicate); for a refund, the charge refunded.
    pub provider_charge_id: Option<String>,
    /// The oncepay refund it is about, when it is about a refund and one is known.
    #[serde(default)]
    pub refund_id: Option<RefundId>,
    /// The provider's refund it is about (the first, for a duplicate).
    #[serde(default)]
    pub provider_refund_id: Option<String>,
    /// What our ledger says.
    pub ours: Option<Value>,
    /// What the provider says.
    pub theirs: Option<Value>,
    /// In words.
    pub detail: String,
}

/// A run, as operators see it.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Run {
    /// Its id.
    pub run_id: Uuid,
    /// Start of the window (inclusive).
    #[serde(with = "time::serde::rfc3339")]
    pub window_start: OffsetDateTime,
    /// End of the window (exclusive).
    #[serde(with = "time::serde::rfc3339")]
    pub window_end: OffsetDateTime,
    /// Who started it.
    pub trigger: Trigger,
    /// Where it stands.
    pub status: RunStatus,
    /// When it started.
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// When it last proved it was alive.
    #[serde(with = "time::serde::rfc3339")]
    pub heartbeat_at: OffsetDateTime,
    /// When it ended.
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// Provider charges compared.
    pub provider_charges: Option<i32>,
    /// Ledger entries compared.
    pub ledger_entries: Option<i32>,
    /// Provider refunds compared (none for a run of a version that compared only charges).
    #[serde(default)]
    pub provider_refunds: Option<i32>,
    /// Refund ledger entries compared (as `provider_refunds`).
    #[serde(default)]
    pub refund_ledger_entries: Option<i32>,
    /// Discrepancies.
    pub discrepancies: Option<i32>,
    /// Why it failed.
    pub error: Option<String>,
}

/// The latest runs, newest first.
pub async fn list(conn: &mut PgConnection, limit: u32) -> Result<Vec<Run>, StoreError> {
    sqlx::query_as!(
        Run,
        r#"
        SELECT run_id, window_start, window_end, trigger AS "trigger: Trigger", status AS "status: RunStatus",
               started_at, heartbeat_at, finished_at, provider_charges, ledger_entries, provider_refunds,
               refund_ledger_entries, discrepancies, error
        FROM recon_runs ORDER BY started_at DESC, run_id DESC LIMIT $1
        "#,
        i64::from(limit),
    )
    .fetch_all(conn)
    .await
    .map_err(StoreError::from)
}

/// One run.
pub async fn find(conn: &mut PgConnection, run_id: Uuid) -> Result<Option<Run>, StoreError> {
    sqlx::query_as!(
        Run,
        r#"
        SELECT run_id, window_start, window_end, trigger AS "trigger: Trigger", status AS "status: RunStatus",
               started_at, heartbeat_at, finished_at, provider_charges, ledger_entries, provider_refunds,
               refund_ledger_entries, discrepancies, error
        FROM recon_runs WHERE run_id = $1
        "#,
        run_id,
    )
    .fetch_optional(conn)
    .await
    .map_err(StoreError::from)
}

/// A run's discrepancies, by class then in the order found.
pub async fn discrepancies(conn: &mut PgConnection, run_id: Uuid) -> Result<Vec<Discrepancy>, StoreError> {
    let rows = sqlx::query!(
        r#"
        SELECT discrepancy_id, class, tenant_id AS "tenant_id: TenantId", payment_id AS "payment_id: PaymentId",
               provider_charge_id, refund_id AS "refund_id: RefundId", provider_refund_id, ours, theirs, detail
        FROM recon_discrepancies WHERE run_id = $1
        ORDER BY class, discrepancy_id
        "#,
        run_id,
    )
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(Discrepancy {
                class: r
                    .class
                    .parse()
                    .map_err(|e: UnknownName| StoreError::Unexpected(Arc::new(sqlx::Error::Decode(e.into()))))?,
                tenant_id: r.tenant_id,
                payment_id: r.payment_id,
                provider_charge_id: r.provider_charge_id,
                refund_id: r.refund_id,
                provider_refund_id: r.provider_refund_id,
                ours: r.ours,
                theirs: r.theirs,
                detail: r.detail,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use time::macros::{date, datetime};

    use super::*;

    #[test]
    fn the_nightly_window_is_the_whole_previous_utc_day() {
        let window = Window::previous_day(datetime!(2026-03-02 01:30 +02:00));
        assert_eq!(window, Window::day(date!(2026 - 02 - 28)));
        assert_eq!(window.start, datetime!(2026-02-28 00:00 UTC));
        assert_eq!(window.end, datetime!(2026-03-01 00:00 UTC));
    }

    #[test]
    fn a_window_must_start_before_it_ends_on_whole_seconds() {
        let t = datetime!(2026-03-01 00:00 UTC);
        assert!(Window::new(t, t + time::Duration::SECOND).is_ok());
        assert_eq!(Window::new(t, t), Err(BadWindow));
        assert_eq!(Window::new(t, t + time::Duration::milliseconds(1500)), Err(BadWindow));
    }

    #[test]
    fn every_class_reads_back_from_its_stored_name_and_says_whether_it_is_about_refunds() {
        for class in Class::ALL {
            assert_eq!(class.as_str().parse::<Class>().ok(), Some(class));
            assert_eq!(class.is_about_refunds(), class.as_str().contains("refund"), "{}", class.as_str());
        }
        assert!("refund_duplicate".parse::<Class>().is_err());
    }
}
