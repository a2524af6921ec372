//! Events to merchants, written in the transaction of the change they tell of and queued there for
//! each of the tenant's enabled endpoints that asked for their type (migration 0460).
//!
//! [`crate::transitions`] and [`crate::refunds::settling`] call [`of_payments`] and [`of_refund`]
//! with every change they persist; the change decides whether there is an event
//! ([`EventType::of_payment_change`]). The worker delivers what is queued
//! ([`crate::merchant_deliveries`]).

use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use oncepay_domain::ids::TenantId;
use oncepay_domain::merchant_event::{ChangeData, EventType};
use oncepay_domain::payment::PaymentResource;
use oncepay_domain::refund::RefundResource;
use oncepay_domain::refund_status::RefundStatus;
use oncepay_domain::status::PaymentStatus;

use crate::StoreError;
use crate::merchant_deliveries::{ClaimedDelivery, WriterLease};
use crate::merchant_endpoints::Endpoint;
use crate::payments::Payment;
use crate::refunds::Refund;

/// One event to write.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// What it tells of.
    pub event_type: EventType,
    /// The payment it is about, if any (a refund's payment for a refund's event).
    pub payment_id: Option<Uuid>,
    /// The refund it is about, if any.
    pub refund_id: Option<Uuid>,
    /// The change's place in its resource's history.
    pub sequence: Option<i32>,
    /// The body's `data`.
    pub data: Value,
}

impl NewEvent {
    /// The event of `payment`'s move from `previous`, as it now is, if the move makes one.
    pub fn of_payment(payment: &Payment, previous: PaymentStatus) -> Result<Option<Self>, StoreError> {
        let Some(event_type) = EventType::of_payment_change(previous, payment.status) else {
            return Ok(None);
        };
        let data = ChangeData {
            resource: PaymentResource::from(payment),
            sequence: payment.event_count,
            previous_status: previous,
        };
        Ok(Some(Self {
            event_type,
            payment_id: Some(payment.payment_id.as_uuid()),
            refund_id: None,
            sequence: Some(payment.event_count),
            data: to_value(&data)?,
        }))
    }

    /// The event of `refund`'s move from `previous`, as it now is, if the move makes one.
    pub fn of_refund(refund: &Refund, previous: RefundStatus) -> Result<Option<Self>, StoreError> {
        let Some(event_type) = EventType::of_refund_change(previous, refund.status) else {
            return Ok(None);
        };
        let data = ChangeData {
            resource: RefundResource::from(refund),
            sequence: refund.event_count,
            previous_status: previous,
        };
        Ok(Some(Self {
            event_type,
            payment_id: Some(refund.payment_id.as_uuid()),
            refund_id: Some(refund.refund_id.as_uuid()),
            sequence: Some(refund.event_count),
            data: to_value(&data)?,
        }))
    }
}

fn to_value(data: &impl Serialize) -> Result<Value, StoreError> {
    serde_json::to_value(data).map_err(|e| StoreError::Unexpected(sqlx::Error::Encode(Box::new(e)).into()))
}

/// Writes the events of moved payments, each moved from the status paired with it, in the caller's
/// transaction: one statement for any number. The caller holds every payment's row lock (it has
/// just updated the row), which keeps a payment's events in the order of their commits.
///
/// With a `lease`, the caller is a worker that sends what it queues itself: each delivery it may
/// send at once is queued leased to it ([`WriterLease`]) and returned, as a claim would return it,
/// so that it needs no claim (BENCHMARKS.md, "Events to merchants"). The others are queued for a
/// claim, as [`write()`] queues them.
pub async fn of_payments(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    moved: &[(&Payment, PaymentStatus)],
    lease: Option<&WriterLease<'_>>,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    let mut events = Vec::with_capacity(moved.len());
    for (payment, previous) in moved {
        events.extend(NewEvent::of_payment(payment, *previous)?);
    }
    write_for(conn, tenant_id, &events, None, lease).await.map(|(_, leased)| leased)
}

