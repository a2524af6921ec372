//! The operator's dead-letter commands: `list`, `show`, `retry`, `resolve`.
//!
//! Operators name a dead letter by its payment id (payment ids are unique across tenants). Every
//! action happens in one transaction that locks the open entry and the payment, re-checks both, and
//! records who did it and why twice: on the entry (`resolved_by`, `resolution`, `resolution_note`)
//! and, when the payment moves, in its audit trail (actor `operator:<name>`). Nothing is changed
//! when a check fails. A terminal payment is never moved: a `conflict` entry can only be
//! acknowledged. No transaction is open while the provider is asked about a charge.

use std::io::{self, Write};
use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::status::{PaymentStatus, Transition};
use oncepay_provider::PaymentProvider;
use oncepay_store::outbox;
use oncepay_store::settlement::{self, Asked, Unsettled};
use oncepay_store::transitions::{self, Applied, Change, Settlement};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::{Acquire, PgConnection};
use time::OffsetDateTime;

use crate::cli::CliError;
use crate::render::{self, Report, Table};
use crate::webhooks;

/// `list`: which entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// Only entries awaiting an operator.
    Open,
    /// Every entry, resolved ones too.
    All,
}

/// One entry, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// The entry's id.
    pub dead_letter_id: i64,
    /// The payment.
    pub payment_id: PaymentId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// The tenant's name.
    pub tenant: Option<String>,
    /// `unresolved` or `conflict`.
    pub kind: String,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Provider lookups made before giving up.
    pub attempts: i32,
    /// The payment's status now.
    pub payment_status: PaymentStatus,
    /// What it asked to charge.
    pub amount: i64,
    /// In which currency.
    pub currency: String,
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
    /// `succeeded`, `failed`, `retried`, `acknowledged`.
    pub resolution: Option<String>,
    /// The operator's reason.
    pub resolution_note: Option<String>,
    /// What was gathered, oldest first.
    pub evidence: Value,
}

/// `dead-letters list`.
#[derive(Debug, Serialize)]
pub struct EntryList(pub Vec<Entry>);

impl Report for EntryList {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut table =
            Table::new(&["PAYMENT", "TENANT", "KIND", "STATUS", "AMOUNT", "ATTEMPTS", "AGE", "RESOLUTION", "REASON"]);
        for e in &self.0 {
            table.row(vec![
                e.payment_id.to_string(),
                e.tenant.clone().unwrap_or_else(|| e.tenant_id.to_string()),
                e.kind.clone(),
                e.payment_status.as_str().to_owned(),
                format!("{} {}", e.amount, e.currency),
                e.attempts.to_string(),
                render::age(time::Duration::seconds(e.age_secs)),
                e.resolution.clone().unwrap_or_else(|| "open".to_owned()),
                e.reason.clone(),
            ]);
        }
        table.write(out, "no dead letters")
    }

    fn json(&self) -> Value {
        render::to_json(&self.0)
    }
}

/// Lists entries, oldest first.
pub async fn list(conn: &mut PgConnection, filter: Filter) -> Result<EntryList, CliError> {
    let entries = fetch(conn, None, filter == Filter::All).await?;
    Ok(EntryList(entries))
}

