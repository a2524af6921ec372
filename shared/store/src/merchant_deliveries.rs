//! Deliveries of events to merchants' endpoints: claimed by the worker under a lease and a fencing
//! token, as the outbox is, and recorded with every attempt.
//!
//! A claim takes due deliveries of enabled endpoints, at most `per_endpoint` leased at once for any
//! one endpoint (so one slow endpoint holds no worker hostage), and never a delivery while an
//! earlier event of the same payment is still pending for the same endpoint: a payment's events
//! reach an endpoint in order. A recording names the fencing token it was claimed with; one whose
//! lease was taken over writes nothing. A replay queues a delivery again, under the same
//! `webhook-id`.

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::Duration;

use serde_json::Value;
use sqlx::{Connection, PgConnection};
use time::OffsetDateTime;
use uuid::Uuid;

use oncepay_domain::ids::TenantId;
use oncepay_domain::merchant_event::EventType;
use oncepay_domain::webhook_endpoint::EndpointResource;

use crate::StoreError;
use crate::merchant_endpoints;
use crate::merchant_events::{self, NewEvent};

/// A delivery a worker holds.
#[derive(Clone)]
pub struct ClaimedDelivery {
    /// The endpoint's owner.
    pub tenant_id: TenantId,
    /// Its name: the first word of the routing key when the endpoint is an exchange.
    pub tenant_name: String,
    /// The endpoint.
    pub endpoint_id: Uuid,
    /// The event: also the `webhook-id`, the same on every attempt and replay.
    pub event_id: Uuid,
    /// The token the recording must still match.
    pub fencing_token: i64,
    /// Attempts made before this one since the delivery was queued or replayed.
    pub attempts: i32,
    /// The event's type.
    pub event_type: String,
    /// The event's `data`.
    pub data: Value,
    /// When the event was written.
    pub created_at: OffsetDateTime,
    /// Where to send it.
    pub url: String,
    /// The secrets to sign with: the current one, and the previous one during a rotation.
    pub secrets: Vec<String>,
    /// Whether the endpoint had more deliveries due than room for them when this one was claimed:
    /// one may be claimed when this one ends, without waiting for the next poll.
    pub more_due: bool,
}

impl std::fmt::Debug for ClaimedDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimedDelivery")
            .field("endpoint_id", &self.endpoint_id)
            .field("event_id", &self.event_id)
            .field("fencing_token", &self.fencing_token)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

/// A worker that queues deliveries and sends them itself: each one it may send at once is queued
/// leased to it, as a claim of `per_endpoint` would lease it, at most `limit` of them
/// ([`merchant_events::of_payments`]).
#[derive(Debug, Clone, Copy)]
pub struct WriterLease<'a> {
    /// The worker's name in leases.
    pub worker: &'a str,
    /// How long the deliveries stay leased.
    pub lease: Duration,
    /// Most deliveries leased at once to one endpoint, across all workers.
    pub per_endpoint: u32,
    /// Most deliveries to lease: the worker's free room.
    pub limit: u32,
}

/// The tenants with a delivery due to one of their enabled endpoints: whom the worker claims from.
/// Read-only and without locks: under Citus it reads every shard, which SCALING.md allows for the
/// scans that find who has work.
pub async fn due_tenants(conn: &mut PgConnection) -> Result<Vec<TenantId>, StoreError> {
    Ok(sqlx::query_scalar!(
        r#"
        SELECT DISTINCT p.tenant_id AS "tenant_id!: TenantId"
        FROM merchant_endpoints p
        WHERE p.enabled
          AND EXISTS (SELECT FROM merchant_deliveries d
                      WHERE d.tenant_id = p.tenant_id AND d.endpoint_id = p.endpoint_id
                        AND d.state = 'pending' AND d.next_attempt_at <= now())
        "#
    )
    .fetch_all(conn)
    .await?)
}