/// Writes the event of a moved refund, if the move makes one, in the caller's transaction. Takes
/// the payment's row lock first, as every payment event's writer holds it, so that a payment's
/// events, its refunds' included, are in the order of their commits.
pub async fn of_refund(conn: &mut PgConnection, refund: &Refund, previous: RefundStatus) -> Result<(), StoreError> {
    let Some(event) = NewEvent::of_refund(refund, previous)? else {
        return Ok(());
    };
    sqlx::query!(
        "SELECT 1 AS locked FROM payments WHERE tenant_id = $1 AND payment_id = $2 FOR NO KEY UPDATE",
        refund.tenant_id.as_uuid(),
        refund.payment_id.as_uuid(),
    )
    .fetch_optional(&mut *conn)
    .await?;
    write(conn, refund.tenant_id, &[event]).await
}

/// Writes `events` and queues each for the tenant's enabled endpoints that take its type, in one
/// statement, in the caller's transaction.
pub async fn write(conn: &mut PgConnection, tenant_id: TenantId, events: &[NewEvent]) -> Result<(), StoreError> {
    write_for(conn, tenant_id, events, None, None).await.map(|_| ())
}

/// Writes an `endpoint.test` event, queued for `endpoint` alone whatever types it takes, if it is
/// enabled; returns the event's id, which its delivery carries as `webhook-id`.
pub async fn send_test(conn: &mut PgConnection, endpoint: &Endpoint) -> Result<Uuid, StoreError> {
    let data = serde_json::json!({ "endpoint_id": endpoint.endpoint_id, "message": "a test event, sent because you asked for one" });
    let event =
        NewEvent { event_type: EventType::EndpointTest, payment_id: None, refund_id: None, sequence: None, data };
    let (ids, _) = write_for(conn, endpoint.tenant_id, &[event], Some(endpoint.endpoint_id), None).await?;
    ids.into_iter().next().ok_or_else(|| StoreError::Unexpected(sqlx::Error::RowNotFound.into()))
}

