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
pub async fn of_payments(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    moved: &[(&Payment, PaymentStatus)],
) -> Result<(), StoreError> {
    let mut events = Vec::with_capacity(moved.len());
    for (payment, previous) in moved {
        events.extend(NewEvent::of_payment(payment, *previous)?);
    }
    write(conn, tenant_id, &events).await
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
    write_for(conn, tenant_id, events, None).await.map(|_| ())
}

/// Writes an `endpoint.test` event, queued for `endpoint` alone whatever types it takes, if it is
/// enabled; returns the event's id, which its delivery carries as `webhook-id`.
pub async fn send_test(conn: &mut PgConnection, endpoint: &Endpoint) -> Result<Uuid, StoreError> {
    let data = serde_json::json!({ "endpoint_id": endpoint.endpoint_id, "message": "a test event, sent because you asked for one" });
    let event =
        NewEvent { event_type: EventType::EndpointTest, payment_id: None, refund_id: None, sequence: None, data };
    let ids = write_for(conn, endpoint.tenant_id, &[event], Some(endpoint.endpoint_id)).await?;
    ids.into_iter().next().ok_or_else(|| StoreError::Unexpected(sqlx::Error::RowNotFound.into()))
}

/// [`write`], queuing for `only` alone (whatever types it takes) when it is given; returns the
/// events' ids.
async fn write_for(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    events: &[NewEvent],
    only: Option<Uuid>,
) -> Result<Vec<Uuid>, StoreError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = events.iter().map(|_| Uuid::now_v7()).collect();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let payment_ids: Vec<Option<Uuid>> = events.iter().map(|e| e.payment_id).collect();
    let refund_ids: Vec<Option<Uuid>> = events.iter().map(|e| e.refund_id).collect();
    let sequences: Vec<Option<i32>> = events.iter().map(|e| e.sequence).collect();
    let data: Vec<Value> = events.iter().map(|e| e.data.clone()).collect();
    sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO merchant_events (tenant_id, event_id, type, payment_id, refund_id, sequence, data)
            SELECT $1, e.event_id, e.type, e.payment_id, e.refund_id, e.sequence, e.data
            FROM unnest($2::uuid[], $3::text[], $4::uuid[], $5::uuid[], $6::int4[], $7::jsonb[])
                WITH ORDINALITY AS e(event_id, type, payment_id, refund_id, sequence, data, place)
            ORDER BY e.place
            RETURNING event_id, type, payment_id, event_order
        )
        INSERT INTO merchant_deliveries (tenant_id, endpoint_id, event_id, payment_id, event_order)
        SELECT $1, p.endpoint_id, w.event_id, w.payment_id, w.event_order
        FROM written w
        JOIN merchant_endpoints p
          ON p.tenant_id = $1 AND p.enabled
             AND CASE WHEN $8::uuid IS NULL THEN p.event_types = '{}' OR w.type = ANY (p.event_types)
                      ELSE p.endpoint_id = $8 END
        "#,
        tenant_id.as_uuid(),
        &ids,
        &types as &[&str],
        &payment_ids as &[Option<Uuid>],
        &refund_ids as &[Option<Uuid>],
        &sequences as &[Option<i32>],
        &data,
        only,
    )
    .execute(conn)
    .await?;
    Ok(ids)
}