/// Claims up to `limit` of `tenant_id`'s due deliveries for `worker` for `lease`, at most
/// `per_endpoint` of any endpoint leased at once, oldest due first. One tenant per statement, so
/// that under Citus it runs on the tenant's shard alone (SCALING.md).
pub async fn claim(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    worker: &str,
    limit: u32,
    per_endpoint: u32,
    lease: Duration,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    let rows = sqlx::query!(
        r#"
        WITH leased AS (
            SELECT tenant_id, endpoint_id, count(*) AS n FROM merchant_deliveries
            WHERE tenant_id = $5 AND state = 'pending' AND locked_until > now()
            GROUP BY tenant_id, endpoint_id
        ), ranked AS (
            -- Each enabled endpoint's oldest due deliveries that wait for no earlier event of their
            -- payment, up to its cap, with its room.
            SELECT c.tenant_id, c.endpoint_id, c.event_id, c.next_attempt_at, c.place,
                   $3 - COALESCE(l.n, 0) AS room
            FROM merchant_endpoints p
            LEFT JOIN leased l ON l.tenant_id = p.tenant_id AND l.endpoint_id = p.endpoint_id
            CROSS JOIN LATERAL (
                SELECT d.tenant_id, d.endpoint_id, d.event_id, d.next_attempt_at,
                       row_number() OVER (ORDER BY d.next_attempt_at, d.event_order) AS place
                FROM merchant_deliveries d
                WHERE d.tenant_id = $5 AND d.endpoint_id = p.endpoint_id
                  AND d.state = 'pending' AND d.next_attempt_at <= now()
                  AND (d.locked_until IS NULL OR d.locked_until < now())
                  -- A scalar subquery, not NOT EXISTS: PostgreSQL evaluates it per delivery
                  -- walked, by the in-order index, and the walk stops at the limit. An anti-join
                  -- would compare every pending delivery with every other where the statistics
                  -- are stale (a new or just-restored table): seconds for ten thousand.
                  AND (SELECT e.event_order FROM merchant_deliveries e
                       WHERE e.tenant_id = $5 AND e.endpoint_id = d.endpoint_id
                         AND e.payment_id = d.payment_id AND e.state = 'pending'
                         AND e.event_order < d.event_order
                       ORDER BY e.event_order
                       LIMIT 1) IS NULL
                ORDER BY d.next_attempt_at, d.event_order
                -- One past the cap, to tell an endpoint with more due than room.
                LIMIT $3::int8 + 1
            ) c
            WHERE p.tenant_id = $5 AND p.enabled
        ), candidates AS (
            -- As many as each endpoint has room for.
            SELECT tenant_id, endpoint_id, event_id, next_attempt_at FROM ranked WHERE place <= room
        ), crowded AS (
            -- Endpoints with more due than room: the next claim may find more once one ends.
            SELECT DISTINCT tenant_id, endpoint_id FROM ranked WHERE place > room
        ), due AS (
            SELECT d.tenant_id, d.endpoint_id, d.event_id
            FROM merchant_deliveries d
            JOIN candidates c USING (tenant_id, endpoint_id, event_id)
            -- Still due once locked. Not `state = 'pending'`: that would let PostgreSQL look each
            -- candidate up through the pending deliveries' index, walking every entry of the
            -- endpoint before it, dead ones included, rather than by the primary key. On a copy
            -- with five thousand deliveries just delivered, that read three times the pages.
            WHERE d.tenant_id = $5 AND d.state NOT IN ('delivered', 'dead_lettered')
              AND (d.locked_until IS NULL OR d.locked_until < now())
            ORDER BY c.next_attempt_at
            LIMIT $2
            FOR UPDATE OF d SKIP LOCKED
        ), claimed AS (
            UPDATE merchant_deliveries d
            SET locked_by = $1, locked_until = now() + make_interval(secs => $4),
                fencing_token = d.fencing_token + 1, updated_at = now()
            FROM due
            WHERE d.tenant_id = $5 AND d.endpoint_id = due.endpoint_id AND d.event_id = due.event_id
            RETURNING d.tenant_id, d.endpoint_id, d.event_id, d.fencing_token, d.attempts
        )
        SELECT c.tenant_id AS "tenant_id!: TenantId", c.endpoint_id AS "endpoint_id!", c.event_id AS "event_id!",
               c.fencing_token AS "fencing_token!", c.attempts AS "attempts!",
               ev.type AS "event_type!", ev.data AS "data!", ev.created_at AS "created_at!",
               p.url AS "url!", p.secret AS "secret!",
               CASE WHEN p.previous_secret_until > now() THEN p.previous_secret END AS previous_secret,
               t.name AS "tenant_name!",
               EXISTS (SELECT FROM crowded r WHERE r.tenant_id = c.tenant_id AND r.endpoint_id = c.endpoint_id)
                   AS "more_due!"
        FROM claimed c
        JOIN merchant_events ev ON ev.tenant_id = $5 AND ev.event_id = c.event_id
        JOIN merchant_endpoints p ON p.tenant_id = $5 AND p.endpoint_id = c.endpoint_id
        JOIN tenants t ON t.tenant_id = $5
        "#,
        worker,
        i64::from(limit),
        i64::from(per_endpoint),
        lease.as_secs_f64(),
        tenant_id.as_uuid(),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| ClaimedDelivery {
            tenant_id: row.tenant_id,
            tenant_name: row.tenant_name,
            endpoint_id: row.endpoint_id,
            event_id: row.event_id,
            fencing_token: row.fencing_token,
            attempts: row.attempts,
            event_type: row.event_type,
            data: row.data,
            created_at: row.created_at,
            url: row.url,
            secrets: std::iter::once(row.secret).chain(row.previous_secret).collect(),
            more_due: row.more_due,
        })
        .collect())
}

