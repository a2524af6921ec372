//! The console's reads: the overview's counts, a page of dead letters, the search, one payment with
//! its timeline and its events, and the webhook endpoints. Each reads only the tenants it is given,
//! and none scans a table that grows with the payments: the dead-letter pages walk an index in age
//! order from a cursor, the search probes primary keys and indexes once per visible tenant, and a
//! payment's rows are read by its key (BENCHMARKS.md, "The console").

use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_domain::status::PaymentStatus;
use serde_json::Value;
use sqlx::{PgConnection, Postgres, QueryBuilder};
use time::OffsetDateTime;
use uuid::Uuid;

use oncepay_ops::operator_error::OperatorError;

/// The tenants an operator may see, as ids: `only` when they are limited, else every tenant.
pub(super) async fn visible_tenants(
    conn: &mut PgConnection,
    only: Option<&[Uuid]>,
) -> Result<Vec<Tenant>, OperatorError> {
    let tenants = sqlx::query_as!(
        Tenant,
        r#"
        SELECT tenant_id AS "tenant_id: TenantId", name FROM tenants
        WHERE $1::uuid[] IS NULL OR tenant_id = ANY ($1)
        ORDER BY name
        "#,
        only,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the tenants")?;
    Ok(tenants)
}

/// A tenant, as the console names it.
#[derive(Debug, Clone)]
pub(super) struct Tenant {
    pub(super) tenant_id: TenantId,
    pub(super) name: String,
}

/// The overview's figures, of the tenants given.
#[derive(Debug)]
pub(super) struct Overview {
    /// Payments waiting for a worker (`pending`, in the outbox, not leased).
    pub(super) waiting: i64,
    /// Payments a worker is sending now (leased).
    pub(super) sending: i64,
    /// Payments in `unknown`.
    pub(super) unknown: i64,
    /// Since when the oldest `unknown` payment has been uncertain.
    pub(super) oldest_unknown: Option<OffsetDateTime>,
    /// Charges booked in the ledger in the last hour.
    pub(super) booked_last_hour: i64,
    /// Refunds waiting for a worker, as [`Overview::waiting`].
    pub(super) refunds_waiting: i64,
    /// Refunds a worker is sending now.
    pub(super) refunds_sending: i64,
    /// Refunds in `unknown`.
    pub(super) refunds_unknown: i64,
    /// Since when the oldest `unknown` refund has been uncertain (its last change to `unknown`).
    pub(super) oldest_unknown_refund: Option<OffsetDateTime>,
    /// Refunds booked in the refund ledger in the last hour.
    pub(super) refunded_last_hour: i64,
    /// Proposals that wait for an approver and have not expired.
    pub(super) proposals_waiting: i64,
    /// Open dead letters by kind: the payments' (`unresolved`, `conflict`) and the refunds'
    /// (`refund_unresolved`, `refund_conflict`).
    pub(super) open_by_kind: Vec<OpenByKind>,
}

/// Open dead letters of one kind, by age.
#[derive(Debug)]
pub(super) struct OpenByKind {
    pub(super) kind: String,
    pub(super) open: i64,
    pub(super) older_than_an_hour: i64,
    pub(super) older_than_a_day: i64,
    pub(super) oldest: Option<OffsetDateTime>,
}

/// Reads the overview's figures for `tenants`.
pub(super) async fn overview(conn: &mut PgConnection, tenants: &[Uuid]) -> Result<Overview, OperatorError> {
    let row = sqlx::query!(
        r#"
        SELECT
            (SELECT count(*) FROM outbox WHERE tenant_id = ANY ($1) AND locked_until IS NULL) AS "waiting!",
            (SELECT count(*) FROM outbox WHERE tenant_id = ANY ($1) AND locked_until IS NOT NULL) AS "sending!",
            (SELECT count(*) FROM unknown_payments WHERE tenant_id = ANY ($1)) AS "unknown!",
            (SELECT min(since) FROM unknown_payments WHERE tenant_id = ANY ($1)) AS oldest_unknown,
            (SELECT count(*) FROM ledger_entries
             WHERE tenant_id = ANY ($1) AND charged_at > now() - interval '1 hour') AS "booked_last_hour!",
            (SELECT count(*) FROM refund_outbox WHERE tenant_id = ANY ($1) AND locked_until IS NULL) AS "refunds_waiting!",
            (SELECT count(*) FROM refund_outbox
             WHERE tenant_id = ANY ($1) AND locked_until IS NOT NULL) AS "refunds_sending!",
            (SELECT count(*) FROM refunds WHERE tenant_id = ANY ($1) AND status = 'unknown') AS "refunds_unknown!",
            -- A refund's `updated_at` is when it became `unknown`: only a status change moves it.
            (SELECT min(updated_at) FROM refunds
             WHERE tenant_id = ANY ($1) AND status = 'unknown') AS oldest_unknown_refund,
            (SELECT count(*) FROM refund_ledger_entries
             WHERE tenant_id = ANY ($1) AND refunded_at > now() - interval '1 hour') AS "refunded_last_hour!",
            (SELECT count(*) FROM proposals
             WHERE tenant_id = ANY ($1) AND status = 'pending' AND expires_at > now()) AS "proposals_waiting!"
        "#,
        tenants,
    )
    .fetch_one(&mut *conn)
    .await
    .context("cannot read the overview")?;
    let open_by_kind = sqlx::query_as!(
        OpenByKind,
        r#"
        SELECT kind AS "kind!", count(*) AS "open!",
               count(*) FILTER (WHERE since < now() - interval '1 hour') AS "older_than_an_hour!",
               count(*) FILTER (WHERE since < now() - interval '1 day') AS "older_than_a_day!",
               min(since) AS oldest
        FROM (
            SELECT kind, created_at AS since FROM dead_letters WHERE resolved_at IS NULL AND tenant_id = ANY ($1)
            UNION ALL
            SELECT 'refund_unresolved', dead_lettered.at
            FROM refunds r
            CROSS JOIN LATERAL (
                SELECT max(e.created_at) AS at FROM refund_events e
                WHERE e.tenant_id = r.tenant_id AND e.refund_id = r.refund_id AND e.to_status = 'dead_lettered'
            ) dead_lettered
            WHERE r.status = 'dead_lettered' AND r.tenant_id = ANY ($1)
            UNION ALL
            SELECT 'refund_conflict', created_at FROM refund_dead_letters
            WHERE resolved_at IS NULL AND tenant_id = ANY ($1)
        ) open
        GROUP BY kind ORDER BY kind
        "#,
        tenants,
    )
    .fetch_all(conn)
    .await
    .context("cannot count the open dead letters")?;
    Ok(Overview {
        waiting: row.waiting,
        sending: row.sending,
        unknown: row.unknown,
        oldest_unknown: row.oldest_unknown,
        booked_last_hour: row.booked_last_hour,
        refunds_waiting: row.refunds_waiting,
        refunds_sending: row.refunds_sending,
        refunds_unknown: row.refunds_unknown,
        oldest_unknown_refund: row.oldest_unknown_refund,
        refunded_last_hour: row.refunded_last_hour,
        proposals_waiting: row.proposals_waiting,
        open_by_kind,
    })
}

/// Which dead letters a page lists.
#[derive(Debug, Clone, Default)]
pub(super) struct DeadLetterFilter {
    /// `unresolved` or `conflict`; any when `None`.
    pub(super) kind: Option<String>,
    /// Only these tenants (already limited to those the operator may see).
    pub(super) tenants: Vec<Uuid>,
    /// Open ones, resolved ones, or both.
    pub(super) state: EntryState,
    /// Only entries at least this old, in seconds.
    pub(super) older_than_secs: Option<i64>,
    /// The page after this entry.
    pub(super) after: Option<Cursor>,
}

/// Open entries, resolved ones, or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum EntryState {
    /// Waiting for an operator.
    #[default]
    Open,
    /// Closed by an operator.
    Resolved,
    /// Either.
    All,
}

