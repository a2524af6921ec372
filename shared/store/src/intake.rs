//! Intake: replaying a known idempotency key, or accepting a payment request under a new one, in one
//! round trip.
//!
//! [`accept`] runs `sql/accept.sql`, a call of the `intake` function
//! (`migrations/0060_intake_function.sql`, as `0200_provider_accounts.sql` redefines it). A new key is
//! written with its payment (`pending`), its outbox row and its first audit row in one statement, so
//! either all of it exists or none of it does ([`Intake::Created`]). A known key comes back with
//! nothing written, for the caller to replay or refuse ([`Intake::Existing`]).
//!
//! [`stored`] runs `sql/replay.sql`, the function's replay read on its own: what intake would return
//! for a known key, without taking part in a write. [`stored_many`] reads several keys of a tenant
//! that way in one statement (`sql/replay_group.sql`).
//!
//! The SQL lives in files so the benchmark runs the same statements under pgbench; `sql/replay.sql`
//! is also the benchmark's raw replay baseline.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::value::RawValue;
use sqlx::PgConnection;
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::idempotency_key::IdempotencyKey;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::payment_request::PaymentRequest;
use oncepay_domain::provider_ref::{PaymentMethod, ProviderAccount, ProviderCustomer};
use oncepay_domain::status::PaymentStatus;
use oncepay_service::telemetry::TraceContext;

use crate::StoreError;
use crate::payments::Payment;

/// A request to accept.
#[derive(Debug, Clone)]
pub struct NewPayment {
    /// The authenticated tenant.
    pub tenant_id: TenantId,
    /// The client's key.
    pub key: IdempotencyKey,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// The validated body.
    pub request: PaymentRequest,
    /// The provider account the payment is to be charged to: the tenant's connected account in
    /// connect mode, `None` (oncepay's own account) otherwise.
    pub provider_account: Option<ProviderAccount>,
    /// How long the key is kept after creation (at least; the reaper never removes a key whose
    /// payment is not terminal).
    pub retention: Duration,
    /// How long the key's write waits for another transaction writing the same key before it fails
    /// with `lock_not_available` (55P03). It travels with the call, so that it holds wherever the
    /// call runs: on Citus, on the node of the tenant's shards. `None`: the session's `lock_timeout`.
    pub lock_wait: Option<Duration>,
    /// The trace the request belongs to, for the worker to continue.
    pub trace: Option<TraceContext>,
}

/// A freshly accepted payment.
#[derive(Debug, Clone)]
pub struct Created {
    /// The new payment, `pending`.
    pub payment: Payment,
    /// When its key may be reaped.
    pub key_expires_at: OffsetDateTime,
}

/// A key that already exists.
#[derive(Debug, Clone)]
pub struct ExistingKey {
    /// The fingerprint of the request that created it.
    pub fingerprint: Fingerprint,
    /// The payment it created.
    pub payment_id: PaymentId,
    /// When it may be reaped.
    pub expires_at: OffsetDateTime,
    /// The terminal response, once the payment is terminal: status and body, the JSON text as
    /// stored (a replay sends it on without parsing it into values and writing it out again).
    pub stored_response: Option<(u16, Box<RawValue>)>,
}

/// What intake found or did.
#[derive(Debug, Clone)]
pub enum Intake {
    /// The key was new: the payment is accepted (boxed: a whole payment row, much larger than a key).
    Created(Box<Created>),
    /// The key exists: nothing was written.
    Existing(ExistingKey),
}

impl Intake {
    /// The accepted payment, if this request created it.
    pub fn created(self) -> Option<Created> {
        match self {
            Self::Created(created) => Some(*created),
            Self::Existing(_) => None,
        }
    }
}

