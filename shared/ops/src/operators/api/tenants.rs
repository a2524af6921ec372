//! The operations API's tenants, their API keys, provider accounts and broker users, and the
//! reconciliation's runs (the work itself is `crate::tenants` and `crate::recon`), with roles,
//! tenant limits and the audit trail.
//!
//! Reads need the viewer role and show only the tenants the caller may see. A merchant's API key
//! charges and refunds, and so does a broker user's message, so what gives a tenant a key or a
//! broker user, or points it at a provider account, is proposed
//! by an admin (of every tenant, to create one) and done only once a second operator approves
//! ([`crate::operators::proposals`]); the key is then collected, once, by its proposer. Revoking a
//! key, removing a broker user and disconnecting an account move no money, and an admin does them at
//! once. Reconciliation
//! runs cover every tenant, so only operators of every tenant queue or read them.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use anyhow::Context as _;
use oncepay_domain::ids::TenantId;
use serde::Deserialize;
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::signing_in::{Caller, caller};
use super::{OperatorsState, acted, body, change, connection, ok, problem, propose, respond};
use crate::dead_letters::actions::require_reason;
use crate::operator_error::OperatorError;
use crate::operators::audit::{self, Entry, Outcome};
use crate::operators::proposals::{self, Effect, Proposed, Subject, TenantActed};
use crate::operators::reports::Acted;
use crate::operators::{Role, Scope};
use crate::recon;
use crate::tenants::{self, TenantList};

/// The routes.
pub(super) fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/v1/tenants", web::get().to(list))
        .route("/v1/tenants", web::post().to(create))
        .route("/v1/tenants/{name}/provider-account", web::put().to(connect))
        .route("/v1/tenants/{name}/keys", web::post().to(issue_key))
        .route("/v1/tenants/{name}/keys/{key_id}", web::delete().to(revoke_key))
        .route("/v1/tenants/{name}/broker-users", web::get().to(broker_users))
        .route("/v1/tenants/{name}/broker-users/{user}", web::put().to(add_broker_user))
        .route("/v1/tenants/{name}/broker-users/{user}", web::delete().to(remove_broker_user))
        .route("/v1/recon/runs", web::get().to(runs))
        .route("/v1/recon/runs", web::post().to(start_run))
        .route("/v1/recon/runs/{run_id}", web::get().to(run));
}

/// Tenant `name`'s id, if the caller may see it; one they may not is not found, as if it did not
/// exist.
pub(super) async fn see_tenant(
    conn: &mut PgConnection,
    caller: &Caller,
    name: &str,
) -> Result<TenantId, OperatorError> {
    let not_found = || OperatorError::NotFound(format!("no tenant named {name}"));
    let tenant = oncepay_store::tenants::find_by_name(conn, name).await.context("cannot look the tenant up")?;
    let tenant = tenant.ok_or_else(not_found)?;
    caller.account.see(tenant.tenant_id, not_found)?;
    Ok(tenant.tenant_id)
}

/// `GET /v1/tenants`: the tenants the caller may see, by name.
async fn list(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let mut conn = connection(&state).await?;
            let TenantList(all) = tenants::list(&mut conn).await.map_err(problem)?;
            let mut visible = Vec::with_capacity(all.len());
            for tenant in all {
                let id = tenant.tenant_id.parse().context("a stored tenant id").map_err(|e| problem(e.into()))?;
                if caller.account.scope.allows(id) {
                    visible.push(tenant);
                }
            }
            Ok(ok(StatusCode::OK, &visible))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTenant {
    name: String,
    rate_limit: Option<i32>,
    provider_account: Option<String>,
    reason: String,
}

/// `POST /v1/tenants`: 202 with the proposal to create the tenant; once approved, its proposer
/// collects its first API key (`POST /v1/proposals/{id}/key`).
async fn create(state: web::Data<OperatorsState>, request: HttpRequest, bytes: web::Bytes) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let outcome = async {
                let asked: NewTenant = body(&bytes)?;
                let provider_account = asked.provider_account.as_deref();
                propose_tenant(&state, &caller, &asked.name, asked.rate_limit, provider_account, &asked.reason).await
            };
            let entry = Entry::new("tenant.create", Outcome::Done);
            change(&state, &caller, entry, outcome.await.map(acted)).await
        }
        .await,
    )
}