/// Where a page of dead letters ends: its last entry's age and id. The next page starts after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cursor {
    pub(super) created_at: OffsetDateTime,
    pub(super) dead_letter_id: i64,
}

impl Cursor {
    /// As it travels in a URL: microseconds since the epoch, a dot, the id.
    pub(super) fn encode(self) -> String {
        format!("{}.{}", self.created_at.unix_timestamp_nanos() / 1000, self.dead_letter_id)
    }

    /// Reads [`Cursor::encode`]'s form back; `None` for anything else.
    pub(super) fn decode(text: &str) -> Option<Self> {
        let (micros, id) = text.split_once('.')?;
        let micros: i128 = micros.parse().ok()?;
        let created_at = OffsetDateTime::from_unix_timestamp_nanos(micros.checked_mul(1000)?).ok()?;
        Some(Self { created_at, dead_letter_id: id.parse().ok()? })
    }
}

/// One dead letter on a page.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct DeadLetterRow {
    pub(super) dead_letter_id: i64,
    pub(super) payment_id: PaymentId,
    pub(super) tenant: String,
    pub(super) kind: String,
    pub(super) reason: String,
    pub(super) created_at: OffsetDateTime,
    pub(super) resolution: Option<String>,
    pub(super) status: PaymentStatus,
    pub(super) amount: Amount,
    pub(super) currency: Currency,
}