/// One attempt, as the worker saw it.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// When it was sent.
    pub attempted_at: OffsetDateTime,
    /// The status the endpoint answered, if it answered.
    pub status: Option<u16>,
    /// The first bytes of the response body.
    pub response: String,
    /// What went wrong, if anything did.
    pub error: Option<String>,
}

/// What becomes of a delivery after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The endpoint took it.
    Delivered,
    /// Try again this long after now.
    RetryIn(Duration),
    /// The schedule is spent: the delivery is dead-lettered, with its attempts.
    DeadLetter,
}

/// What recording an attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// Recorded.
    Recorded {
        /// Whether this attempt disabled its endpoint (`gone`, or failing for too long).
        disabled: bool,
    },
    /// The lease was taken over: another worker owns the delivery now, and nothing was written.
    LeaseLost,
}

/// How an endpoint's health follows an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// It answered 2xx.
    Took,
    /// It failed; it is disabled as `failing` once it has failed for `disable_after`.
    Failed {
        /// How long an endpoint may fail before it is disabled.
        disable_after: Duration,
    },
    /// It answered 410: it is disabled as `gone` at once.
    Gone,
}

/// An attempt to record: the delivery it was of, the attempt, and what follows from it.
#[derive(Debug, Clone)]
pub struct Record {
    /// The delivery, as claimed.
    pub claimed: ClaimedDelivery,
    /// The attempt.
    pub attempt: Attempt,
    /// What becomes of the delivery.
    pub next: Next,
    /// How the endpoint's health follows.
    pub health: Health,
}