/// Proposes creating tenant `name` with its first API key (an admin of every tenant proposes).
pub async fn propose_tenant(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    rate_limit: Option<i32>,
    provider_account: Option<&str>,
    reason: &str,
) -> Result<Acted, OperatorError> {
    let action = Proposed::TenantCreate {
        name: name.to_owned(),
        rate_limit,
        provider_account: provider_account.map(str::to_owned),
    };
    let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
    propose(state, &mut conn, caller, Subject::Tenant(TenantId::generate()), &action, reason).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Account {
    /// `acct_…`, or null to disconnect.
    account: Option<String>,
    reason: String,
}

/// `PUT /v1/tenants/{name}/provider-account` `{account, reason}`: 202 with the proposal to charge the
/// tenant's new payments to `account`; with `null`, 200: the tenant is disconnected at once.
async fn connect(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let outcome = async {
                let asked: Account = body(&bytes)?;
                connect_account(&state, &caller, &path, asked.account.as_deref(), &asked.reason).await
            };
            let entry = Entry::new("tenant.connect", Outcome::Done);
            change(&state, &caller, entry, outcome.await.map(acted)).await
        }
        .await,
    )
}

/// Proposes charging tenant `name`'s new payments to `account` (an admin of the tenant proposes); with
/// `None`, disconnects it at once, with its audit row: that moves no money, it stops the tenant's new
/// payments in connect mode.
pub async fn connect_account(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    account: Option<&str>,
    reason: &str,
) -> Result<Acted, OperatorError> {
    let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
    let tenant_id = see_tenant(&mut conn, caller, name).await?;
    if let Some(account) = account {
        let action = Proposed::TenantConnect { account: account.to_owned() };
        return propose(state, &mut conn, caller, Subject::Tenant(tenant_id), &action, reason).await;
    }
    caller.account.require(Role::Admin, "change a tenant's provider account")?;
    let reason = require_reason(reason)?;
    let mut tx = sqlx::Acquire::begin(&mut *conn).await.context("cannot start a transaction")?;
    let before = tenants::view(&mut tx, name).await?;
    let tenant = tenants::connect(&mut tx, tenant_id, None).await?;
    let entry = Entry::new("tenant.connect", Outcome::Done)
        .on(tenant_id, None)
        .reason(reason)
        .before(json!(before))
        .after(json!(tenant));
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the account")?;
    Ok(Acted::Done(Effect::Tenant(TenantActed { tenant, key_to_collect: None })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reason {
    reason: String,
}

/// `POST /v1/tenants/{name}/keys` `{reason}`: 202 with the proposal to issue the tenant another API
/// key; once approved, its proposer collects it (`POST /v1/proposals/{id}/key`).
async fn issue_key(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let outcome = async {
                let asked: Reason = body(&bytes)?;
                propose_key(&state, &caller, &path, &asked.reason).await
            };
            let entry = Entry::new("key.issue", Outcome::Done);
            change(&state, &caller, entry, outcome.await.map(acted)).await
        }
        .await,
    )
}

/// Proposes issuing tenant `name` another API key (an admin of the tenant proposes).
pub async fn propose_key(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    reason: &str,
) -> Result<Acted, OperatorError> {
    let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
    let tenant_id = see_tenant(&mut conn, caller, name).await?;
    propose(state, &mut conn, caller, Subject::Tenant(tenant_id), &Proposed::KeyIssue, reason).await
}

/// `GET /v1/tenants/{name}/broker-users`: the broker users that publish the tenant's payments.
async fn broker_users(state: web::Data<OperatorsState>, request: HttpRequest, path: web::Path<String>) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let mut conn = connection(&state).await?;
            let tenant_id = see_tenant(&mut conn, &caller, &path).await.map_err(problem)?;
            let users = tenants::broker_users_of(&mut conn, tenant_id).await.map_err(problem)?;
            Ok(ok(StatusCode::OK, &json!({ "broker_users": users })))
        }
        .await,
    )
}

