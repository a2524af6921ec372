//! Tenants, their API keys, provider accounts and broker users as operators change and see them:
//! creating a tenant, connecting it to a provider account, issuing it a key and letting a broker
//! user publish its payments (each the carrying out of an approved proposal,
//! `crate::operators::proposals`), disconnecting it, revoking a key and removing a broker user (done
//! at once: none can move money), and the lists the CLI and the console show.
//!
//! The store functions are `oncepay_store::tenants`; this module adds the operator's view.
//! A new key's token is printed exactly once, by the command that made it, with a line saying it
//! will not be shown again; nothing else ever prints or logs a token, and only its hash is stored.

use std::io::{self, Write};

use anyhow::Context;
use oncepay_domain::api_key::{self, KeyId};
use oncepay_domain::ids::TenantId;
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_store::broker_users::{self, MapError};
use oncepay_store::tenants::{self, Tenant, TenantError, TenantName};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use time::OffsetDateTime;

use crate::operator_error::OperatorError;
use crate::render::{self, Report, Table};

/// A tenant as operators see it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TenantView {
    /// Its id.
    pub tenant_id: String,
    /// Its handle.
    pub name: String,
    /// Its own requests-per-second limit, if any.
    pub rate_limit_per_second: Option<i32>,
    /// The provider account its payments are charged to in connect mode, if set.
    pub provider_account: Option<String>,
    /// When it was created.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

impl From<&Tenant> for TenantView {
    fn from(tenant: &Tenant) -> Self {
        Self {
            tenant_id: tenant.tenant_id.to_string(),
            name: tenant.name.clone(),
            rate_limit_per_second: tenant.rate_limit_per_second,
            provider_account: tenant.provider_account.as_ref().map(|a| a.as_str().to_owned()),
            created_at: tenant.created_at,
        }
    }
}

/// A new key, with the token that is shown this once.
#[derive(Debug, Serialize, Deserialize)]
pub struct IssuedKey {
    /// The tenant it belongs to.
    pub tenant: TenantView,
    /// The key's public id (for `keys revoke`).
    pub key_id: String,
    /// The bearer token to hand to the tenant.
    pub api_key: String,
}

const SHOWN_ONCE: &str = "This API key is shown once and cannot be shown again: store it now.";

impl Report for IssuedKey {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "tenant   {} ({})", self.tenant.name, self.tenant.tenant_id)?;
        writeln!(out, "key id   {}", self.key_id)?;
        writeln!(out, "api key  {}", self.api_key)?;
        writeln!(out, "{SHOWN_ONCE}")
    }

    fn json(&self) -> serde_json::Value {
        let mut value = render::to_json(self);
        value["notice"] = SHOWN_ONCE.into();
        value
    }
}

/// Creates tenant `tenant_id` named `name`, in the caller's transaction, as an approved
/// `tenant_create` proposal does; its first key is made when the proposer collects it
/// ([`issue_key`]).
pub async fn create(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    name: &str,
    rate_limit: Option<i32>,
    provider_account: Option<&str>,
) -> Result<TenantView, OperatorError> {
    let name = TenantName::parse(name).map_err(|e| OperatorError::Invalid(format!("tenant name {name:?}: {e}")))?;
    if rate_limit.is_some_and(|limit| limit <= 0) {
        return Err(OperatorError::Invalid("--rate-limit must be a positive number of requests per second".into()));
    }
    let account = provider_account.map(account).transpose()?;
    let tenant = tenants::create(conn, tenant_id, &name, rate_limit, account.as_ref()).await.map_err(refusal)?;
    Ok(TenantView::from(&tenant))
}

/// What a store refusal means to an operator.
fn refusal(error: TenantError) -> OperatorError {
    match error {
        TenantError::NameTaken(name) => OperatorError::Refused(format!("a tenant named {name} already exists")),
        TenantError::AccountTaken(account) => OperatorError::Refused(format!(
            "provider account {account} belongs to another tenant: one account belongs to at most one tenant"
        )),
        TenantError::Store(e) => OperatorError::Failed(anyhow::Error::new(e).context("cannot change the tenants")),
    }
}

/// `tenants list`.
#[derive(Debug, Serialize, Deserialize)]
pub struct TenantList(pub Vec<TenantView>);