/// Records `records` by `worker` in one transaction: each attempt, what becomes of its delivery,
/// and its endpoint's health; one [`Recording`] per record, in order. An endpoint an attempt
/// disables sends `endpoint.disabled` to the tenant's other endpoints.
///
/// A record whose claim was taken over writes nothing ([`Recording::LeaseLost`]). The worker records
/// one endpoint's attempts together, so that a transaction locks at most one endpoint row.
pub async fn record(conn: &mut PgConnection, worker: &str, records: &[Record]) -> Result<Vec<Recording>, StoreError> {
    if records.is_empty() {
        return Ok(Vec::new());
    }
    // Not waiting for the disk: a record lost in a crash only means the delivery is claimed and
    // sent again once its lease runs out, which at-least-once delivery allows, and never out of
    // order, since the claim of the payment's next event is written (and flushed) after this record.
    // Every attempt waited for its own flush before, and the deliveries' commits outnumbered the
    // payments'. Set with the `BEGIN`, in the same round trip.
    let mut tx = conn.begin_with("BEGIN; SET LOCAL synchronous_commit = off").await?;
    // One statement per tenant among them, so that each names its shard under Citus (SCALING.md);
    // the worker's batches are of one endpoint, so that is one statement.
    let mut tenants: Vec<TenantId> = records.iter().map(|r| r.claimed.tenant_id).collect();
    tenants.sort_unstable();
    tenants.dedup();
    let mut moved = HashSet::with_capacity(records.len());
    for tenant_id in tenants {
        let ours: Vec<&Record> = records.iter().filter(|r| r.claimed.tenant_id == tenant_id).collect();
        moved.extend(move_deliveries(&mut tx, tenant_id, worker, &ours).await?);
    }
    let mut recordings = Vec::with_capacity(records.len());
    for record in records {
        let claimed = &record.claimed;
        if !moved.contains(&(claimed.tenant_id.as_uuid(), claimed.endpoint_id, claimed.event_id, claimed.fencing_token))
        {
            recordings.push(Recording::LeaseLost);
            continue;
        }
        let attempted_at = record.attempt.attempted_at;
        let disabled = match record.health {
            Health::Took => false,
            Health::Gone => disable_if_due(&mut tx, claimed, attempted_at, "gone", None).await?,
            Health::Failed { disable_after } => {
                disable_if_due(&mut tx, claimed, attempted_at, "failing", Some(disable_after)).await?
            }
        };
        recordings.push(Recording::Recorded { disabled });
    }
    tx.commit().await?;
    Ok(recordings)
}