/// `PUT /v1/tenants/{name}/broker-users/{user}` `{reason}`: 202 with the proposal to let `user`
/// publish the tenant's payments through the broker; done once a second operator approves.
async fn add_broker_user(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let (name, user) = path.into_inner();
            let outcome = async {
                let asked: Reason = body(&bytes)?;
                propose_broker_user(&state, &caller, &name, &user, &asked.reason).await
            };
            let entry = Entry::new("broker_user.map", Outcome::Done);
            change(&state, &caller, entry, outcome.await.map(acted)).await
        }
        .await,
    )
}

/// Proposes letting broker user `user` publish tenant `name`'s payments (an admin of the tenant
/// proposes).
pub async fn propose_broker_user(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    user: &str,
    reason: &str,
) -> Result<Acted, OperatorError> {
    let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
    let tenant_id = see_tenant(&mut conn, caller, name).await?;
    let action = Proposed::BrokerUser { user: user.to_owned() };
    propose(state, &mut conn, caller, Subject::Tenant(tenant_id), &action, reason).await
}

/// `DELETE /v1/tenants/{name}/broker-users/{user}` `{reason}` (admin): 204; `user`'s messages from
/// then on change nothing.
async fn remove_broker_user(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let (name, user) = path.into_inner();
            let outcome = async {
                let asked: Reason = body(&bytes)?;
                remove_broker_user_of(&state, &caller, &name, &user, &asked.reason).await
            };
            let entry = Entry::new("broker_user.unmap", Outcome::Done);
            change(&state, &caller, entry, outcome.await.map(|()| HttpResponse::NoContent().finish())).await
        }
        .await,
    )
}

/// Stops broker user `user` publishing tenant `name`'s payments (an admin of the tenant), at once
/// and with its audit row: that moves no money.
pub async fn remove_broker_user_of(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    user: &str,
    reason: &str,
) -> Result<(), OperatorError> {
    caller.account.require(Role::Admin, "remove a tenant's broker user")?;
    let reason = require_reason(reason)?;
    let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
    let tenant_id = see_tenant(&mut tx, caller, name).await?;
    tenants::unmap_broker_user(&mut tx, tenant_id, user).await?;
    let entry = Entry::new("broker_user.unmap", Outcome::Done)
        .on(tenant_id, None)
        .reason(reason)
        .before(json!({ "broker_user": user }));
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the removal")?;
    Ok(())
}

/// `POST /v1/proposals/{id}/key`: 201 with the API key an approved proposal made, shown this once,
/// to its proposer; 403 for anyone else, 409 before the approval or once collected.
pub(super) async fn collect_key(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let proposal_id = super::proposal_id_of(&path)?;
            let entry = Entry::new("key.issue", Outcome::Done).proposal(proposal_id);
            let outcome = async {
                // A key is a credential that moves money: collecting it takes a fresh sign-in.
                caller.require_fresh(state.fresh_sign_in, "collect an API key")?;
                let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
                let source = caller.source.as_deref();
                proposals::collect_key(&mut conn, &caller.account, source, proposal_id, state.limits()).await
            };
            change(&state, &caller, entry, outcome.await.map(|issued| ok(StatusCode::CREATED, &issued))).await
        }
        .await,
    )
}