/// Accepts a payment and wakes the workers when it commits, or returns the key as it exists.
///
/// A key that a concurrent request committed meanwhile is waited for and read again inside the
/// function, so every concurrent duplicate names the same payment.
#[tracing::instrument(name = "store.intake", skip_all, fields(tenant.id = %new.tenant_id))]
pub async fn accept(conn: &mut PgConnection, new: &NewPayment) -> Result<Intake, StoreError> {
    intake(conn, new, true).await
}

/// [`accept`] without the wake-up: the caller must wake the workers (`NOTIFY oncepay_outbox`) after
/// an accept has committed, or leave the payment to their polling.
///
/// For a caller that folds many accepts into one `NOTIFY`: a `NOTIFY` in every accept serialises
/// their commits (see `sql/accept.sql` and [`crate::notify::Notifier`]). The wake-up is only a hint
/// either way: workers also poll.
#[tracing::instrument(name = "store.intake", skip_all, fields(tenant.id = %new.tenant_id))]
pub async fn accept_deferring_wakeup(conn: &mut PgConnection, new: &NewPayment) -> Result<Intake, StoreError> {
    intake(conn, new, false).await
}

/// Accepts many requests, each getting the result it would get if they came one after the other, in
/// this order; like [`accept_deferring_wakeup`], it leaves the wake-up to the caller.
///
/// The requests of one tenant with distinct keys are written together: one statement and one commit
/// (`sql/accept_group.sql`). A second request with a key already in the group finds that key as the
/// first one left it: stored by it, or found stored. Only if the first one failed is the second
/// written, after the group has committed. If PostgreSQL refuses the group's statement for what may
/// be one request's fault (a row or a value it refuses, a key another transaction holds past the
/// lock wait, keys crossed with another group), nothing of the group was written, and each request is
/// then accepted on its own, so that only the request at fault fails. Any other failure (the database
/// is unreachable) is every unwritten request's result.
#[tracing::instrument(name = "store.intake_group", skip_all, fields(requests = group.len()))]
pub async fn accept_group(conn: &mut PgConnection, group: &[NewPayment]) -> Vec<Result<Intake, StoreError>> {
    let mut results: Vec<Option<Result<Intake, StoreError>>> = vec![None; group.len()];
    let mut unwritten: Vec<usize> = (0..group.len()).collect();
    while let Some(&first) = unwritten.first() {
        let tenant_id = group[first].tenant_id;
        let mut keys = HashSet::new();
        let (round, later): (Vec<usize>, Vec<usize>) =
            unwritten.iter().partition(|&&i| group[i].tenant_id == tenant_id && keys.insert(&group[i].key));
        let requests: Vec<&NewPayment> = round.iter().map(|&i| &group[i]).collect();
        let written = match accept_round(conn, &requests).await {
            Ok(written) => written,
            Err(error) => {
                for i in round.into_iter().chain(later) {
                    results[i] = Some(Err(error.clone()));
                }
                break;
            }
        };
        for (&i, result) in round.iter().zip(written) {
            results[i] = Some(result);
        }
        // A later request of this tenant whose key this round wrote or found finds the key as the round
        // left it; one whose first request failed is written in a later round.
        let first_of_key: HashMap<&IdempotencyKey, usize> =
            round.iter().filter(|&&i| matches!(results[i], Some(Ok(_)))).map(|&i| (&group[i].key, i)).collect();
        unwritten = later
            .into_iter()
            .filter(|&i| {
                let first = first_of_key.get(&group[i].key).filter(|_| group[i].tenant_id == tenant_id);
                let Some(&first) = first else { return true };
                let Some(Ok(intake)) = &results[first] else { return true };
                results[i] = Some(Ok(Intake::Existing(stored_key(intake, &group[first]))));
                false
            })
            .collect();
    }
    results.into_iter().map(|result| result.unwrap_or_else(|| Err(vanished()))).collect()
}