/// A page of at most `limit` dead letters, oldest first, and whether more follow.
pub(super) async fn dead_letter_page(
    conn: &mut PgConnection,
    filter: &DeadLetterFilter,
    limit: i64,
) -> Result<(Vec<DeadLetterRow>, bool), OperatorError> {
    let mut sql = QueryBuilder::<Postgres>::new(
        "SELECT d.dead_letter_id, d.payment_id, t.name AS tenant, d.kind, d.reason, d.created_at, d.resolution, \
         p.status, p.amount, p.currency \
         FROM dead_letters d JOIN payments p USING (tenant_id, payment_id) JOIN tenants t USING (tenant_id) \
         WHERE d.tenant_id = ANY (",
    );
    sql.push_bind(&filter.tenants).push(")");
    // Each state's condition is written out, not bound, so the planner can use the index of open
    // entries when only open ones are asked for.
    match filter.state {
        EntryState::Open => sql.push(" AND d.resolved_at IS NULL"),
        EntryState::Resolved => sql.push(" AND d.resolved_at IS NOT NULL"),
        EntryState::All => &mut sql,
    };
    if let Some(kind) = &filter.kind {
        sql.push(" AND d.kind = ").push_bind(kind);
    }
    if let Some(secs) = filter.older_than_secs {
        sql.push(" AND d.created_at <= now() - make_interval(secs => ").push_bind(secs as f64).push(")");
    }
    if let Some(after) = filter.after {
        sql.push(" AND (d.created_at, d.dead_letter_id) > (")
            .push_bind(after.created_at)
            .push(", ")
            .push_bind(after.dead_letter_id)
            .push(")");
    }
    // Written in, not bound: with a bound limit PostgreSQL's cached plan reckons with a tenth of the
    // table, and it plans every request anew once the list is long (BENCHMARKS.md, "The console").
    sql.push(format!(" ORDER BY d.created_at, d.dead_letter_id LIMIT {}", limit.saturating_add(1)));
    let mut rows: Vec<DeadLetterRow> =
        sql.build_query_as().fetch_all(conn).await.context("cannot read a page of dead letters")?;
    let more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(0));
    Ok((rows, more))
}

/// A payment the search found, and how.
#[derive(Debug)]
pub(super) struct Found {
    pub(super) matched: String,
    pub(super) payment_id: PaymentId,
    pub(super) tenant: String,
    pub(super) status: PaymentStatus,
    pub(super) amount: Amount,
    pub(super) currency: Currency,
    pub(super) created_at: OffsetDateTime,
}