/// `DELETE /v1/tenants/{name}/keys/{key_id}` `{reason}`: 204; the api refuses the key within its
/// `auth.cache_ttl_secs`.
async fn revoke_key(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let (name, key_id) = path.into_inner();
            let outcome = async {
                let asked: Reason = body(&bytes)?;
                revoke_key_of(&state, &caller, &name, &key_id, &asked.reason).await
            };
            let entry = Entry::new("key.revoke", Outcome::Done);
            change(&state, &caller, entry, outcome.await.map(|_| HttpResponse::NoContent().finish())).await
        }
        .await,
    )
}

/// Revokes API key `key_id` of tenant `name` (an admin of the tenant), at once and with its audit row:
/// revoking moves no money.
pub async fn revoke_key_of(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    key_id: &str,
    reason: &str,
) -> Result<tenants::RevokedKey, OperatorError> {
    caller.account.require(Role::Admin, "revoke an API key")?;
    let reason = require_reason(reason)?;
    let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
    let tenant_id = see_tenant(&mut tx, caller, name).await?;
    let revoked = tenants::revoke_key(&mut tx, name, key_id).await?;
    let entry = Entry::new("key.revoke", Outcome::Done).on(tenant_id, None).reason(reason).after(json!(revoked));
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the revocation")?;
    Ok(revoked)
}

/// Refuses an operator limited to some tenants: a reconciliation run covers every tenant.
pub fn every_tenant(caller: &Caller) -> Result<(), OperatorError> {
    if caller.account.scope == Scope::Every {
        return Ok(());
    }
    Err(OperatorError::Forbidden(
        "a reconciliation run covers every tenant; an operator limited to some cannot read it".into(),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewRun {
    /// Start, inclusive: a date (2026-03-01) or an RFC 3339 time.
    from: String,
    /// End, exclusive.
    to: String,
    reason: String,
}

/// `POST /v1/recon/runs` `{from, to, reason}`: queues a run of the window (operators of every
/// tenant) and answers with it, `queued`, 202. A reconciler starts it within seconds; `GET
/// /v1/recon/runs/{id}` says when it is done and what it found.
async fn start_run(state: web::Data<OperatorsState>, request: HttpRequest, bytes: web::Bytes) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let entry = Entry::new("recon.run", Outcome::Done);
            let outcome = async {
                let asked: NewRun = body(&bytes)?;
                caller.account.require(Role::Operator, "run a reconciliation")?;
                every_tenant(&caller)?;
                let reason = require_reason(&asked.reason)?;
                let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
                let run = recon::queue(&mut conn, &asked.from, &asked.to, state.recon_stale_after).await?;
                let after = json!({ "run_id": run.run_id, "window_start": asked.from, "window_end": asked.to });
                audit::record(&mut conn, &caller.actor(), &entry.clone().reason(reason).after(after)).await?;
                Ok(ok(StatusCode::ACCEPTED, &run))
            };
            change(&state, &caller, entry.clone(), outcome.await).await
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
struct RunsQuery {
    limit: Option<u32>,
}

/// `GET /v1/recon/runs[?limit=20]`: the latest runs, newest first.
async fn runs(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            every_tenant(&caller).map_err(problem)?;
            let query: RunsQuery = super::query(&request)?;
            let mut conn = connection(&state).await?;
            let list = recon::list(&mut conn, query.limit.unwrap_or(20).min(500)).await.map_err(problem)?;
            Ok(ok(StatusCode::OK, &list.0))
        }
        .await,
    )
}

/// `GET /v1/recon/runs/{id}`: a run and its discrepancies, by class.
async fn run(state: web::Data<OperatorsState>, request: HttpRequest, path: web::Path<String>) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            every_tenant(&caller).map_err(problem)?;
            let not_found = || problem(OperatorError::NotFound(format!("there is no run {:?}", path.as_str())));
            let run_id = Uuid::parse_str(&path).map_err(|_| not_found())?;
            let mut conn = connection(&state).await?;
            let detail = recon::show(&mut conn, run_id).await.map_err(problem)?;
            Ok(ok(StatusCode::OK, &detail))
        }
        .await,
    )
}