impl Report for TenantList {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut table = Table::new(&["NAME", "TENANT ID", "RATE LIMIT", "PROVIDER ACCOUNT", "CREATED"]);
        for t in &self.0 {
            table.row(vec![
                t.name.clone(),
                t.tenant_id.clone(),
                t.rate_limit_per_second.map_or_else(|| "default".to_owned(), |r| format!("{r}/s")),
                t.provider_account.clone().unwrap_or_else(|| "none".to_owned()),
                render::timestamp(t.created_at),
            ]);
        }
        table.write(out, "no tenants")
    }

    fn json(&self) -> serde_json::Value {
        render::to_json(&self.0)
    }
}

/// Every tenant, by name.
pub async fn list(conn: &mut PgConnection) -> Result<TenantList, OperatorError> {
    let all = tenants::list(conn).await.context("cannot list the tenants")?;
    Ok(TenantList(all.iter().map(TenantView::from).collect()))
}

/// The longest broker user name RabbitMQ's AMQP `user_id` carries (a short string).
const BROKER_USER_MAX_BYTES: usize = 255;

/// A broker user's name as an operator typed it: 1 to 255 bytes, no control characters.
fn broker_user(text: &str) -> Result<&str, OperatorError> {
    if text.is_empty() || text.len() > BROKER_USER_MAX_BYTES || text.chars().any(char::is_control) {
        return Err(OperatorError::Invalid(format!(
            "broker user {text:?} must be 1 to {BROKER_USER_MAX_BYTES} bytes without control characters"
        )));
    }
    Ok(text)
}

/// Lets `user` publish tenant `tenant_id`'s payments through the broker, in the caller's
/// transaction: an approved `broker_user` proposal.
pub async fn map_broker_user(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    user: &str,
) -> Result<TenantView, OperatorError> {
    let user = broker_user(user)?;
    let tenant = find_by_id(conn, tenant_id).await?;
    broker_users::map(conn, user, tenant_id).await.map_err(|error| match error {
        MapError::Taken => OperatorError::Refused(format!(
            "broker user {user} already publishes for a tenant: one broker user belongs to at most one tenant"
        )),
        MapError::NoTenant => OperatorError::NotFound(format!("no tenant {tenant_id}")),
        MapError::Store(e) => OperatorError::Failed(anyhow::Error::new(e).context("cannot map the broker user")),
    })?;
    Ok(TenantView::from(&tenant))
}

/// Stops `user` publishing tenant `tenant_id`'s payments: its messages from then on are
/// dead-lettered as `unknown_user`.
pub async fn unmap_broker_user(conn: &mut PgConnection, tenant_id: TenantId, user: &str) -> Result<(), OperatorError> {
    if broker_users::unmap(conn, broker_user(user)?, tenant_id).await.context("cannot remove the broker user")? {
        Ok(())
    } else {
        Err(OperatorError::NotFound(format!("broker user {user} does not publish for this tenant")))
    }
}

/// The broker users that publish tenant `tenant_id`'s payments, by name.
pub async fn broker_users_of(conn: &mut PgConnection, tenant_id: TenantId) -> Result<Vec<String>, OperatorError> {
    Ok(broker_users::of_tenant(conn, tenant_id).await.context("cannot list the broker users")?)
}

/// A provider account as an operator typed it.
fn account(text: &str) -> Result<ProviderAccount, OperatorError> {
    ProviderAccount::parse(text).map_err(|e| OperatorError::Invalid(format!("provider account {text:?} {e}")))
}

/// Charges tenant `tenant_id`'s new payments to `provider_account` (`None`: none), in the caller's
/// transaction: an approved `tenant_connect` proposal, or a disconnection.
pub async fn connect(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    provider_account: Option<&str>,
) -> Result<TenantView, OperatorError> {
    let account = provider_account.map(account).transpose()?;
    let tenant = find_by_id(conn, tenant_id).await?;
    if !tenants::set_provider_account(conn, tenant.tenant_id, account.as_ref()).await.map_err(refusal)? {
        return Err(OperatorError::NotFound(format!("no tenant {tenant_id}")));
    }
    Ok(TenantView::from(&Tenant { provider_account: account, ..tenant }))
}

/// The tenant named `name`, as operators see it.
pub async fn view(conn: &mut PgConnection, name: &str) -> Result<TenantView, OperatorError> {
    Ok(TenantView::from(&find(conn, name).await?))
}

/// The tenant named `name`.
pub async fn find(conn: &mut PgConnection, name: &str) -> Result<Tenant, OperatorError> {
    tenants::find_by_name(conn, name)
        .await
        .context("cannot look the tenant up")?
        .ok_or_else(|| OperatorError::NotFound(format!("no tenant named {name}")))
}