/// The key as stored, if it is: what [`accept`] would return for a request with it, read without
/// writing or waiting for anything. A key that another transaction is writing is not seen until that
/// transaction commits, so `None` means "not stored yet", never "free to take": only intake decides
/// that.
#[tracing::instrument(name = "store.stored_key", skip_all, fields(tenant.id = %tenant_id))]
pub async fn stored(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    key: &IdempotencyKey,
) -> Result<Option<ExistingKey>, StoreError> {
    let row = sqlx::query_file_as!(StoredKeyRow, "sql/replay.sql", tenant_id.as_uuid(), key.as_str())
        .fetch_optional(conn)
        .await?;
    row.map(existing_of).transpose()
}

/// [`stored`] for several keys of one tenant, in one statement (`sql/replay_group.sql`): each key's
/// row, in the order of `keys`. One key is read with [`stored`]'s statement.
#[tracing::instrument(name = "store.stored_keys", skip_all, fields(tenant.id = %tenant_id, keys = keys.len()))]
pub async fn stored_many(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    keys: &[&IdempotencyKey],
) -> Result<Vec<Option<ExistingKey>>, StoreError> {
    if let [key] = keys {
        return Ok(vec![stored(conn, tenant_id, key).await?]);
    }
    let texts: Vec<&str> = keys.iter().map(|key| key.as_str()).collect();
    let rows =
        sqlx::query_file!("sql/replay_group.sql", tenant_id.as_uuid(), &texts as &[&str]).fetch_all(conn).await?;
    let mut found = HashMap::with_capacity(rows.len());
    for row in rows {
        let existing = existing_of(StoredKeyRow {
            fingerprint: row.fingerprint,
            payment_id: row.payment_id,
            expires_at: row.expires_at,
            response_status: row.response_status,
            response_body: row.response_body,
        })?;
        found.insert(row.idempotency_key, existing);
    }
    Ok(texts.iter().map(|key| found.get(*key).cloned()).collect())
}

/// The key as `intake`, the result of `new`, leaves it stored.
fn stored_key(intake: &Intake, new: &NewPayment) -> ExistingKey {
    match intake {
        Intake::Created(created) => ExistingKey {
            fingerprint: new.fingerprint,
            payment_id: created.payment.payment_id,
            expires_at: created.key_expires_at,
            stored_response: None,
        },
        Intake::Existing(existing) => existing.clone(),
    }
}

/// One tenant's requests with distinct keys: their results in order, or the failure that left every
/// one of them unwritten.
async fn accept_round(
    conn: &mut PgConnection,
    requests: &[&NewPayment],
) -> Result<Vec<Result<Intake, StoreError>>, StoreError> {
    if requests.len() > 1 {
        match intake_together(conn, requests).await {
            Err(error) if one_request_may_be_at_fault(&error) => {
                tracing::debug!(error = %error, requests = requests.len(), "accepting together failed; accepting one by one");
            }
            written => return written,
        }
    }
    let mut results = Vec::with_capacity(requests.len());
    for new in requests {
        let result = intake(conn, new, false).await;
        if let Err(error) = &result
            && error.is_unavailable()
            && !one_request_may_be_at_fault(error)
        {
            // The database is gone: so it is for the requests not yet written.
            if results.is_empty() {
                return Err(error.clone());
            }
            let failed = results.len()..requests.len();
            results.extend(failed.map(|_| Err(error.clone())));
            return Ok(results);
        }
        results.push(result);
    }
    Ok(results)
}

/// Whether PostgreSQL refused a statement for something one request of a group may have brought: a
/// value or a row it refuses (SQLSTATE classes 22 and 23), a key another transaction held past the
/// lock wait (55P03), or a deadlock with another group writing the same keys (40P01). Anything else
/// (the connection, the server, a timeout) would fail each request alone just the same.
fn one_request_may_be_at_fault(error: &StoreError) -> bool {
    error
        .sqlstate()
        .is_some_and(|code| code.starts_with("22") || code.starts_with("23") || code == "55P03" || code == "40P01")
}

/// A request with no row: its key was deleted between the function's write and its read.
fn vanished() -> StoreError {
    StoreError::Unexpected(sqlx::Error::RowNotFound.into())
}