/// The payments of `tenants` that `text` names: by payment id, `Idempotency-Key`, the provider's
/// reference of its charge, or, with `by_customer`, its customer reference. At most `limit`.
pub(super) async fn search(
    conn: &mut PgConnection,
    tenants: &[Uuid],
    text: &str,
    by_customer: bool,
    limit: i64,
) -> Result<Vec<Found>, OperatorError> {
    let as_id = Uuid::parse_str(text).ok();
    let found = sqlx::query_as!(
        Found,
        r#"
        WITH matched AS (
            SELECT 'payment id' AS matched, tenant_id, payment_id FROM payments
            WHERE tenant_id = ANY ($1) AND payment_id = $2
            UNION ALL
            SELECT 'idempotency key', tenant_id, payment_id FROM idempotency_keys
            WHERE tenant_id = ANY ($1) AND idempotency_key = $3
            UNION ALL
            SELECT 'provider reference', tenant_id, payment_id FROM ledger_entries
            WHERE tenant_id = ANY ($1) AND provider_charge_id = $3
            UNION ALL
            (SELECT 'customer reference', tenant_id, payment_id FROM payments
             WHERE $5 AND tenant_id = ANY ($1) AND customer_id = $3 LIMIT $4)
        )
        SELECT m.matched AS "matched!", m.payment_id AS "payment_id!: PaymentId", t.name AS tenant,
               p.status AS "status: PaymentStatus", p.amount AS "amount: Amount", p.currency AS "currency: Currency",
               p.created_at
        FROM matched m JOIN payments p USING (tenant_id, payment_id) JOIN tenants t USING (tenant_id)
        ORDER BY p.created_at DESC
        LIMIT $4
        "#,
        tenants,
        as_id,
        text,
        limit,
        by_customer,
    )
    .fetch_all(conn)
    .await
    .context("cannot search the payments")?;
    Ok(found)
}

/// A payment, as its page shows it.
#[derive(Debug)]
pub(super) struct Payment {
    pub(super) tenant_id: TenantId,
    pub(super) tenant: String,
    pub(super) status: PaymentStatus,
    pub(super) amount: Amount,
    pub(super) currency: Currency,
    pub(super) customer_id: String,
    pub(super) description: Option<String>,
    pub(super) metadata: Value,
    pub(super) payment_method: Option<String>,
    pub(super) provider_account: Option<ProviderAccount>,
    pub(super) provider_charge_id: Option<String>,
    pub(super) failure_code: Option<String>,
    pub(super) failure_message: Option<String>,
    pub(super) send_attempts: i32,
    pub(super) first_sent_at: Option<OffsetDateTime>,
    pub(super) created_at: OffsetDateTime,
    pub(super) updated_at: OffsetDateTime,
    pub(super) idempotency_key: Option<String>,
    pub(super) booked_charge: Option<String>,
    pub(super) booked_amount: Option<i64>,
    pub(super) booked_currency: Option<String>,
    /// What its refunds that are not `failed` add up to.
    pub(super) refunds_reserved: i64,
    /// What its `succeeded` refunds add up to.
    pub(super) refunded: i64,
}

