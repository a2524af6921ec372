//! Broker users: the RabbitMQ users whose messages are a tenant's payment requests. The broker
//! vouches for a message's `user_id`; this table says whose it is (`migrations/0440_broker_users.sql`).

use sqlx::PgConnection;

use oncepay_domain::ids::TenantId;
use oncepay_domain::provider_ref::ProviderAccount;

use crate::StoreError;

/// The tenant a broker user publishes for, with what intake needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerTenant {
    /// The tenant.
    pub tenant_id: TenantId,
    /// Its own rate limit, if it has one.
    pub rate_limit_per_second: Option<i32>,
    /// The provider account its payments are charged to in connect mode, if an operator set one.
    pub provider_account: Option<ProviderAccount>,
}

/// Why a broker user could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// The user already publishes for a tenant (this one or another): a user belongs to one tenant.
    #[error("the broker user already belongs to a tenant")]
    Taken,
    /// No such tenant.
    #[error("no such tenant")]
    NoTenant,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The tenant `broker_user` publishes for, if any.
pub async fn tenant_of(conn: &mut PgConnection, broker_user: &str) -> Result<Option<BrokerTenant>, StoreError> {
    Ok(sqlx::query_as!(
        BrokerTenant,
        r#"
        SELECT t.tenant_id AS "tenant_id: TenantId", t.rate_limit_per_second,
               t.provider_account AS "provider_account: ProviderAccount"
        FROM broker_users b JOIN tenants t USING (tenant_id)
        WHERE b.broker_user = $1
        "#,
        broker_user,
    )
    .fetch_optional(conn)
    .await?)
}

/// Maps `broker_user` to `tenant_id`.
pub async fn map(conn: &mut PgConnection, broker_user: &str, tenant_id: TenantId) -> Result<(), MapError> {
    let inserted = sqlx::query!(
        r#"
        INSERT INTO broker_users (broker_user, tenant_id)
        SELECT $1, tenant_id FROM tenants WHERE tenant_id = $2
        ON CONFLICT (broker_user) DO NOTHING
        "#,
        broker_user,
        tenant_id.as_uuid(),
    )
    .execute(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    if inserted.rows_affected() == 1 {
        return Ok(());
    }
    let tenant = sqlx::query_scalar!("SELECT 1 AS \"one!\" FROM tenants WHERE tenant_id = $1", tenant_id.as_uuid())
        .fetch_optional(conn)
        .await
        .map_err(StoreError::from)?;
    Err(if tenant.is_some() { MapError::Taken } else { MapError::NoTenant })
}

/// Removes `broker_user`'s mapping to `tenant_id`; whether there was one. Its messages from then on
/// change nothing.
pub async fn unmap(conn: &mut PgConnection, broker_user: &str, tenant_id: TenantId) -> Result<bool, StoreError> {
    let deleted = sqlx::query!(
        "DELETE FROM broker_users WHERE broker_user = $1 AND tenant_id = $2",
        broker_user,
        tenant_id.as_uuid()
    )
    .execute(conn)
    .await?;
    Ok(deleted.rows_affected() == 1)
}

/// The broker users of `tenant_id`, by name.
pub async fn of_tenant(conn: &mut PgConnection, tenant_id: TenantId) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar!(
        "SELECT broker_user FROM broker_users WHERE tenant_id = $1 ORDER BY broker_user",
        tenant_id.as_uuid()
    )
    .fetch_all(conn)
    .await?)
}