/// What `sql/accept.sql` and `sql/accept_group.sql` return for one request.
struct IntakeRow {
    created: bool,
    fingerprint: Vec<u8>,
    payment_id: PaymentId,
    created_at: Option<OffsetDateTime>,
    updated_at: Option<OffsetDateTime>,
    expires_at: OffsetDateTime,
    response_status: Option<i16>,
    response_body: Option<Json<Box<RawValue>>>,
}

async fn intake(conn: &mut PgConnection, new: &NewPayment, wake: bool) -> Result<Intake, StoreError> {
    let payment_id = PaymentId::generate();
    let request = &new.request;
    let metadata = Json(&request.metadata);
    let trace = new.trace.as_ref();
    let row = sqlx::query_file_as!(
        IntakeRow,
        "sql/accept.sql",
        new.tenant_id.as_uuid(),
        new.key.as_str(),
        new.fingerprint.as_bytes().as_slice(),
        payment_id.as_uuid(),
        new.retention.as_secs_f64(),
        request.amount.minor_units(),
        request.currency.as_str(),
        request.customer_id,
        request.description,
        metadata as _,
        trace.map(|t| t.traceparent.as_str()),
        trace.and_then(|t| t.tracestate.as_deref()),
        wake,
        request.payment_method.as_ref().map(PaymentMethod::as_str),
        request.provider_customer.as_ref().map(ProviderCustomer::as_str),
        new.provider_account.as_ref().map(ProviderAccount::as_str),
        lock_wait_ms(new),
    )
    .fetch_optional(conn)
    .await?
    // The function returns one row unless the key vanished between its insert and its second read.
    .ok_or_else(vanished)?;
    intake_of(row, new)
}

/// Writes `requests` (one tenant's, with distinct keys) in one statement: their results in order.
async fn intake_together(
    conn: &mut PgConnection,
    requests: &[&NewPayment],
) -> Result<Vec<Result<Intake, StoreError>>, StoreError> {
    let Some(first) = requests.first() else { return Ok(Vec::new()) };
    let payment_ids: Vec<Uuid> = requests.iter().map(|_| PaymentId::generate().as_uuid()).collect();
    let traces = || requests.iter().map(|new| new.trace.as_ref());
    let rows = sqlx::query_file!(
        "sql/accept_group.sql",
        first.tenant_id.as_uuid(),
        &requests.iter().map(|new| new.key.as_str()).collect::<Vec<_>>() as &[&str],
        &requests.iter().map(|new| new.fingerprint.as_bytes().as_slice()).collect::<Vec<_>>() as &[&[u8]],
        &payment_ids,
        first.retention.as_secs_f64(),
        &requests.iter().map(|new| new.request.amount.minor_units()).collect::<Vec<_>>(),
        &requests.iter().map(|new| new.request.currency.as_str()).collect::<Vec<_>>() as &[&str],
        &requests.iter().map(|new| new.request.customer_id.as_str()).collect::<Vec<_>>() as &[&str],
        &requests.iter().map(|new| new.request.description.as_deref()).collect::<Vec<_>>() as &[Option<&str>],
        &requests.iter().map(|new| Json(&new.request.metadata)).collect::<Vec<_>>() as _,
        &requests.iter().map(|new| new.request.payment_method.as_ref().map(PaymentMethod::as_str)).collect::<Vec<_>>()
            as &[Option<&str>],
        &traces().map(|t| t.map(|t| t.traceparent.as_str())).collect::<Vec<_>>() as &[Option<&str>],
        &traces().map(|t| t.and_then(|t| t.tracestate.as_deref())).collect::<Vec<_>>() as &[Option<&str>],
        &requests
            .iter()
            .map(|new| new.request.provider_customer.as_ref().map(ProviderCustomer::as_str))
            .collect::<Vec<_>>() as &[Option<&str>],
        &requests.iter().map(|new| new.provider_account.as_ref().map(ProviderAccount::as_str)).collect::<Vec<_>>()
            as &[Option<&str>],
        lock_wait_ms(first),
    )
    .fetch_all(conn)
    .await?;
    let mut results: Vec<Result<Intake, StoreError>> = requests.iter().map(|_| Err(vanished())).collect();
    // A request may have two rows, the second from the function's later read: the last one counts.
    for row in rows {
        let item = usize::try_from(row.item).ok().and_then(|item| item.checked_sub(1));
        let Some((result, new)) = item.and_then(|item| results.get_mut(item).zip(requests.get(item))) else {
            return Err(StoreError::Unexpected(
                sqlx::Error::Decode("a group's row names no request of it".into()).into(),
            ));
        };
        let row = IntakeRow {
            created: row.created,
            fingerprint: row.fingerprint,
            payment_id: row.payment_id,
            created_at: row.created_at,
            updated_at: row.updated_at,
            expires_at: row.expires_at,
            response_status: row.response_status,
            response_body: row.response_body,
        };
        *result = intake_of(row, new);
    }
    Ok(results)
}

