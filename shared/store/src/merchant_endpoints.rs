//! A tenant's webhook endpoints (`merchant_endpoints`): made, read, changed, rotated and removed
//! by the merchant through the api, and disabled by the worker when one is gone or keeps failing.
//!
//! Every query names the tenant, so no tenant reaches another's endpoint.

use std::time::Duration;

use sqlx::{Connection, PgConnection};
use time::OffsetDateTime;
use uuid::Uuid;

use oncepay_domain::ids::TenantId;
use oncepay_domain::webhook_endpoint::EndpointResource;

use crate::StoreError;

/// A row of `merchant_endpoints`.
#[derive(Clone)]
pub struct Endpoint {
    /// The owner.
    pub tenant_id: TenantId,
    /// The endpoint's id.
    pub endpoint_id: Uuid,
    /// Where deliveries go.
    pub url: String,
    /// The merchant's note.
    pub description: String,
    /// The types it receives; empty means every type.
    pub event_types: Vec<String>,
    /// The signing secret, `whsec_…`.
    pub secret: String,
    /// The secret before the last rotation, signing too until `previous_secret_until`.
    pub previous_secret: Option<String>,
    /// When the previous secret stops signing.
    pub previous_secret_until: Option<OffsetDateTime>,
    /// Whether deliveries are made.
    pub enabled: bool,
    /// Why not, while disabled: `gone`, `failing` or `merchant`.
    pub disabled_reason: Option<String>,
    /// Since when every attempt has failed.
    pub failing_since: Option<OffsetDateTime>,
    /// When it was made.
    pub created_at: OffsetDateTime,
    /// When it last changed.
    pub updated_at: OffsetDateTime,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("tenant_id", &self.tenant_id)
            .field("endpoint_id", &self.endpoint_id)
            .field("url", &self.url)
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

impl From<&Endpoint> for EndpointResource {
    fn from(endpoint: &Endpoint) -> Self {
        Self {
            id: endpoint.endpoint_id,
            url: endpoint.url.clone(),
            description: endpoint.description.clone(),
            event_types: endpoint.event_types.clone(),
            enabled: endpoint.enabled,
            disabled_reason: endpoint.disabled_reason.clone(),
            created_at: endpoint.created_at,
            updated_at: endpoint.updated_at,
        }
    }
}

/// What a new endpoint is made of.
#[derive(Debug, Clone)]
pub struct NewEndpoint<'a> {
    /// Where deliveries go, already checked.
    pub url: &'a str,
    /// The merchant's note.
    pub description: &'a str,
    /// The types it receives; empty means every type.
    pub event_types: &'a [String],
    /// Its first signing secret.
    pub secret: &'a str,
}

/// A change the merchant makes; `None` keeps the field.
#[derive(Debug, Clone, Default)]
pub struct EndpointChange<'a> {
    /// A new URL, already checked.
    pub url: Option<&'a str>,
    /// A new note.
    pub description: Option<&'a str>,
    /// New types.
    pub event_types: Option<&'a [String]>,
    /// `false` stops deliveries (`merchant`); `true` starts them again, whatever stopped them.
    pub enabled: Option<bool>,
}

/// The `Idempotency-Key` a create came with: the fingerprint of its request, and how long the key
/// holds the endpoint it makes.
#[derive(Debug, Clone, Copy)]
pub struct CreateKey<'a> {
    /// The key, parsed.
    pub key: &'a str,
    /// The request's fingerprint.
    pub fingerprint: &'a [u8],
    /// How long the key is kept.
    pub retention: Duration,
}

/// What a create with a key did.
#[derive(Debug)]
pub enum Created {
    /// Made the endpoint.
    New {
        /// The endpoint.
        endpoint: Endpoint,
        /// When the key is forgotten.
        key_expires_at: OffsetDateTime,
    },
    /// The key had made an endpoint already: the caller answers it again if `fingerprint` is the
    /// request's, and refuses the request otherwise.
    Existing {
        /// The endpoint the key made.
        endpoint: Endpoint,
        /// The fingerprint of the request that made it.
        fingerprint: Vec<u8>,
        /// When the key is forgotten.
        key_expires_at: OffsetDateTime,
    },
}

/// Makes an endpoint.
pub async fn create(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    new: &NewEndpoint<'_>,
) -> Result<Endpoint, StoreError> {
    let made = insert(conn, tenant_id, new, None).await?;
    let (endpoint_id, _) = made.ok_or_else(|| StoreError::Unexpected(sqlx::Error::RowNotFound.into()))?;
    find(conn, tenant_id, endpoint_id).await?.ok_or_else(|| StoreError::Unexpected(sqlx::Error::RowNotFound.into()))
}

/// Makes an endpoint under `key`, unless the key made one already and still holds it: then that
/// endpoint, with the fingerprint of the request that made it. A key past its retention is first
/// forgotten (the endpoint it made stays). Two creates with one key at once make one endpoint: the
/// second waits for the first to commit and finds its endpoint.
pub async fn create_once(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    new: &NewEndpoint<'_>,
    key: &CreateKey<'_>,
) -> Result<Created, StoreError> {
    let mut tx = conn.begin().await?;
    sqlx::query!(
        "UPDATE merchant_endpoints SET idempotency_key = NULL, request_fingerprint = NULL, key_expires_at = NULL
         WHERE tenant_id = $1 AND idempotency_key = $2 AND key_expires_at <= now()",
        tenant_id.as_uuid(),
        key.key,
    )
    .execute(&mut *tx)
    .await?;
    let missing = || StoreError::Unexpected(sqlx::Error::RowNotFound.into());
    let created = if let Some((endpoint_id, key_expires_at)) = insert(&mut tx, tenant_id, new, Some(key)).await? {
        let endpoint = find(&mut tx, tenant_id, endpoint_id).await?.ok_or_else(missing)?;
        Created::New { endpoint, key_expires_at: key_expires_at.ok_or_else(missing)? }
    } else {
        let held = sqlx::query!(
            r#"SELECT endpoint_id, request_fingerprint AS "fingerprint!", key_expires_at AS "key_expires_at!"
               FROM merchant_endpoints WHERE tenant_id = $1 AND idempotency_key = $2"#,
            tenant_id.as_uuid(),
            key.key,
        )
        .fetch_one(&mut *tx)
        .await?;
        let endpoint = find(&mut tx, tenant_id, held.endpoint_id).await?.ok_or_else(missing)?;
        Created::Existing { endpoint, fingerprint: held.fingerprint, key_expires_at: held.key_expires_at }
    };
    tx.commit().await?;
    Ok(created)
}