/// Payment `payment_id`, if one of `tenants` has it.
pub(super) async fn payment(
    conn: &mut PgConnection,
    tenants: &[Uuid],
    payment_id: PaymentId,
) -> Result<Option<Payment>, OperatorError> {
    let payment = sqlx::query_as!(
        Payment,
        r#"
        SELECT p.tenant_id AS "tenant_id: TenantId", t.name AS tenant, p.status AS "status: PaymentStatus",
               p.amount AS "amount: Amount", p.currency AS "currency: Currency", p.customer_id, p.description,
               p.metadata, p.payment_method, p.provider_account AS "provider_account: ProviderAccount",
               p.provider_charge_id, p.failure_code, p.failure_message, p.send_attempts, p.first_sent_at,
               p.created_at, p.updated_at, k.idempotency_key AS "idempotency_key?",
               l.provider_charge_id AS "booked_charge?", l.amount AS "booked_amount?",
               l.currency AS "booked_currency?", p.refunds_reserved, p.refunded
        FROM payments p
        JOIN tenants t USING (tenant_id)
        LEFT JOIN idempotency_keys k USING (tenant_id, payment_id)
        LEFT JOIN ledger_entries l USING (tenant_id, payment_id)
        WHERE p.tenant_id = ANY ($1) AND p.payment_id = $2
        "#,
        tenants,
        payment_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the payment")?;
    Ok(payment)
}

/// A payment's dead letter.
#[derive(Debug)]
pub(super) struct PaymentDeadLetter {
    pub(super) kind: String,
    /// What the reconciler learned before it gave up, as `unknown::evidence` wrote it.
    pub(super) evidence: Value,
    pub(super) reason: String,
    pub(super) created_at: OffsetDateTime,
    pub(super) resolved_at: Option<OffsetDateTime>,
    pub(super) resolved_by: Option<String>,
    pub(super) resolution: Option<String>,
    pub(super) resolution_note: Option<String>,
}

/// One thing that happened to a payment.
#[derive(Debug, Clone)]
pub(super) struct Happened {
    pub(super) at: OffsetDateTime,
    /// What kind of thing: `status`, `webhook`, `event`, `dead letter`, `proposal`, `operator`.
    pub(super) source: &'static str,
    /// Who did it.
    pub(super) by: String,
    /// What happened, in a line.
    pub(super) what: String,
}

/// The most rows of each kind a timeline shows.
const TIMELINE_ROWS: i64 = 500;

/// Everything that happened to a payment, oldest first: its status changes, the webhooks received
/// for it, the events it sent the merchant, its dead letters, its proposals and the operators' actions on it (not their reads). Also
/// its dead letters, newest first.
pub(super) async fn timeline(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<(Vec<Happened>, Vec<PaymentDeadLetter>), OperatorError> {
    let (tenant, payment) = (tenant_id.as_uuid(), payment_id.as_uuid());
    let mut happened = status_changes(conn, tenant, payment).await?;
    happened.extend(webhooks(conn, tenant, payment).await?);
    happened.extend(deliveries(conn, tenant, payment).await?);
    let dead_letters = dead_letters(conn, tenant, payment).await?;
    let uncertain = sqlx::query_scalar!(
        "SELECT evidence FROM unknown_payments WHERE tenant_id = $1 AND payment_id = $2",
        tenant,
        payment,
    )
    .fetch_optional(&mut *conn)
    .await
    .context("cannot read what the reconciler learned of the payment")?;
    let evidence = dead_letters.iter().map(|d| &d.evidence).chain(uncertain.as_ref());
    happened.extend(evidence.filter_map(Value::as_array).flatten().filter_map(learned));
    happened.extend(dead_letters.iter().flat_map(dead_lettered));
    happened.extend(operator_actions(conn, payment).await?);
    happened.sort_by_key(|h| h.at);
    Ok((happened, dead_letters))
}

/// The payment's status changes, in order.
async fn status_changes(conn: &mut PgConnection, tenant: Uuid, payment: Uuid) -> Result<Vec<Happened>, OperatorError> {
    let events = sqlx::query!(
        r#"
        SELECT from_status::text AS "from_status?", to_status::text AS "to_status!", actor, reason, created_at
        FROM payment_events WHERE tenant_id = $1 AND payment_id = $2 ORDER BY seq LIMIT $3
        "#,
        tenant,
        payment,
        TIMELINE_ROWS,
    )
    .fetch_all(&mut *conn)
    .await
    .context("cannot read the payment's history")?;
    let happened = events.into_iter().map(|e| {
        let what = match e.from_status {
            None => format!("accepted as {}: {}", e.to_status, e.reason),
            Some(from) => format!("{from} → {}: {}", e.to_status, e.reason),
        };
        Happened { at: e.created_at, source: "status", by: e.actor, what }
    });
    Ok(happened.collect())
}

/// The webhooks received for the payment, in order.
async fn webhooks(conn: &mut PgConnection, tenant: Uuid, payment: Uuid) -> Result<Vec<Happened>, OperatorError> {
    let webhooks = sqlx::query!(
        r#"
        SELECT event_type, provider_charge_id, outcome, received_at FROM webhook_events
        WHERE tenant_id = $1 AND payment_id = $2 ORDER BY received_at LIMIT $3
        "#,
        tenant,
        payment,
        TIMELINE_ROWS,
    )
    .fetch_all(&mut *conn)
    .await
    .context("cannot read the payment's webhooks")?;
    let happened = webhooks.into_iter().map(|w| {
        let charge = w.provider_charge_id.map(|id| format!(" for charge {id}")).unwrap_or_default();
        let what = format!("webhook {}{charge}: {}", w.event_type, w.outcome);
        Happened { at: w.received_at, source: "webhook", by: "provider".into(), what }
    });
    Ok(happened.collect())
}

/// The events the payment's changes (its refunds' included) sent the merchant: each delivery when it
/// was queued, with where it stands, and each of its attempts, in order.
async fn deliveries(conn: &mut PgConnection, tenant: Uuid, payment: Uuid) -> Result<Vec<Happened>, OperatorError> {
    let deliveries = sqlx::query!(
        r#"
        SELECT e.type, e.created_at, p.url, d.state, d.attempts,
               a.attempted_at AS "attempted_at?", a.worker AS "worker?", a.status AS "status?",
               a.error AS "error?"
        FROM merchant_events e
        JOIN merchant_deliveries d ON d.tenant_id = e.tenant_id AND d.event_id = e.event_id
        JOIN merchant_endpoints p ON p.tenant_id = d.tenant_id AND p.endpoint_id = d.endpoint_id
        LEFT JOIN merchant_delivery_all_attempts a
          ON a.tenant_id = d.tenant_id AND a.endpoint_id = d.endpoint_id AND a.event_id = d.event_id
        WHERE e.tenant_id = $1 AND e.payment_id = $2
        ORDER BY e.event_order, p.endpoint_id, a.attempted_at
        LIMIT $3
        "#,
        tenant,
        payment,
        TIMELINE_ROWS,
    )
    .fetch_all(&mut *conn)
    .await
    .context("cannot read the payment's events to the merchant")?;
    let mut happened = Vec::new();
    let mut last: Option<(String, OffsetDateTime, String)> = None;
    for d in deliveries {
        let this = (d.r#type.clone(), d.created_at, d.url.clone());
        if last.as_ref() != Some(&this) {
            let state = d.state.replace('_', "-");
            let what = format!("event {} queued for {}: {state} ({} attempts)", d.r#type, d.url, d.attempts);
            happened.push(Happened { at: d.created_at, source: "event", by: "oncepay".into(), what });
            last = Some(this);
        }
        if let (Some(at), Some(worker)) = (d.attempted_at, d.worker) {
            let answer = match (d.status, d.error) {
                (Some(status), _) => format!("answered {status}"),
                (None, error) => error.unwrap_or_else(|| "no answer".into()),
            };
            let what = format!("event {} sent to {}: {answer}", d.r#type, d.url);
            happened.push(Happened { at, source: "event", by: format!("worker {worker}"), what });
        }
    }
    Ok(happened)
}

/// The payment's dead letters, newest first.
async fn dead_letters(
    conn: &mut PgConnection,
    tenant: Uuid,
    payment: Uuid,
) -> Result<Vec<PaymentDeadLetter>, OperatorError> {
    let dead_letters = sqlx::query_as!(
        PaymentDeadLetter,
        r#"
        SELECT kind, evidence, reason, created_at, resolved_at, resolved_by, resolution, resolution_note
        FROM dead_letters
        WHERE tenant_id = $1 AND payment_id = $2 ORDER BY created_at DESC LIMIT $3
        "#,
        tenant,
        payment,
        TIMELINE_ROWS,
    )
    .fetch_all(&mut *conn)
    .await
    .context("cannot read the payment's dead letters")?;
    Ok(dead_letters)
}

/// A dead letter as lines of the timeline: made, and closed if an operator closed it.
fn dead_lettered(d: &PaymentDeadLetter) -> Vec<Happened> {
    let what = format!("dead-lettered ({}): {}", d.kind, d.reason);
    let mut happened = vec![Happened { at: d.created_at, source: "dead letter", by: "reconciler".into(), what }];
    if let (Some(at), Some(by), Some(resolution)) = (d.resolved_at, &d.resolved_by, &d.resolution) {
        let note = d.resolution_note.as_deref().unwrap_or_default();
        let what = format!("dead letter closed as {resolution}: {note}");
        happened.push(Happened { at, source: "dead letter", by: by.clone(), what });
    }
    happened
}

/// The operators' actions on the payment (not their reads), in order.
async fn operator_actions(conn: &mut PgConnection, payment: Uuid) -> Result<Vec<Happened>, OperatorError> {
    let actions = sqlx::query!(
        r#"
        SELECT at, operator_name, action, outcome, reason FROM operator_audit
        WHERE payment_id = $1 AND action <> 'payment.read' ORDER BY audit_id LIMIT $2
        "#,
        payment,
        TIMELINE_ROWS,
    )
    .fetch_all(&mut *conn)
    .await
    .context("cannot read the operators' actions on the payment")?;
    let happened = actions.into_iter().map(|a| {
        let reason = a.reason.map(|reason| format!(": {reason}")).unwrap_or_default();
        let what = format!("{} ({}){reason}", a.action, a.outcome);
        Happened { at: a.at, source: "operator", by: a.operator_name, what }
    });
    Ok(happened.collect())
}

/// A piece of evidence the reconciler gathered (`unknown::evidence`: `at`, `source`, and an
/// `attempt` with its `result` or the `charge` found), as a line of the timeline.
fn learned(item: &Value) -> Option<Happened> {
    let at = OffsetDateTime::parse(item.get("at")?.as_str()?, &time::format_description::well_known::Rfc3339).ok()?;
    let source = item.get("source").and_then(Value::as_str).unwrap_or("reconciler");
    let attempt = item.get("attempt").and_then(Value::as_i64).map(|n| format!(" {n}")).unwrap_or_default();
    let found = match (item.get("charge"), item.get("result")) {
        (Some(charge), _) => format!(
            "the provider reports charge {} {} ({} {})",
            charge.get("id").and_then(Value::as_str).unwrap_or("?"),
            charge.get("status").and_then(Value::as_str).unwrap_or("?"),
            charge.get("amount").and_then(Value::as_i64).unwrap_or_default(),
            charge.get("currency").and_then(Value::as_str).unwrap_or("?"),
        ),
        (None, Some(result)) => result.as_str().map_or_else(|| result.to_string(), str::to_owned),
        (None, None) => item.to_string(),
    };
    Some(Happened { at, source: "lookup", by: format!("reconciler ({source}{attempt})"), what: found })
}

/// Why an endpoint is stopped when deliveries stopped it, not a person: it answered 410, or every
/// attempt failed for too long.
pub(super) const STOPPED_BY_DELIVERY: [&str; 2] = ["gone", "failing"];

/// A webhook endpoint, as the endpoints page shows it: never its secrets, which are not read.
#[derive(Debug)]
pub(super) struct EndpointRow {
    /// Its tenant's name.
    pub(super) tenant: String,
    pub(super) endpoint_id: Uuid,
    pub(super) url: String,
    pub(super) description: String,
    /// The types it takes; empty for every type.
    pub(super) event_types: Vec<String>,
    pub(super) enabled: bool,
    /// Why it is stopped: `gone`, `failing` or `merchant`.
    pub(super) disabled_reason: Option<String>,
    pub(super) disabled_at: Option<OffsetDateTime>,
    /// Since when every attempt has failed.
    pub(super) failing_since: Option<OffsetDateTime>,
    /// Its deliveries that wait to be sent.
    pub(super) pending: i64,
    /// Its deliveries whose retries are spent.
    pub(super) dead_lettered: i64,
}

/// The webhook endpoints of `tenants`, by tenant name, then oldest first. The counts walk the
/// partial indexes of pending and of dead-lettered deliveries.
pub(super) async fn endpoints(conn: &mut PgConnection, tenants: &[Uuid]) -> Result<Vec<EndpointRow>, OperatorError> {
    let endpoints = sqlx::query_as!(
        EndpointRow,
        r#"
        SELECT t.name AS tenant, p.endpoint_id, p.url, p.description, p.event_types, p.enabled, p.disabled_reason,
               p.disabled_at, p.failing_since,
               (SELECT count(*) FROM merchant_deliveries d
                WHERE d.tenant_id = p.tenant_id AND d.endpoint_id = p.endpoint_id AND d.state = 'pending') AS "pending!",
               (SELECT count(*) FROM merchant_deliveries d
                WHERE d.tenant_id = p.tenant_id AND d.endpoint_id = p.endpoint_id
                  AND d.state = 'dead_lettered') AS "dead_lettered!"
        FROM merchant_endpoints p
        JOIN tenants t ON t.tenant_id = p.tenant_id
        WHERE p.tenant_id = ANY ($1)
        ORDER BY t.name, p.created_at, p.endpoint_id
        "#,
        tenants,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the webhook endpoints")?;
    Ok(endpoints)
}

/// How many of `tenants`' endpoints deliveries stopped ([`STOPPED_BY_DELIVERY`]).
pub(super) async fn stopped_endpoints(conn: &mut PgConnection, tenants: &[Uuid]) -> Result<i64, OperatorError> {
    let stopped = sqlx::query_scalar!(
        r#"
        SELECT count(*) AS "stopped!" FROM merchant_endpoints
        WHERE tenant_id = ANY ($1) AND disabled_reason = ANY ($2)
        "#,
        tenants,
        &STOPPED_BY_DELIVERY as &[&str],
    )
    .fetch_one(conn)
    .await
    .context("cannot count the stopped webhook endpoints")?;
    Ok(stopped)
}

/// An event a payment's changes (its refunds' included) sent the merchant, with how its deliveries
/// stand.
#[derive(Debug)]
pub(super) struct PaymentEvent {
    pub(super) event_id: Uuid,
    pub(super) event_type: String,
    pub(super) created_at: OffsetDateTime,
    pub(super) delivered: i64,
    pub(super) pending: i64,
    pub(super) dead_lettered: i64,
}

/// The events of a payment, in order.
pub(super) async fn payment_events(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Vec<PaymentEvent>, OperatorError> {
    let events = sqlx::query_as!(
        PaymentEvent,
        r#"
        SELECT e.event_id, e.type AS event_type, e.created_at,
               count(d.event_id) FILTER (WHERE d.state = 'delivered') AS "delivered!",
               count(d.event_id) FILTER (WHERE d.state = 'pending') AS "pending!",
               count(d.event_id) FILTER (WHERE d.state = 'dead_lettered') AS "dead_lettered!"
        FROM merchant_events e
        LEFT JOIN merchant_deliveries d ON d.tenant_id = e.tenant_id AND d.event_id = e.event_id
        WHERE e.tenant_id = $1 AND e.payment_id = $2
        GROUP BY e.tenant_id, e.event_id
        ORDER BY e.event_order
        LIMIT $3
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
        TIMELINE_ROWS,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the payment's events to the merchant")?;
    Ok(events)
}