async fn fetch(conn: &mut PgConnection, payment_id: Option<PaymentId>, all: bool) -> Result<Vec<Entry>, CliError> {
    let rows = sqlx::query!(
        r#"
        SELECT d.dead_letter_id, d.payment_id, d.tenant_id, t.name AS "tenant?", d.kind, d.reason, d.attempts,
               p.status AS "payment_status: PaymentStatus", p.amount, p.currency, d.created_at,
               extract(epoch FROM COALESCE(d.resolved_at, now()) - d.created_at)::bigint AS "age_secs!",
               d.resolved_at, d.resolved_by, d.resolution, d.resolution_note, d.evidence
        FROM dead_letters d
        JOIN payments p USING (tenant_id, payment_id)
        LEFT JOIN tenants t USING (tenant_id)
        WHERE ($1::uuid IS NULL OR d.payment_id = $1) AND ($2 OR d.resolved_at IS NULL)
        ORDER BY d.created_at, d.dead_letter_id
        "#,
        payment_id.map(|p| p.as_uuid()),
        all,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the dead letters")?;
    Ok(rows
        .into_iter()
        .map(|r| Entry {
            dead_letter_id: r.dead_letter_id,
            payment_id: PaymentId::from_uuid(r.payment_id),
            tenant_id: TenantId::from_uuid(r.tenant_id),
            tenant: r.tenant,
            kind: r.kind,
            reason: r.reason,
            attempts: r.attempts,
            payment_status: r.payment_status,
            amount: r.amount,
            currency: r.currency,
            created_at: r.created_at,
            age_secs: r.age_secs,
            resolved_at: r.resolved_at,
            resolved_by: r.resolved_by,
            resolution: r.resolution,
            resolution_note: r.resolution_note,
            evidence: r.evidence,
        })
        .collect())
}

/// One row of a payment's audit trail.
#[derive(Debug, Clone, Serialize)]
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
#[derive(Debug, Serialize)]
pub struct Detail {
    /// The payment.
    pub payment_id: PaymentId,
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
            writeln!(out, "tenant      {}", e.tenant.clone().unwrap_or_else(|| e.tenant_id.to_string()))?;
            writeln!(out, "kind        {}", e.kind)?;
            writeln!(out, "why         {}", e.reason)?;
            writeln!(out, "attempts    {}", e.attempts)?;
            writeln!(out, "opened      {} ({} ago)", render::timestamp(e.created_at), render::age(age_of(e)))?;
            match (&e.resolution, e.resolved_at, &e.resolved_by) {
                (Some(resolution), Some(at), Some(by)) => writeln!(
                    out,
                    "resolved    {resolution} by {by} at {}: {}",
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

fn age_of(entry: &Entry) -> time::Duration {
    time::Duration::seconds(entry.age_secs)
}

/// Shows every dead letter of a payment.
pub async fn show(conn: &mut PgConnection, payment_id: PaymentId) -> Result<Detail, CliError> {
    let entries = fetch(conn, Some(payment_id), true).await?;
    let Some(first) = entries.first() else {
        return Err(CliError::NotFound(format!("payment {payment_id} has no dead letter")));
    };
    let audit_trail = audit_trail(conn, first.tenant_id, payment_id).await?;
    Ok(Detail { payment_id, entries, audit_trail })
}

async fn audit_trail(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Vec<AuditRow>, CliError> {
    let trail = sqlx::query_as!(
        AuditRow,
        r#"
        SELECT from_status AS "from_status: PaymentStatus", to_status AS "to_status: PaymentStatus",
               actor, reason, detail, created_at
        FROM payment_events WHERE tenant_id = $1 AND payment_id = $2
        ORDER BY event_id
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_all(conn)
    .await
    .context("cannot read the payment's audit trail")?;
    Ok(trail)
}

/// An operator, as recorded: `operator:<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator(String);

impl Operator {
    /// Checks a name given with `--operator` (or taken from `$USER`).
    pub fn parse(name: &str) -> Result<Self, CliError> {
        let name = name.trim();
        if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
            return Err(CliError::Invalid("name the operator with --operator (1 to 100 printable characters)".into()));
        }
        Ok(Self(format!("operator:{name}")))
    }

    /// `operator:<name>`.
    pub fn actor(&self) -> &str {
        &self.0
    }
}

/// What an operator action did.
#[derive(Debug, Serialize)]
pub struct Resolution {
    /// The payment.
    pub payment_id: PaymentId,
    /// The entry closed.
    pub dead_letter_id: i64,
    /// `retried`, `succeeded`, `failed` or `acknowledged`.
    pub resolution: &'static str,
    /// Who.
    pub resolved_by: String,
    /// Why.
    pub note: String,
    /// The payment's status afterwards.
    pub payment_status: PaymentStatus,
}

impl Report for Resolution {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "dead letter {} of payment {}: {} by {}; the payment is now {}",
            self.dead_letter_id,
            self.payment_id,
            self.resolution,
            self.resolved_by,
            self.payment_status.as_str()
        )
    }

    fn json(&self) -> Value {
        render::to_json(self)
    }
}

/// The open entry and its payment, locked for the rest of the transaction.
struct Locked {
    dead_letter_id: i64,
    tenant_id: TenantId,
    status: PaymentStatus,
    asked: Asked,
    in_key_window: bool,
    first_sent_at: Option<OffsetDateTime>,
}

async fn lock_open(
    conn: &mut PgConnection,
    payment_id: PaymentId,
    resend_horizon: Duration,
) -> Result<Locked, CliError> {
    let row = sqlx::query!(
        r#"
        SELECT d.dead_letter_id, d.tenant_id, p.status AS "status: PaymentStatus", p.first_sent_at,
               p.amount AS "amount: Amount", p.currency AS "currency: Currency",
               COALESCE(now() - p.first_sent_at < make_interval(secs => $2), true) AS "in_key_window!"
        FROM dead_letters d JOIN payments p USING (tenant_id, payment_id)
        WHERE d.payment_id = $1 AND d.resolved_at IS NULL
        FOR UPDATE OF d, p
        "#,
        payment_id.as_uuid(),
        resend_horizon.as_secs_f64(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the dead letter")?;
    let row = row.ok_or_else(|| CliError::NotFound(format!("payment {payment_id} has no open dead letter")))?;
    Ok(Locked {
        dead_letter_id: row.dead_letter_id,
        tenant_id: TenantId::from_uuid(row.tenant_id),
        status: row.status,
        asked: Asked { payment_id, amount: row.amount, currency: row.currency },
        in_key_window: row.in_key_window,
        first_sent_at: row.first_sent_at,
    })
}

async fn close(
    conn: &mut PgConnection,
    locked: &Locked,
    operator: &Operator,
    resolution: &str,
    note: &str,
) -> Result<(), CliError> {
    sqlx::query!(
        r#"
        UPDATE dead_letters
        SET resolved_at = now(), resolved_by = $3, resolution = $4, resolution_note = $5
        WHERE tenant_id = $1 AND dead_letter_id = $2 AND resolved_at IS NULL
        "#,
        locked.tenant_id.as_uuid(),
        locked.dead_letter_id,
        operator.actor(),
        resolution,
        note,
    )
    .execute(conn)
    .await
    .context("cannot close the dead letter")?;
    Ok(())
}

fn require_reason(reason: &str) -> Result<&str, CliError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(CliError::Invalid("say why with --reason".into()));
    }
    Ok(reason)
}

fn refuse_conflict(payment_id: PaymentId, status: PaymentStatus, action: &str) -> CliError {
    CliError::Refused(format!(
        "payment {payment_id} is {}, and a terminal payment never changes, so it cannot be {action}; record your \
         decision with `dead-letters resolve {payment_id} --acknowledge --reason ..`",
        status.as_str()
    ))
}

fn moved<T>(applied: Applied<T>, payment_id: PaymentId) -> Result<(), CliError> {
    match applied {
        Applied::Moved(_) => Ok(()),
        // The payment and the entry are locked: nothing else can have moved it.
        Applied::LostRace => Err(CliError::Refused(format!("payment {payment_id} changed underneath; try again"))),
    }
}

/// What `retry` needs to know.
#[derive(Debug, Clone)]
pub struct Retry<'a> {
    /// The dead-lettered payment.
    pub payment_id: PaymentId,
    /// Who.
    pub operator: &'a Operator,
    /// Why.
    pub reason: &'a str,
    /// The provider's key window minus the margin, after the payment's first send.
    pub resend_horizon: Duration,
    /// Resend even though the provider may have forgotten the key.
    pub outside_key_window: bool,
}

/// `retry`: `dead_lettered → pending` and back into the outbox, resent with the same downstream key.
///
/// Refused past the provider's key window unless `outside_key_window`: the provider would no longer
/// recognise the key, so if the first attempt did charge, the resend would charge again.
pub async fn retry(conn: &mut PgConnection, retry: &Retry<'_>) -> Result<Resolution, CliError> {
    let reason = require_reason(retry.reason)?;
    let payment_id = retry.payment_id;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let locked = lock_open(&mut tx, payment_id, retry.resend_horizon).await?;
    if locked.status != PaymentStatus::DeadLettered {
        return Err(refuse_conflict(payment_id, locked.status, "retried"));
    }
    if !locked.in_key_window && !retry.outside_key_window {
        let sent = locked.first_sent_at.map_or_else(|| "?".to_owned(), render::timestamp);
        return Err(CliError::Refused(format!(
            "payment {payment_id} was first sent at {sent}, and the provider may have forgotten its key since: if that \
             attempt charged, a resend would charge again. Check the evidence (`dead-letters show {payment_id}`), then \
             pass --outside-key-window to resend anyway"
        )));
    }
    let detail = json!({
        "dead_letter_id": locked.dead_letter_id,
        "outside_key_window": !locked.in_key_window,
    });
    let change = Change {
        tenant_id: locked.tenant_id,
        payment_id,
        from: PaymentStatus::DeadLettered,
        transition: Transition::OperatorRetry,
        actor: retry.operator.actor(),
        reason,
        detail: Some(detail),
    };
    moved(transitions::apply(&mut tx, &change).await.context("cannot move the payment")?, payment_id)?;
    if !locked.in_key_window {
        // The operator vouches that no earlier send charged: without this the worker would refuse the
        // resend past the key window. The audit row above records that they did.
        sqlx::query!(
            "UPDATE payments SET may_be_charged = false WHERE tenant_id = $1 AND payment_id = $2",
            locked.tenant_id.as_uuid(),
            payment_id.as_uuid(),
        )
        .execute(&mut *tx)
        .await
        .context("cannot record the operator's word")?;
    }
    outbox::enqueue(&mut tx, locked.tenant_id, payment_id, OffsetDateTime::now_utc())
        .await
        .context("cannot queue the payment")?;
    close(&mut tx, &locked, retry.operator, "retried", reason).await?;
    tx.commit().await.context("cannot commit the retry")?;
    Ok(Resolution {
        payment_id,
        dead_letter_id: locked.dead_letter_id,
        resolution: "retried",
        resolved_by: retry.operator.actor().to_owned(),
        note: reason.to_owned(),
        payment_status: PaymentStatus::Pending,
    })
}

/// The charge an operator says the payment succeeded with, as the ledger will book it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookedCharge {
    /// The provider's charge id.
    pub charge_id: String,
    /// Minor units the provider charged.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// When the provider created the charge.
    pub charged_at: OffsetDateTime,
}

/// What `resolve` decides.
#[derive(Debug, Clone)]
pub enum Decision {
    /// The payment succeeded with this charge.
    Succeeded(BookedCharge),
    /// No money moved (a failed charge id, if the provider made one).
    Failed {
        /// The provider's failed charge, if any.
        charge_id: Option<String>,
        /// Settle as failed although a recorded charge says the payment succeeded (the operator
        /// refunded it, say); the reason must say why.
        force: bool,
    },
    /// A conflict entry was looked at; the terminal payment stays as it is.
    Acknowledge,
}

/// Finds the charge `charge_id` of a dead-lettered payment, for a `resolve --as succeeded` that did
/// not give the amount, currency and time itself: among the charges signed webhooks reported for
/// the payment, else among the provider's charges for its key. No transaction is open meanwhile.
pub async fn find_charge<P: PaymentProvider>(
    conn: &mut PgConnection,
    provider: &P,
    payment_id: PaymentId,
    charge_id: &str,
) -> Result<BookedCharge, CliError> {
    let payment = sqlx::query!(
        r#"
        SELECT d.tenant_id, p.amount AS "amount: Amount", p.currency AS "currency: Currency"
        FROM dead_letters d JOIN payments p USING (tenant_id, payment_id)
        WHERE d.payment_id = $1 AND d.resolved_at IS NULL
        "#,
        payment_id.as_uuid(),
    )
    .fetch_optional(&mut *conn)
    .await
    .context("cannot read the dead letter")?
    .ok_or_else(|| CliError::NotFound(format!("payment {payment_id} has no open dead letter")))?;
    let recorded = webhooks::recorded_charges(conn, TenantId::from_uuid(payment.tenant_id), payment_id)
        .await
        .context("cannot read the payment's recorded webhooks")?;
    let charge = match recorded.into_iter().find(|c| c.id == charge_id) {
        Some(charge) => charge,
        None => {
            let charges = provider.find_by_key(&payment_id.downstream_key()).await.map_err(|error| {
                let context = format!("cannot ask the provider about charge {charge_id}");
                CliError::Failed(anyhow::Error::new(error).context(context))
            })?;
            charges.into_iter().find(|c| c.id == charge_id).ok_or_else(|| {
                CliError::Refused(format!(
                    "neither a webhook nor the provider's lookup by key names a charge {charge_id} for payment \
                     {payment_id} (past its key window the provider may not); give --amount, --currency and \
                     --charged-at from the provider's records"
                ))
            })?
        }
    };
    let asked = Asked { payment_id, amount: payment.amount, currency: payment.currency };
    match settlement::settlement_of(&asked, &charge).map_err(|why| refuse_booking(payment_id, &why))? {
        Settlement::Succeeded { charge_id, amount, currency, charged_at } => {
            Ok(BookedCharge { charge_id, amount, currency, charged_at })
        }
        Settlement::Failed { .. } => {
            Err(CliError::Refused(format!("the provider reports charge {charge_id} as failed; no money moved with it")))
        }
    }
}

/// Refuses to book a charge that does not settle the payment.
fn refuse_booking(payment_id: PaymentId, why: &Unsettled) -> CliError {
    CliError::Refused(format!(
        "{why}. A charge that is not what payment {payment_id} asked for is never booked as its success: \
         check it with the provider, refund it there if it was taken, and resolve the payment --as failed"
    ))
}

/// A succeeded charge that a signed webhook or a lookup recorded for the locked payment, if any.
async fn succeeded_charge_on_record(conn: &mut PgConnection, locked: &Locked) -> Result<Option<String>, CliError> {
    let charge_id = sqlx::query_scalar!(
        r#"
        (SELECT charge->>'id' AS "charge_id!" FROM webhook_events
         WHERE tenant_id = $1 AND payment_id = $2 AND charge->>'status' = 'succeeded')
        UNION ALL
        (SELECT item->'charge'->>'id' FROM dead_letters d, jsonb_array_elements(d.evidence) AS item
         WHERE d.tenant_id = $1 AND d.dead_letter_id = $3 AND item->'charge'->>'status' = 'succeeded')
        LIMIT 1
        "#,
        locked.tenant_id.as_uuid(),
        locked.asked.payment_id.as_uuid(),
        locked.dead_letter_id,
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the evidence")?;
    Ok(charge_id)
}

/// `resolve`: settles a dead-lettered payment as the operator decided, or acknowledges a conflict.
pub async fn resolve(
    conn: &mut PgConnection,
    payment_id: PaymentId,
    decision: &Decision,
    operator: &Operator,
    reason: &str,
) -> Result<Resolution, CliError> {
    let reason = require_reason(reason)?;
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    let locked = lock_open(&mut tx, payment_id, Duration::ZERO).await?;
    // A terminal payment never moves: its entry can only be acknowledged.
    let terminal = locked.status.is_terminal();
    let (resolution, status) = match decision {
        Decision::Acknowledge if terminal => ("acknowledged", locked.status),
        Decision::Acknowledge => {
            return Err(CliError::Refused(format!(
                "payment {payment_id} is dead-lettered and needs a decision: `--as succeeded|failed`, or \
                 `dead-letters retry`"
            )));
        }
        Decision::Succeeded(_) | Decision::Failed { .. } if terminal => {
            return Err(refuse_conflict(payment_id, locked.status, "settled again"));
        }
        Decision::Succeeded(charge) => {
            let settlement = settlement::success(
                &locked.asked,
                &charge.charge_id,
                charge.amount,
                &charge.currency,
                charge.charged_at.unix_timestamp(),
            )
            .map_err(|why| refuse_booking(payment_id, &why))?;
            settle(&mut tx, &locked, payment_id, Transition::OperatorSucceeded, &settlement, operator, reason).await?;
            ("succeeded", PaymentStatus::Succeeded)
        }
        Decision::Failed { charge_id, force } => {
            if !force && let Some(charged) = succeeded_charge_on_record(&mut tx, &locked).await? {
                return Err(CliError::Refused(format!(
                    "a signed provider report says charge {charged} of payment {payment_id} succeeded; settling it as \
                     failed would tell the merchant no money moved. Check the evidence (`dead-letters show \
                     {payment_id}`): resolve it `--as succeeded --charge-id {charged}`, or, if you refunded it, pass \
                     --force and say so in --reason"
                )));
            }
            let settlement = Settlement::Failed {
                code: "resolved_by_operator".to_owned(),
                message: reason.to_owned(),
                charge_id: charge_id.clone(),
            };
            settle(&mut tx, &locked, payment_id, Transition::OperatorFailed, &settlement, operator, reason).await?;
            ("failed", PaymentStatus::Failed)
        }
    };
    close(&mut tx, &locked, operator, resolution, reason).await?;
    tx.commit().await.context("cannot commit the resolution")?;
    Ok(Resolution {
        payment_id,
        dead_letter_id: locked.dead_letter_id,
        resolution,
        resolved_by: operator.actor().to_owned(),
        note: reason.to_owned(),
        payment_status: status,
    })
}

async fn settle(
    conn: &mut PgConnection,
    locked: &Locked,
    payment_id: PaymentId,
    transition: Transition,
    settlement: &Settlement,
    operator: &Operator,
    reason: &str,
) -> Result<(), CliError> {
    let change = Change {
        tenant_id: locked.tenant_id,
        payment_id,
        from: PaymentStatus::DeadLettered,
        transition,
        actor: operator.actor(),
        reason,
        detail: Some(json!({ "dead_letter_id": locked.dead_letter_id })),
    };
    let applied = transitions::settle(conn, &change, settlement).await.context("cannot settle the payment")?;
    moved(applied, payment_id)
}