/// Moves each of `tenant_id`'s deliveries in `records` that `worker`'s claim still holds, and keeps
/// its attempt; the deliveries it moved, as (tenant, endpoint, event, fencing token).
async fn move_deliveries(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    worker: &str,
    records: &[&Record],
) -> Result<Vec<(Uuid, Uuid, Uuid, i64)>, StoreError> {
    let column = |f: fn(&Record) -> Uuid| records.iter().copied().map(f).collect::<Vec<Uuid>>();
    let tenants = column(|r| r.claimed.tenant_id.as_uuid());
    let endpoints = column(|r| r.claimed.endpoint_id);
    let events = column(|r| r.claimed.event_id);
    let tokens: Vec<i64> = records.iter().map(|r| r.claimed.fencing_token).collect();
    let states: Vec<&str> = records.iter().map(|r| state_after(r.next)).collect();
    let retry_in: Vec<f64> = records.iter().map(|r| retry_in(r.next)).collect();
    let attempted_at: Vec<OffsetDateTime> = records.iter().map(|r| r.attempt.attempted_at).collect();
    let statuses: Vec<Option<i32>> = records.iter().map(|r| r.attempt.status.map(i32::from)).collect();
    let responses: Vec<Cow<'_, str>> = records.iter().map(|r| storable(&r.attempt.response)).collect();
    let errors: Vec<Option<Cow<'_, str>>> = records.iter().map(|r| r.attempt.error.as_deref().map(storable)).collect();
    let responses: Vec<&str> = responses.iter().map(AsRef::as_ref).collect();
    let errors: Vec<Option<&str>> = errors.iter().map(Option::as_deref).collect();
    let took: Vec<bool> = records.iter().map(|r| matches!(r.health, Health::Took)).collect();
    // One statement moves each delivery this worker's claim still holds, keeps its attempt (in the
    // delivery's row when it delivered, in `merchant_delivery_attempts` otherwise), and after a
    // success clears the endpoint's failing streak: a batch costs one round trip.
    let moved = sqlx::query!(
        r#"
        WITH input AS (
            -- The times are worked out here, not in the UPDATE: Citus refuses `now()` inside a
            -- `CASE`, and a STABLE operator over a column, in a distributed UPDATE's SET.
            SELECT x.*, now() AS now, now() + make_interval(secs => x.retry_in) AS next_attempt_at
            FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::int8[], $5::text[], $6::float8[],
                        $7::timestamptz[], $8::int4[], $9::text[], $10::text[], $11::bool[])
                AS x(tenant_id, endpoint_id, event_id, fencing_token, state, retry_in, attempted_at,
                     status, response, error, took)
        ), moved AS (
            UPDATE merchant_deliveries d
            SET state = i.state, attempts = d.attempts + 1,
                next_attempt_at = i.next_attempt_at,
                delivered_at = CASE WHEN i.state = 'delivered' THEN i.now END,
                delivered_attempted_at = CASE WHEN i.state = 'delivered' THEN i.attempted_at END,
                delivered_by = CASE WHEN i.state = 'delivered' THEN $12 END,
                delivered_status = CASE WHEN i.state = 'delivered' THEN i.status END,
                delivered_response = CASE WHEN i.state = 'delivered' THEN i.response END,
                locked_by = NULL, locked_until = NULL, updated_at = i.now
            FROM input i
            WHERE d.tenant_id = $13 AND d.tenant_id = i.tenant_id AND d.endpoint_id = i.endpoint_id
              AND d.event_id = i.event_id
              AND d.fencing_token = i.fencing_token AND d.state = 'pending'
            RETURNING d.tenant_id, d.endpoint_id, d.event_id, d.fencing_token
        ), attempt AS (
            -- An attempt that delivered is kept in the delivery's row, above: most deliveries are
            -- one such attempt, and a row of its own cost each one more insert.
            INSERT INTO merchant_delivery_attempts
                (tenant_id, endpoint_id, event_id, attempted_at, worker, status, response, error)
            SELECT i.tenant_id, i.endpoint_id, i.event_id, i.attempted_at, $12, i.status, i.response, i.error
            FROM input i JOIN moved m USING (tenant_id, endpoint_id, event_id, fencing_token)
            WHERE i.state <> 'delivered'
        ), healed AS (
            UPDATE merchant_endpoints p SET failing_since = NULL
            FROM (SELECT DISTINCT i.tenant_id, i.endpoint_id
                  FROM input i JOIN moved m USING (tenant_id, endpoint_id, event_id, fencing_token)
                  WHERE i.took) h
            WHERE p.tenant_id = $13 AND p.tenant_id = h.tenant_id AND p.endpoint_id = h.endpoint_id
              AND p.failing_since IS NOT NULL
        )
        SELECT tenant_id AS "tenant_id!", endpoint_id AS "endpoint_id!", event_id AS "event_id!",
               fencing_token AS "fencing_token!"
        FROM moved
        "#,
        &tenants,
        &endpoints,
        &events,
        &tokens,
        &states as &[&str],
        &retry_in,
        &attempted_at,
        &statuses as &[Option<i32>],
        &responses as &[&str],
        &errors as &[Option<&str>],
        &took,
        worker,
        tenant_id.as_uuid(),
    )
    .fetch_all(conn)
    .await?;
    Ok(moved.into_iter().map(|m| (m.tenant_id, m.endpoint_id, m.event_id, m.fencing_token)).collect())
}

/// `text` as PostgreSQL's `text` can hold it: a NUL (valid UTF-8, which an endpoint may well answer)
/// becomes U+FFFD. Kept as it came, it would fail the whole record, and the delivery would be sent
/// again after every lease, never delivered nor dead-lettered.
fn storable(text: &str) -> Cow<'_, str> {
    if text.contains('\0') { Cow::Owned(text.replace('\0', "\u{fffd}")) } else { Cow::Borrowed(text) }
}

/// The delivery's state after an attempt that leads to `next`.
fn state_after(next: Next) -> &'static str {
    match next {
        Next::Delivered => "delivered",
        Next::RetryIn(_) => "pending",
        Next::DeadLetter => "dead_lettered",
    }
}