/// The lock wait to pass to the intake functions, in whole milliseconds (at least 1: 0 would be no
/// limit at all).
fn lock_wait_ms(new: &NewPayment) -> Option<i32> {
    new.lock_wait.map(|wait| i32::try_from(wait.as_millis()).unwrap_or(i32::MAX).max(1))
}

/// What `sql/replay.sql` returns: a stored key.
struct StoredKeyRow {
    fingerprint: Vec<u8>,
    payment_id: PaymentId,
    expires_at: OffsetDateTime,
    response_status: Option<i16>,
    response_body: Option<Json<Box<RawValue>>>,
}

/// A stored key's row, decoded.
fn existing_of(row: StoredKeyRow) -> Result<ExistingKey, StoreError> {
    let fingerprint = Fingerprint::from_slice(&row.fingerprint).ok_or_else(|| {
        StoreError::Unexpected(sqlx::Error::Decode("a stored fingerprint is not 32 bytes".into()).into())
    })?;
    let stored_response = match (row.response_status, row.response_body) {
        (Some(status), Some(Json(body))) => Some((u16::try_from(status).unwrap_or(200), body)),
        _ => None,
    };
    Ok(ExistingKey { fingerprint, payment_id: row.payment_id, expires_at: row.expires_at, stored_response })
}

/// What one request's row means: the key as it exists, or the payment it accepted.
fn intake_of(row: IntakeRow, new: &NewPayment) -> Result<Intake, StoreError> {
    if !row.created {
        return existing_of(StoredKeyRow {
            fingerprint: row.fingerprint,
            payment_id: row.payment_id,
            expires_at: row.expires_at,
            response_status: row.response_status,
            response_body: row.response_body,
        })
        .map(Intake::Existing);
    }
    let (Some(created_at), Some(updated_at)) = (row.created_at, row.updated_at) else {
        return Err(StoreError::Unexpected(
            sqlx::Error::Decode("an accepted payment without its timestamps".into()).into(),
        ));
    };
    let request = &new.request;
    Ok(Intake::Created(Box::new(Created {
        payment: Payment {
            tenant_id: new.tenant_id,
            payment_id: row.payment_id,
            status: PaymentStatus::Pending,
            amount: request.amount,
            currency: request.currency,
            customer_id: request.customer_id.clone(),
            description: request.description.clone(),
            metadata: Json(request.metadata.clone()),
            payment_method: request.payment_method.clone(),
            provider_customer: request.provider_customer.clone(),
            provider_account: new.provider_account.clone(),
            provider_charge_id: None,
            failure_code: None,
            failure_message: None,
            send_attempts: 0,
            first_sent_at: None,
            refunded: 0,
            created_at,
            updated_at,
            // Its history starts with its acceptance.
            event_count: 1,
        },
        key_expires_at: row.expires_at,
    })))
}
