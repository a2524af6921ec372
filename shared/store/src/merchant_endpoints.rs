//! A tenant's webhook endpoints (`merchant_endpoints`): made, read, changed, rotated and removed
//! by the merchant through the api, and disabled by the worker when one is gone or keeps failing.
//!
//! Every query names the tenant, so no tenant reaches another's endpoint.

use std::time::Duration;

use sqlx::PgConnection;
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

/// Makes an endpoint.
pub async fn create(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    new: &NewEndpoint<'_>,
) -> Result<Endpoint, StoreError> {
    let endpoint_id = sqlx::query_scalar!(
        "INSERT INTO merchant_endpoints (tenant_id, endpoint_id, url, description, event_types, secret)
         VALUES ($1, $2, $3, $4, $5, $6)
         RETURNING endpoint_id",
        tenant_id.as_uuid(),
        Uuid::now_v7(),
        new.url,
        new.description,
        new.event_types,
        new.secret,
    )
    .fetch_one(&mut *conn)
    .await?;
    find(conn, tenant_id, endpoint_id).await?.ok_or_else(|| StoreError::Unexpected(sqlx::Error::RowNotFound.into()))
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
        "UPDATE merchant_endpoints
         SET url = COALESCE($3, url), description = COALESCE($4, description),
             event_types = COALESCE($5, event_types),
             enabled = COALESCE($6, enabled),
             disabled_reason = CASE WHEN $6 IS NULL THEN disabled_reason WHEN $6 THEN NULL ELSE 'merchant' END,
             disabled_at = CASE WHEN $6 IS NULL THEN disabled_at WHEN $6 THEN NULL ELSE now() END,
             failing_since = CASE WHEN $6 THEN NULL ELSE failing_since END,
             updated_at = now()
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