/// Seconds until the next attempt after one that leads to `next`: 0 when there is none.
fn retry_in(next: Next) -> f64 {
    match next {
        Next::RetryIn(delay) => delay.as_secs_f64(),
        Next::Delivered | Next::DeadLetter => 0.0,
    }
}

/// Marks the endpoint failing since `attempted_at` unless it already was, and disables it for
/// `reason` when it has failed for `disable_after` (at once when there is none); true if this call
/// disabled it (and wrote its `endpoint.disabled` event).
async fn disable_if_due(
    conn: &mut PgConnection,
    claimed: &ClaimedDelivery,
    attempted_at: OffsetDateTime,
    reason: &str,
    disable_after: Option<Duration>,
) -> Result<bool, StoreError> {
    let (tenant_id, endpoint_id) = (claimed.tenant_id.as_uuid(), claimed.endpoint_id);
    let disable_after = disable_after.map(|after| after.as_secs_f64());
    let disabled = sqlx::query_scalar!(
        r#"
        WITH verdict AS (
            -- `now()` here, not in the UPDATE's `CASE`, which Citus refuses (as in the record).
            SELECT now() AS now, COALESCE(failing_since, $3) AS failing_since,
                   enabled AND ($5::float8 IS NULL
                                OR COALESCE(failing_since, $3) <= now() - make_interval(secs => $5::float8)) AS disable
            FROM merchant_endpoints
            WHERE tenant_id = $1 AND endpoint_id = $2
            FOR UPDATE
        )
        UPDATE merchant_endpoints p
        SET failing_since = v.failing_since,
            enabled = p.enabled AND NOT v.disable,
            disabled_reason = CASE WHEN v.disable THEN $4 ELSE p.disabled_reason END,
            disabled_at = CASE WHEN v.disable THEN v.now ELSE p.disabled_at END,
            updated_at = CASE WHEN v.disable THEN v.now ELSE p.updated_at END
        FROM verdict v
        WHERE p.tenant_id = $1 AND p.endpoint_id = $2
        RETURNING v.disable AS "disabled!"
        "#,
        tenant_id,
        endpoint_id,
        attempted_at,
        reason,
        disable_after,
    )
    .fetch_optional(&mut *conn)
    .await?
    .unwrap_or(false);
    if disabled {
        let endpoint = merchant_endpoints::find(conn, claimed.tenant_id, claimed.endpoint_id)
            .await?
            .ok_or_else(|| StoreError::Unexpected(sqlx::Error::RowNotFound.into()))?;
        let data = serde_json::to_value(EndpointResource::from(&endpoint))
            .map_err(|e| StoreError::Unexpected(sqlx::Error::Encode(Box::new(e)).into()))?;
        let event = NewEvent {
            event_type: EventType::EndpointDisabled,
            payment_id: None,
            refund_id: None,
            sequence: None,
            data,
        };
        merchant_events::write(conn, claimed.tenant_id, &[event]).await?;
    }
    Ok(disabled)
}

/// What a replay queued again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replayed {
    /// Deliveries queued again, or queued for the first time to an endpoint that takes the event.
    pub deliveries: u64,
}