/// Inserts an endpoint, under `key` if there is one; its id and when the key is forgotten, or
/// `None` if the key holds another endpoint.
async fn insert(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    new: &NewEndpoint<'_>,
    key: Option<&CreateKey<'_>>,
) -> Result<Option<(Uuid, Option<OffsetDateTime>)>, StoreError> {
    let made = sqlx::query!(
        "INSERT INTO merchant_endpoints
             (tenant_id, endpoint_id, url, description, event_types, secret,
              idempotency_key, request_fingerprint, key_expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9::float8))
         ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
         RETURNING endpoint_id, key_expires_at",
        tenant_id.as_uuid(),
        Uuid::now_v7(),
        new.url,
        new.description,
        new.event_types,
        new.secret,
        key.map(|k| k.key),
        key.map(|k| k.fingerprint),
        key.map(|k| k.retention.as_secs_f64()),
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(made.map(|made| (made.endpoint_id, made.key_expires_at)))
}

/// The tenant's endpoints, oldest first.
pub async fn list(conn: &mut PgConnection, tenant_id: TenantId) -> Result<Vec<Endpoint>, StoreError> {
    read(conn, tenant_id, None).await
}

/// One of the tenant's endpoints.
pub async fn find(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    endpoint_id: Uuid,
) -> Result<Option<Endpoint>, StoreError> {
    Ok(read(conn, tenant_id, Some(endpoint_id)).await?.pop())
}

async fn read(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    endpoint_id: Option<Uuid>,
) -> Result<Vec<Endpoint>, StoreError> {
    Ok(sqlx::query_as!(
        Endpoint,
        r#"
        SELECT tenant_id AS "tenant_id: TenantId", endpoint_id, url, description, event_types, secret,
               previous_secret, previous_secret_until, enabled, disabled_reason, failing_since, created_at, updated_at
        FROM merchant_endpoints
        WHERE tenant_id = $1 AND ($2::uuid IS NULL OR endpoint_id = $2)
        ORDER BY created_at, endpoint_id
        "#,
        tenant_id.as_uuid(),
        endpoint_id,
    )
    .fetch_all(conn)
    .await?)
}

/// Changes an endpoint; `None` if the tenant has no such endpoint.
pub async fn update(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    endpoint_id: Uuid,
    change: &EndpointChange<'_>,
) -> Result<Option<Endpoint>, StoreError> {
    let changed = sqlx::query!(
        // `now()` comes from `FROM`: Citus refuses it inside a `CASE` of a distributed UPDATE.
        "UPDATE merchant_endpoints
         SET url = COALESCE($3, url), description = COALESCE($4, description),
             event_types = COALESCE($5, event_types),
             enabled = COALESCE($6, enabled),
             disabled_reason = CASE WHEN $6 IS NULL THEN disabled_reason WHEN $6 THEN NULL ELSE 'merchant' END,
             disabled_at = CASE WHEN $6 IS NULL THEN disabled_at WHEN $6 THEN NULL ELSE clock.now END,
             failing_since = CASE WHEN $6 THEN NULL ELSE failing_since END,
             updated_at = clock.now
         FROM (SELECT now() AS now) clock
         WHERE tenant_id = $1 AND endpoint_id = $2",
        tenant_id.as_uuid(),
        endpoint_id,
        change.url,
        change.description,
        change.event_types,
        change.enabled,
    )
    .execute(&mut *conn)
    .await?;
    if changed.rows_affected() == 0 {
        return Ok(None);
    }
    find(conn, tenant_id, endpoint_id).await
}

/// Gives an endpoint a new secret; the one before it keeps signing for `overlap`, so the merchant
/// can deploy the new one without missing a delivery. `None` if the tenant has no such endpoint.
pub async fn rotate(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    endpoint_id: Uuid,
    secret: &str,
    overlap: Duration,
) -> Result<Option<Endpoint>, StoreError> {
    let changed = sqlx::query!(
        "UPDATE merchant_endpoints
         SET previous_secret = secret, previous_secret_until = now() + make_interval(secs => $4),
             secret = $3, updated_at = now()
         WHERE tenant_id = $1 AND endpoint_id = $2",
        tenant_id.as_uuid(),
        endpoint_id,
        secret,
        overlap.as_secs_f64(),
    )
    .execute(&mut *conn)
    .await?;
    if changed.rows_affected() == 0 {
        return Ok(None);
    }
    find(conn, tenant_id, endpoint_id).await
}

/// Removes an endpoint with its deliveries; false if the tenant has no such endpoint. Its events
/// stay, for its other endpoints.
pub async fn delete(conn: &mut PgConnection, tenant_id: TenantId, endpoint_id: Uuid) -> Result<bool, StoreError> {
    let done = sqlx::query!(
        "DELETE FROM merchant_endpoints WHERE tenant_id = $1 AND endpoint_id = $2",
        tenant_id.as_uuid(),
        endpoint_id,
    )
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}