/// Tenant `tenant_id`, its row locked until the transaction ends.
pub async fn find_by_id(conn: &mut PgConnection, tenant_id: TenantId) -> Result<Tenant, OperatorError> {
    tenants::lock(conn, tenant_id)
        .await
        .context("cannot look the tenant up")?
        .ok_or_else(|| OperatorError::NotFound(format!("no tenant {tenant_id}")))
}

/// Another key for tenant `tenant_id` (a first one, or one to rotate to), in the caller's
/// transaction, for the proposer of an approved `key_issue` or `tenant_create` proposal to collect.
pub async fn issue_key(conn: &mut PgConnection, tenant_id: TenantId) -> Result<IssuedKey, OperatorError> {
    let tenant = find_by_id(conn, tenant_id).await?;
    let key = tenants::issue_api_key(conn, tenant.tenant_id, None).await.context("cannot issue the API key")?;
    Ok(IssuedKey {
        tenant: TenantView::from(&tenant),
        key_id: key.key_id.to_string(),
        api_key: api_key::reveal(&key).to_owned(),
    })
}

/// An API key as operators see it: never its secret.
#[derive(Debug, Clone)]
pub struct KeyView {
    /// Its public id.
    pub key_id: String,
    /// When it was issued.
    pub created_at: OffsetDateTime,
    /// When it was revoked, if it was.
    pub revoked_at: Option<OffsetDateTime>,
}

/// The API keys of tenant `name`, newest first.
pub async fn keys(conn: &mut PgConnection, name: &str) -> Result<Vec<KeyView>, OperatorError> {
    let tenant = find(conn, name).await?;
    let keys = sqlx::query_as!(
        KeyView,
        "SELECT key_id, created_at, revoked_at FROM api_keys WHERE tenant_id = $1 ORDER BY created_at DESC, key_id",
        tenant.tenant_id.as_uuid(),
    )
    .fetch_all(conn)
    .await
    .context("cannot read the tenant's keys")?;
    Ok(keys)
}

/// A revoked key.
#[derive(Debug, Serialize, Deserialize)]
pub struct RevokedKey {
    /// Whose.
    pub tenant: String,
    /// Which.
    pub key_id: String,
}

impl Report for RevokedKey {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "revoked key {} of tenant {}; requests presenting it get 401 within the api's auth.cache_ttl_secs",
            self.key_id, self.tenant
        )
    }

    fn json(&self) -> serde_json::Value {
        render::to_json(self)
    }
}

/// A tenant's broker users (`broker-users list`), as `GET /v1/tenants/{name}/broker-users` shows them.
#[derive(Debug, Serialize, Deserialize)]
pub struct BrokerUsers {
    /// Their names.
    pub broker_users: Vec<String>,
}

impl Report for BrokerUsers {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.broker_users.is_empty() {
            return writeln!(out, "no broker users");
        }
        for user in &self.broker_users {
            writeln!(out, "{user}")?;
        }
        Ok(())
    }

    fn json(&self) -> serde_json::Value {
        render::to_json(self)
    }
}

/// A broker user removed from a tenant (`broker-users remove`).
#[derive(Debug, Serialize, Deserialize)]
pub struct RemovedBrokerUser {
    /// Whose.
    pub tenant: String,
    /// Which.
    pub broker_user: String,
}

impl Report for RemovedBrokerUser {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "broker user {} no longer publishes for tenant {}; its messages are dead-lettered as unknown_user",
            self.broker_user, self.tenant
        )
    }

    fn json(&self) -> serde_json::Value {
        render::to_json(self)
    }
}

/// `keys revoke`: the key stops authenticating within the api's cache TTL (`auth.cache_ttl_secs`).
pub async fn revoke_key(conn: &mut PgConnection, tenant_name: &str, key_id: &str) -> Result<RevokedKey, OperatorError> {
    let parsed = KeyId::parse(key_id)
        .ok_or_else(|| OperatorError::Invalid(format!("{key_id:?} is not a key id (16 lower-case hex digits)")))?;
    let tenant = find(conn, tenant_name).await?;
    let revoked = tenants::revoke_api_key(conn, tenant.tenant_id, &parsed).await.context("cannot revoke the key")?;
    if !revoked {
        return Err(OperatorError::NotFound(format!("tenant {tenant_name} has no live key {key_id}")));
    }
    Ok(RevokedKey { tenant: tenant.name, key_id: key_id.to_owned() })
}
