//! Tenants, their API keys and their provider accounts: creating and changing them (operators), and
//! looking a key up (the api).
//!
//! Only the hash of a key's secret is stored; the token is returned once, by [`issue_api_key`].

use std::fmt;

use sqlx::PgConnection;
use time::OffsetDateTime;

use oncepay_domain::api_key::{self, KeyId, NewKey};
use oncepay_domain::ids::TenantId;
use oncepay_domain::provider_ref::ProviderAccount;

use crate::StoreError;

/// A tenant's operator-facing handle: 1–63 of `a-z 0-9 _ -`, starting with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantName(String);

/// A name that breaks the rules above.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a tenant name is 1 to 63 of a-z, 0-9, '_' and '-', starting with a letter or digit")]
pub struct BadTenantName;

impl TenantName {
    /// Checks the rules.
    pub fn parse(name: &str) -> Result<Self, BadTenantName> {
        let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
        let first_ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if first_ok && name.len() <= 63 && name.chars().all(valid_char) {
            Ok(Self(name.to_owned()))
        } else {
            Err(BadTenantName)
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Its id.
    pub tenant_id: TenantId,
    /// Its handle.
    pub name: String,
    /// Its own rate limit, if it has one.
    pub rate_limit_per_second: Option<i32>,
    /// The provider account its payments are charged to in connect mode (a Stripe connected
    /// account), if an operator has set one.
    pub provider_account: Option<ProviderAccount>,
    /// When it was created.
    pub created_at: OffsetDateTime,
}

/// Why a tenant could not be created or changed.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    /// Another tenant has the name.
    #[error("a tenant named {0} already exists")]
    NameTaken(String),
    /// Another tenant is charged through the provider account: one account belongs to at most one
    /// tenant (`tenants_provider_account_once`).
    #[error("provider account {0} belongs to another tenant")]
    AccountTaken(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl TenantError {
    /// `error`, or [`Self::AccountTaken`] when it is the provider account's unique constraint that
    /// refused `account`. The transaction is aborted either way.
    fn of(error: sqlx::Error, account: Option<&ProviderAccount>) -> Self {
        let taken = error.as_database_error().and_then(|e| e.constraint()) == Some("tenants_provider_account_once");
        match account {
            Some(account) if taken => Self::AccountTaken(account.as_str().to_owned()),
            _ => Self::Store(StoreError::from(error)),
        }
    }
}

/// Creates tenant `tenant_id`.
pub async fn create(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    name: &TenantName,
    rate_limit_per_second: Option<i32>,
    provider_account: Option<&ProviderAccount>,
) -> Result<Tenant, TenantError> {
    let created = sqlx::query_as!(
        Tenant,
        r#"
        INSERT INTO tenants (tenant_id, name, rate_limit_per_second, provider_account)
        VALUES ($1, $2, $3, $4)
        ON CONFLICT (name) DO NOTHING
        RETURNING tenant_id AS "tenant_id: TenantId", name, rate_limit_per_second,
                  provider_account AS "provider_account: ProviderAccount", created_at
        "#,
        tenant_id.as_uuid(),
        name.as_str(),
        rate_limit_per_second,
        provider_account.map(ProviderAccount::as_str),
    )
    .fetch_optional(conn)
    .await
    .map_err(|error| TenantError::of(error, provider_account))?;
    created.ok_or_else(|| TenantError::NameTaken(name.to_string()))
}

/// The tenant with this name.
pub async fn find_by_name(conn: &mut PgConnection, name: &str) -> Result<Option<Tenant>, StoreError> {
    Ok(sqlx::query_as!(
        Tenant,
        r#"SELECT tenant_id AS "tenant_id: TenantId", name, rate_limit_per_second,
                  provider_account AS "provider_account: ProviderAccount", created_at
           FROM tenants WHERE name = $1"#,
        name,
    )
    .fetch_optional(conn)
    .await?)
}

/// Every tenant, by name.
pub async fn list(conn: &mut PgConnection) -> Result<Vec<Tenant>, StoreError> {
    Ok(sqlx::query_as!(
        Tenant,
        r#"SELECT tenant_id AS "tenant_id: TenantId", name, rate_limit_per_second,
                  provider_account AS "provider_account: ProviderAccount", created_at
           FROM tenants ORDER BY name"#,
    )
    .fetch_all(conn)
    .await?)
}

/// Sets the provider account a tenant's payments are charged to from now on (`None` removes it);
/// `false` if there is no such tenant. Payments accepted before keep the account they were accepted
/// with.
pub async fn set_provider_account(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    account: Option<&ProviderAccount>,
) -> Result<bool, TenantError> {
    let updated = sqlx::query!(
        "UPDATE tenants SET provider_account = $2 WHERE tenant_id = $1",
        tenant_id.as_uuid(),
        account.map(ProviderAccount::as_str),
    )
    .execute(conn)
    .await
    .map_err(|error| TenantError::of(error, account))?;
    Ok(updated.rows_affected() == 1)
}

/// The tenant with this id, its row locked until the transaction ends.
pub async fn lock(conn: &mut PgConnection, tenant_id: TenantId) -> Result<Option<Tenant>, StoreError> {
    Ok(sqlx::query_as!(
        Tenant,
        r#"SELECT tenant_id AS "tenant_id: TenantId", name, rate_limit_per_second,
                  provider_account AS "provider_account: ProviderAccount", created_at
           FROM tenants WHERE tenant_id = $1
           FOR UPDATE"#,
        tenant_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await?)
}

/// Makes a new API key for a tenant and stores its hash. The returned token is shown once.
pub async fn issue_api_key(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    label: Option<&str>,
) -> Result<NewKey, StoreError> {
    let key = api_key::generate(tenant_id);
    sqlx::query!(
        "INSERT INTO api_keys (tenant_id, key_id, secret_sha256, label) VALUES ($1, $2, $3, $4)",
        tenant_id.as_uuid(),
        key.key_id.as_str(),
        key.secret_hash.as_bytes().as_slice(),
        label,
    )
    .execute(conn)
    .await?;
    Ok(key)
}

/// Revokes a key; `false` if the tenant has no such live key.
pub async fn revoke_api_key(conn: &mut PgConnection, tenant_id: TenantId, key_id: &KeyId) -> Result<bool, StoreError> {
    let revoked = sqlx::query!(
        "UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1 AND key_id = $2 AND revoked_at IS NULL",
        tenant_id.as_uuid(),
        key_id.as_str(),
    )
    .execute(conn)
    .await?;
    Ok(revoked.rows_affected() == 1)
}

/// What the api needs to authenticate a key and rate-limit its tenant.
#[derive(Debug, Clone)]
pub struct StoredKey {
    /// SHA-256 of the key's secret.
    pub secret_sha256: Vec<u8>,
    /// Whether the key was revoked.
    pub revoked: bool,
    /// The tenant's own rate limit, if any.
    pub rate_limit_per_second: Option<i32>,
    /// The tenant's provider account, if an operator has set one.
    pub provider_account: Option<ProviderAccount>,
}

/// Looks up a key by its tenant and id (a primary-key read).
pub async fn find_api_key(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    key_id: &KeyId,
) -> Result<Option<StoredKey>, StoreError> {
    Ok(sqlx::query_as!(
        StoredKey,
        r#"
        SELECT k.secret_sha256, k.revoked_at IS NOT NULL AS "revoked!", t.rate_limit_per_second,
               t.provider_account AS "provider_account: ProviderAccount"
        FROM api_keys k JOIN tenants t USING (tenant_id)
        WHERE k.tenant_id = $1 AND k.key_id = $2
        "#,
        tenant_id.as_uuid(),
        key_id.as_str(),
    )
    .fetch_optional(conn)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_follow_the_rules() {
        for good in ["acme", "a", "acme-eu_2", "9lives", &"a".repeat(63)] {
            assert!(TenantName::parse(good).is_ok(), "{good}");
        }
        for bad in ["", "-acme", "_acme", "Acme", "ac me", "acmé", &"a".repeat(64)] {
            assert!(TenantName::parse(bad).is_err(), "{bad}");
        }
    }
}