/// [`write()`], queuing for `only` alone (whatever types it takes) when it is given, and leasing what
/// `lease` may take; returns the events' ids and the deliveries leased.
///
/// A delivery is leased only if a claim could take it at that moment: its payment has no earlier
/// event pending for the endpoint (nor an earlier one among `events`), and the endpoint has room
/// under `per_endpoint` for it beside those leased already and the ones queued before it here.
async fn write_for(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    events: &[NewEvent],
    only: Option<Uuid>,
    lease: Option<&WriterLease<'_>>,
) -> Result<(Vec<Uuid>, Vec<ClaimedDelivery>), StoreError> {
    if events.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let ids: Vec<Uuid> = events.iter().map(|_| Uuid::now_v7()).collect();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let payment_ids: Vec<Option<Uuid>> = events.iter().map(|e| e.payment_id).collect();
    let refund_ids: Vec<Option<Uuid>> = events.iter().map(|e| e.refund_id).collect();
    let sequences: Vec<Option<i32>> = events.iter().map(|e| e.sequence).collect();
    let data: Vec<Value> = events.iter().map(|e| e.data.clone()).collect();
    let leased = sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO merchant_events (tenant_id, event_id, type, payment_id, refund_id, sequence, data)
            SELECT $1, e.event_id, e.type, e.payment_id, e.refund_id, e.sequence, e.data
            FROM unnest($2::uuid[], $3::text[], $4::uuid[], $5::uuid[], $6::int4[], $7::jsonb[])
                WITH ORDINALITY AS e(event_id, type, payment_id, refund_id, sequence, data, place)
            ORDER BY e.place
            RETURNING event_id, type, payment_id, event_order, created_at
        ), queued AS (
            SELECT w.event_id, w.payment_id, w.event_order, w.type, w.created_at, p.endpoint_id, p.url, p.secret,
                   CASE WHEN p.previous_secret_until > now() THEN p.previous_secret END AS previous_secret,
                   t.name AS tenant_name,
                   row_number() OVER (PARTITION BY p.endpoint_id, w.payment_id ORDER BY w.event_order) AS of_payment,
                   row_number() OVER (PARTITION BY p.endpoint_id ORDER BY w.event_order) AS of_endpoint
            FROM written w
            JOIN merchant_endpoints p
              ON p.tenant_id = $1 AND p.enabled
                 AND CASE WHEN $8::uuid IS NULL THEN p.event_types = '{}' OR w.type = ANY (p.event_types)
                          ELSE p.endpoint_id = $8 END
            JOIN tenants t ON t.tenant_id = $1
        ), waiting AS (
            -- These payments' events still pending for the tenant's endpoints: what a later one
            -- waits for, by endpoint and payment through the in-order index. Read here, naming the
            -- tenant (as `leased` is), not in a subquery per delivery of `leasable`: under Citus
            -- each of these runs on the tenant's shard, and this statement is tested there.
            SELECT DISTINCT e.endpoint_id, e.payment_id
            FROM merchant_deliveries e
            WHERE e.tenant_id = $1 AND e.state = 'pending'
              AND (e.endpoint_id, e.payment_id) IN (SELECT p.endpoint_id, x.payment_id
                                                   FROM merchant_endpoints p, unnest($4::uuid[]) AS x(payment_id)
                                                   WHERE p.tenant_id = $1 AND $12::int8 > 0)
        ), leased AS (
            SELECT l.endpoint_id, count(*) AS n FROM merchant_deliveries l
            WHERE l.tenant_id = $1 AND l.state = 'pending' AND l.locked_until > now() AND $12::int8 > 0
            GROUP BY l.endpoint_id
        ), leasable AS (
            -- What a claim could take now: the first of its payment's events here, with none
            -- pending before it, and room at its endpoint beside the ones leased and those queued
            -- before it here. `now()` here, not in the INSERT's `CASE`, which Citus refuses (as in
            -- the record).
            SELECT q.endpoint_id, q.event_id, now() + make_interval(secs => $10::float8) AS locked_until,
                   row_number() OVER (ORDER BY q.event_order) AS place
            FROM queued q
            LEFT JOIN waiting wt ON wt.endpoint_id = q.endpoint_id AND wt.payment_id = q.payment_id
            LEFT JOIN leased l ON l.endpoint_id = q.endpoint_id
            WHERE $12::int8 > 0
              AND (q.payment_id IS NULL OR q.of_payment = 1 AND wt.payment_id IS NULL)
              AND q.of_endpoint + COALESCE(l.n, 0) <= $11::int8
        ), inserted AS (
            INSERT INTO merchant_deliveries
                (tenant_id, endpoint_id, event_id, payment_id, event_order, locked_by, locked_until, fencing_token)
            SELECT $1, q.endpoint_id, q.event_id, q.payment_id, q.event_order,
                   CASE WHEN l.event_id IS NOT NULL THEN $9::text END, l.locked_until,
                   CASE WHEN l.event_id IS NOT NULL THEN 1 ELSE 0 END
            FROM queued q
            LEFT JOIN leasable l ON l.endpoint_id = q.endpoint_id AND l.event_id = q.event_id AND l.place <= $12::int8
            RETURNING endpoint_id, event_id, fencing_token, locked_by
        )
        SELECT i.endpoint_id AS "endpoint_id!", i.event_id AS "event_id!", i.fencing_token AS "fencing_token!",
               q.type AS "event_type!", q.created_at AS "created_at!", q.url AS "url!", q.secret AS "secret!",
               q.previous_secret, q.tenant_name AS "tenant_name!"
        FROM inserted i
        JOIN queued q ON q.endpoint_id = i.endpoint_id AND q.event_id = i.event_id
        WHERE i.locked_by IS NOT NULL
        "#,
        tenant_id.as_uuid(),
        &ids,
        &types as &[&str],
        &payment_ids as &[Option<Uuid>],
        &refund_ids as &[Option<Uuid>],
        &sequences as &[Option<i32>],
        &data,
        only,
        lease.map(|l| l.worker),
        lease.map_or(0.0, |l| l.lease.as_secs_f64()),
        i64::from(lease.map_or(0, |l| l.per_endpoint)),
        i64::from(lease.map_or(0, |l| l.limit)),
    )
    .fetch_all(conn)
    .await?;
    let leased = leased
        .into_iter()
        .map(|row| {
            let event = ids.iter().zip(events).find(|(id, _)| **id == row.event_id).map(|(_, event)| event);
            let event = event.ok_or_else(|| StoreError::Unexpected(sqlx::Error::RowNotFound.into()))?;
            Ok(ClaimedDelivery {
                tenant_id,
                tenant_name: row.tenant_name,
                endpoint_id: row.endpoint_id,
                event_id: row.event_id,
                fencing_token: row.fencing_token,
                attempts: 0,
                event_type: row.event_type,
                data: event.data.clone(),
                created_at: row.created_at,
                url: row.url,
                secrets: std::iter::once(row.secret).chain(row.previous_secret).collect(),
                more_due: false,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok((ids, leased))
}