/// Queues `event_id` again for every enabled endpoint of the tenant that takes its type (or only
/// `endpoint_id`), whatever became of its earlier deliveries; `None` if the tenant has no such
/// event. A replay keeps the `webhook-id`, starts the retry schedule again and keeps the earlier
/// attempts.
pub async fn replay_event(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    event_id: Uuid,
    endpoint_id: Option<Uuid>,
) -> Result<Option<Replayed>, StoreError> {
    let mut tx = conn.begin().await?;
    // A delivered delivery keeps its successful attempt in its row, which the replay clears: the
    // attempt moves to `merchant_delivery_attempts` first. Every delivery the replay queues again
    // is locked until it commits, so a record committed meanwhile is seen here, and none commits
    // between the two statements.
    sqlx::query!(
        r#"
        WITH earlier AS (
            SELECT d.tenant_id, d.endpoint_id, d.event_id, d.delivered_attempted_at, d.delivered_by,
                   d.delivered_status, d.delivered_response
            FROM merchant_deliveries d
            JOIN merchant_events e ON e.tenant_id = d.tenant_id AND e.event_id = d.event_id
            JOIN merchant_endpoints p ON p.tenant_id = d.tenant_id AND p.endpoint_id = d.endpoint_id
            WHERE d.tenant_id = $1 AND d.event_id = $2
              AND p.enabled AND ($3::uuid IS NULL OR p.endpoint_id = $3)
              AND (p.event_types = '{}' OR e.type = ANY (p.event_types))
            FOR UPDATE OF d
        )
        INSERT INTO merchant_delivery_attempts (tenant_id, endpoint_id, event_id, attempted_at, worker, status, response)
        SELECT tenant_id, endpoint_id, event_id, delivered_attempted_at, delivered_by, delivered_status,
               delivered_response
        FROM earlier WHERE delivered_attempted_at IS NOT NULL
        "#,
        tenant_id.as_uuid(),
        event_id,
        endpoint_id,
    )
    .execute(&mut *tx)
    .await?;
    let queued = sqlx::query!(
        r#"
        WITH event AS (
            SELECT tenant_id, event_id, type, payment_id, event_order FROM merchant_events
            WHERE tenant_id = $1 AND event_id = $2
        ), queued AS (
            INSERT INTO merchant_deliveries (tenant_id, endpoint_id, event_id, payment_id, event_order)
            SELECT e.tenant_id, p.endpoint_id, e.event_id, e.payment_id, e.event_order
            FROM event e
            JOIN merchant_endpoints p
              ON p.tenant_id = e.tenant_id AND p.enabled AND ($3::uuid IS NULL OR p.endpoint_id = $3)
                 AND (p.event_types = '{}' OR e.type = ANY (p.event_types))
            ON CONFLICT (tenant_id, endpoint_id, event_id) DO UPDATE
            -- The new row's times (its defaults, `now()`): Citus takes no function here.
            SET state = 'pending', attempts = 0, next_attempt_at = EXCLUDED.next_attempt_at, delivered_at = NULL,
                delivered_attempted_at = NULL, delivered_by = NULL, delivered_status = NULL,
                delivered_response = NULL, updated_at = EXCLUDED.updated_at
            -- A delivery in flight keeps its lease; it is sent once more when it ends.
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM event) AS "found!", (SELECT count(*) FROM queued) AS "queued!"
        "#,
        tenant_id.as_uuid(),
        event_id,
        endpoint_id,
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((queued.found > 0).then_some(Replayed { deliveries: u64::try_from(queued.queued).unwrap_or(0) }))
}

/// Queues again every delivery to `endpoint_id` that was dead-lettered, of an event written at or
/// after `since`; `None` if the tenant has no such endpoint.
pub async fn replay_failed_since(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    endpoint_id: Uuid,
    since: OffsetDateTime,
) -> Result<Option<Replayed>, StoreError> {
    let counts = sqlx::query!(
        r#"
        WITH endpoint AS (
            SELECT endpoint_id FROM merchant_endpoints WHERE tenant_id = $1 AND endpoint_id = $2
        ), queued AS (
            UPDATE merchant_deliveries d
            SET state = 'pending', attempts = 0, next_attempt_at = now(), updated_at = now()
            FROM merchant_events e
            WHERE d.tenant_id = $1 AND d.endpoint_id = $2 AND d.state = 'dead_lettered'
              AND e.tenant_id = d.tenant_id AND e.event_id = d.event_id AND e.created_at >= $3
            RETURNING 1
        )
        SELECT (SELECT count(*) FROM endpoint) AS "found!", (SELECT count(*) FROM queued) AS "queued!"
        "#,
        tenant_id.as_uuid(),
        endpoint_id,
        since,
    )
    .fetch_one(conn)
    .await?;
    Ok((counts.found > 0).then_some(Replayed { deliveries: u64::try_from(counts.queued).unwrap_or(0) }))
}
