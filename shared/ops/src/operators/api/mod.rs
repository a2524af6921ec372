//! The operations API: JSON over HTTP on a listener of its own (`operators.port`), for operators
//! with a personal token (`Authorization: Bearer oot_…`) or a session from signing in
//! ([`signing_in`]).
//!
//! Every request is authenticated here, and every change passes [`change`]: the rules refuse or the
//! action runs with its audit row in its transaction; a refusal is answered with an RFC 9457
//! problem, changes nothing, and is recorded in the audit trail on its own. An operator limited to
//! some tenants is told 404 for anything of another tenant, as if it did not exist.
//!
//! Routes (docs/operators.md, "Operators"):
//! - signing in: `POST|DELETE /v1/session`, `DELETE /v1/session/everywhere`,
//!   `GET /v1/session/oidc[/callback]`, `POST /v1/enrollment`, `PUT /v1/operators/{name}/password`
//!   ([`signing_in`]);
//! - work: `GET /v1/me`, `GET /v1/dead-letters`, `GET /v1/payments/{id}`,
//!   `POST /v1/payments/{id}/retry|resolve`, `GET /v1/proposals`,
//!   `POST /v1/proposals/{id}/approve|reject|withdraw`, `GET /v1/audit`;
//! - refunds: `POST /v1/payments/{id}/refund`, `GET /v1/dead-letters/refunds`, `GET /v1/refunds/{id}`,
//!   `POST /v1/refunds/{id}/retry|resolve` ([`refunds`]);
//! - operators: `GET|POST /v1/operators`, `PATCH|DELETE /v1/operators/{name}`,
//!   `POST /v1/operators/{name}/enrollment`, `GET|POST /v1/operators/{name}/tokens`,
//!   `DELETE /v1/tokens/{id}`;
//! - tenants, keys (`POST /v1/proposals/{id}/key` collects an approved one) and reconciliation runs
//!   ([`tenants`]);
//! - a tenant's events to merchants: `GET /v1/tenants/{name}/webhook-endpoints`,
//!   `PATCH /v1/tenants/{name}/webhook-endpoints/{id}`,
//!   `POST /v1/tenants/{name}/webhook-endpoints/{id}/replay`, `POST /v1/tenants/{name}/events/{id}/replay`
//!   ([`events`]).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_http::problem::{Problem, ProblemType};
use oncepay_provider::{ConfiguredProvider, ProviderSettings};
use oncepay_service::telemetry;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::accounts::{self, CreatedOperator, NewOperator};
use super::audit::{self, Entry, Outcome};
use super::enrollment::{self, IssuedCode};
use super::oidc::Oidc;
use super::passwords::Hashing;
use super::proposals::Effect;
use super::proposals::{self, Closing, ProposalStatus, Proposed, Subject};
use super::refunds as operator_refunds;
use super::reports::{Acted, PaymentPage};
use super::{Account, Role, Scope};
use super::{masking, sessions, tokens};
use crate::dead_letters::actions::{self, Asked, Resolution, Retry, require_reason};
use crate::dead_letters::queries::{self, Filter};
use crate::dead_letters::reports::Resolved;
use crate::operator_error::OperatorError;

pub mod bulk_retries;
pub mod events;
pub mod refunds;
pub mod signing_in;
pub mod tenants;

pub use bulk_retries::BulkRetrier;
use signing_in::{Caller, caller};

/// Largest accepted request body.
const MAX_BODY_BYTES: usize = 16 * 1024;

/// What the handlers share.
#[derive(Clone)]
pub struct OperatorsState {
    /// The database.
    pub pool: PgPool,
    /// The provider, to look up the charge a resolution names.
    pub provider: ProviderSettings,
    /// The provider's key window minus the margin, after a payment's first send.
    pub resend_horizon: Duration,
    /// How long a proposal waits for an approver.
    pub proposal_ttl: Duration,
    /// How long a token works when the request names no lifetime.
    pub token_ttl: Duration,
    /// The longest a token may work.
    pub max_token_ttl: Duration,
    /// Whether every resend is a proposal (a resend past the key window always is).
    pub retries_need_approval: bool,
    /// How sessions and sign-ins are limited, and who may sign in with a local password.
    pub sessions: sessions::Policy,
    /// The bound on password hashes running at once in this process.
    pub hashing: Arc<Hashing>,
    /// How long an enrollment code works.
    pub enrollment_ttl: Duration,
    /// How recent a session's sign-in must be for its operator to approve a proposal.
    pub fresh_sign_in: Duration,
    /// The organisation's OpenID provider, when one is configured.
    pub oidc: Option<std::sync::Arc<Oidc>>,
    /// How old a running reconciliation run's heartbeat may get before an operator's run of its
    /// window takes it over (`recon.stale_after_secs`).
    pub recon_stale_after: Duration,
}

impl OperatorsState {
    pub fn limits(&self) -> proposals::Limits {
        proposals::Limits { ttl: self.proposal_ttl, resend_horizon: self.resend_horizon }
    }
}

/// The routes, for an app that holds an [`OperatorsState`]. The console, when the app has one,
/// is configured first: it answers a browser on the OpenID callback before this JSON route does.
pub fn configure(config: &mut web::ServiceConfig) {
    config
        .app_data(web::PayloadConfig::new(MAX_BODY_BYTES))
        .route("/v1/session", web::post().to(signing_in::sign_in))
        .route("/v1/session", web::delete().to(signing_in::sign_out))
        .route("/v1/session/everywhere", web::delete().to(signing_in::sign_out_everywhere))
        .route("/v1/session/oidc", web::get().to(signing_in::oidc_begin))
        .route("/v1/session/oidc/callback", web::get().to(oidc_callback))
        .route("/v1/enrollment", web::post().to(signing_in::enroll))
        .route("/v1/operators/{name}/password", web::put().to(signing_in::set_password))
        .route("/v1/operators/{name}/enrollment", web::post().to(reset_enrollment))
        .route("/v1/me", web::get().to(me))
        .route("/v1/dead-letters", web::get().to(dead_letters))
        .route("/v1/payments/{payment_id}", web::get().to(payment))
        .route("/v1/payments/{payment_id}/retry", web::post().to(retry))
        .route("/v1/payments/{payment_id}/resolve", web::post().to(resolve))
        .route("/v1/proposals", web::get().to(list_proposals))
        // Before the decisions, which would take `key` for one.
        .route("/v1/proposals/{proposal_id}/key", web::post().to(tenants::collect_key))
        .route("/v1/proposals/{proposal_id}/{decision}", web::post().to(decide))
        .route("/v1/audit", web::get().to(audit_trail))
        .route("/v1/operators", web::get().to(list_operators))
        .route("/v1/operators", web::post().to(create_operator))
        .route("/v1/operators/{name}", web::patch().to(update_operator))
        .route("/v1/operators/{name}", web::delete().to(disable_operator))
        .route("/v1/operators/{name}/tokens", web::get().to(list_tokens))
        .route("/v1/operators/{name}/tokens", web::post().to(issue_token))
        .route("/v1/tokens/{token_id}", web::delete().to(revoke_token))
        .configure(tenants::configure)
        .configure(events::configure)
        .configure(refunds::configure)
        .default_service(web::to(not_found));
}

/// A response, or the problem that stands for it.
type Responded = Result<HttpResponse, Problem>;

/// `GET /v1/session/oidc/callback?code=…&state=…`: where the OpenID provider sends the browser
/// back ([`signing_in::oidc_session`]). 200 with the session cookie and who signed in. (A browser,
/// one that accepts HTML, gets the console's page instead, where there is a console.)
async fn oidc_callback(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    let signed_in = signing_in::oidc_session(&state, &request).await;
    respond(signed_in.map(|session| {
        let a = &session.account;
        let who = json!({ "name": a.name, "role": a.role, "expires_at": session.expires_at.unix_timestamp() });
        signing_in::with_oidc_session(&state, ok(StatusCode::OK, &who), &session)
    }))
}

/// Answers a change that ran: on success its answer; on a refusal (bad input, a role too weak, a
/// state it does not apply to, something not found) the problem, after recording the refusal with
/// `entry`'s action in a transaction of its own.
pub async fn change(
    state: &OperatorsState,
    caller: &Caller,
    entry: Entry,
    outcome: Result<HttpResponse, OperatorError>,
) -> Responded {
    match outcome {
        Ok(response) => Ok(response),
        // Nothing was decided: nothing to record.
        Err(unchecked @ (OperatorError::Failed(_) | OperatorError::Busy(_))) => Err(problem(unchecked)),
        Err(refusal) => {
            let entry = entry.refused(refusal.to_string());
            let recorded = async {
                let mut conn = connection(state).await?;
                audit::record(&mut conn, &caller.actor(), &entry).await.map_err(problem)
            };
            if let Err(failed) = recorded.await {
                tracing::error!(detail = failed.detail, "cannot record a refusal in the audit trail");
            }
            Err(problem(refusal))
        }
    }
}

/// The problem for an operator command's failure.
pub fn problem(error: OperatorError) -> Problem {
    match error {
        OperatorError::Invalid(detail) => Problem::new(ProblemType::InvalidRequest, detail),
        OperatorError::NotFound(detail) => Problem::new(ProblemType::NotFound, detail),
        OperatorError::Refused(detail) => Problem::new(ProblemType::Refused, detail),
        OperatorError::Forbidden(detail) => Problem::new(ProblemType::Forbidden, detail),
        OperatorError::Busy(detail) => Problem::new(ProblemType::ServiceUnavailable, detail).with_retry_after(1),
        OperatorError::Failed(error) => {
            // The cause (SQL, the provider's answer) goes to the log, never to the client.
            tracing::error!(error = format!("{error:#}"), "an operator request failed");
            Problem::new(
                ProblemType::ServiceUnavailable,
                "the request failed underneath (the database or the provider); the reconciler's log has the cause",
            )
        }
    }
}

pub async fn connection(state: &OperatorsState) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, Problem> {
    state.pool.acquire().await.map_err(|error| {
        tracing::error!(error = %telemetry::error_chain(&error), "the operations API cannot reach the database");
        Problem::new(ProblemType::ServiceUnavailable, "the database cannot be reached; nothing was done")
    })
}

fn respond(result: Responded) -> HttpResponse {
    result.unwrap_or_else(|problem| problem.to_response())
}

fn ok(status: StatusCode, body: &impl serde::Serialize) -> HttpResponse {
    HttpResponse::build(status).json(body)
}

/// Reads a JSON body; a body that is not the expected JSON is a 400 problem.
fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, OperatorError> {
    serde_json::from_slice(bytes)
        .map_err(|error| OperatorError::Invalid(format!("the body is not the expected JSON: {error}")))
}

fn payment_id(text: &str) -> Result<PaymentId, Problem> {
    PaymentId::from_str(text).map_err(|_| Problem::new(ProblemType::NotFound, format!("there is no payment {text:?}")))
}

/// `GET /v1/me`: who the token acts as.
async fn me(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let a = &caller.account;
            Ok(ok(
                StatusCode::OK,
                &json!({ "name": a.name, "role": a.role, "tenants": tenant_names(&state, a).await? }),
            ))
        }
        .await,
    )
}

async fn tenant_names(state: &OperatorsState, account: &Account) -> Result<Option<Vec<String>>, Problem> {
    let Some(ids) = account.scope.to_column() else { return Ok(None) };
    let mut conn = connection(state).await?;
    let names = sqlx::query_scalar!("SELECT name FROM tenants WHERE tenant_id = ANY ($1) ORDER BY name", &ids)
        .fetch_all(&mut *conn)
        .await
        .context("cannot read the tenants")
        .map_err(|e| problem(OperatorError::Failed(e)))?;
    Ok(Some(names))
}

#[derive(Debug, Deserialize)]
struct DeadLetterQuery {
    /// Resolved entries too.
    #[serde(default)]
    all: bool,
}

/// `GET /v1/dead-letters[?all=true]`: open entries (or every entry), oldest first, of the tenants
/// the caller may see, their evidence masked.
async fn dead_letters(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let query: DeadLetterQuery = query(&request)?;
            let filter = if query.all { Filter::All } else { Filter::Open };
            let scope = caller.account.scope.to_column();
            let mut conn = connection(&state).await?;
            let mut list = queries::list(&mut conn, filter, scope.as_deref()).await.map_err(problem)?;
            // A list is not a read of one payment: it shows no customer data, to anyone.
            for entry in &mut list.0 {
                entry.evidence = masking::evidence(&entry.evidence);
            }
            Ok(ok(StatusCode::OK, &list.0))
        }
        .await,
    )
}

pub fn query<T: DeserializeOwned>(request: &HttpRequest) -> Result<T, Problem> {
    web::Query::<T>::from_query(request.query_string())
        .map(web::Query::into_inner)
        .map_err(|error| Problem::new(ProblemType::InvalidRequest, format!("the query string is wrong: {error}")))
}

/// `GET /v1/payments/{id}`: a payment's dead letters, history, refunds, proposals and operator audit
/// rows, and what it asked of the customer (masked for viewers, with the evidence). The read is
/// audited.
async fn payment(state: web::Data<OperatorsState>, request: HttpRequest, path: web::Path<String>) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let payment_id = payment_id(&path)?;
            let mut conn = connection(&state).await?;
            let scope = &caller.account.scope;
            let tenant_id = queries::payment_tenant(&mut conn, scope.to_column().as_deref(), payment_id)
                .await
                .map_err(problem)?
                .ok_or_else(|| problem(OperatorError::NotFound(format!("there is no payment {payment_id}"))))?;
            let mut detail = queries::detail(&mut conn, tenant_id, payment_id).await.map_err(problem)?;
            let refunds = operator_refunds::of_payment(&mut conn, tenant_id, payment_id).await.map_err(problem)?;
            let masked = caller.account.role == Role::Viewer;
            if masked {
                for entry in &mut detail.entries {
                    entry.evidence = masking::evidence(&entry.evidence);
                }
                for change in &mut detail.audit_trail {
                    change.detail = change.detail.as_ref().map(masking::evidence);
                }
            }
            let customer = customer(&mut conn, tenant_id, payment_id, masked).await.map_err(problem)?;
            let proposals = proposals::list(&mut conn, scope, Some(payment_id), None).await.map_err(problem)?;
            let filter = audit::Filter { payment_id: Some(payment_id), limit: 500, ..audit::Filter::default() };
            let operator_audit = audit::list(&mut conn, &filter, scope).await.map_err(problem)?;
            let read = Entry::new("payment.read", Outcome::Done)
                .payment(tenant_id, payment_id)
                .detail(json!({ "customer_data": if masked { "masked" } else { "shown" } }));
            audit::record(&mut conn, &caller.actor(), &read).await.map_err(problem)?;
            let page = PaymentPage {
                payment_id,
                tenant_id,
                customer,
                entries: detail.entries,
                history: detail.audit_trail,
                refunds,
                proposals,
                operator_audit,
            };
            Ok(ok(StatusCode::OK, &page))
        }
        .await,
    )
}

/// What the payment asked of the customer: whole for operators, masked for viewers (who see that
/// there is a customer reference, not what it is).
async fn customer(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
    masked: bool,
) -> Result<Value, OperatorError> {
    let row = sqlx::query!(
        "SELECT customer_id, description, metadata, payment_method FROM payments WHERE tenant_id = $1 AND payment_id = $2",
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_one(conn)
    .await
    .context("cannot read the payment")?;
    if masked {
        return Ok(json!({
            "masked": true,
            "customer_id": masking::reference(&row.customer_id),
            "payment_method": row.payment_method.as_deref().map(masking::reference),
        }));
    }
    Ok(json!({
        "masked": false,
        "customer_id": row.customer_id,
        "description": row.description,
        "metadata": row.metadata,
        "payment_method": row.payment_method,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    reason: String,
    #[serde(default)]
    outside_key_window: bool,
}

/// `POST /v1/payments/{id}/retry`: resends a dead-lettered payment (200), or proposes the resend
/// (202) when it is past the provider's key window or every resend needs approval.
async fn retry(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let payment_id = payment_id(&path)?;
            let entry = Entry::new("payment.retry", Outcome::Done).on_payment(payment_id);
            let outcome = async {
                let asked: RetryBody = body(&bytes)?;
                let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
                retry_payment(&state, &mut conn, &caller, payment_id, &asked.reason, asked.outside_key_window).await
            };
            change(&state, &caller, entry, outcome.await.map(acted)).await
        }
        .await,
    )
}

/// 200 with what was done, or 202 with the proposal that waits for an approver.
fn acted(acted: Acted) -> HttpResponse {
    let status = if matches!(acted, Acted::Proposed { .. }) { StatusCode::ACCEPTED } else { StatusCode::OK };
    ok(status, &acted)
}

/// Resends dead-lettered payment `payment_id`, or proposes the resend when it is past the provider's
/// key window or every resend needs approval. On `conn`, in a transaction of its own (a savepoint,
/// when `conn` is already in one). A refused change is the caller's to record ([`change`]).
pub async fn retry_payment(
    state: &OperatorsState,
    conn: &mut PgConnection,
    caller: &Caller,
    payment_id: PaymentId,
    reason: &str,
    outside_key_window: bool,
) -> Result<Acted, OperatorError> {
    caller.account.require(Role::Operator, "retry a payment")?;
    if outside_key_window || state.retries_need_approval {
        let action = Proposed::Retry { outside_key_window };
        return propose(state, conn, caller, Subject::Payment(payment_id), &action, reason).await;
    }
    let entry = Entry::new("payment.retry", Outcome::Done).on_payment(payment_id);
    let done = directly(conn, caller, entry, payment_id, reason, Direct::Retry, state).await?;
    Ok(Acted::Done(Effect::Payment(done)))
}

/// An action on a dead letter that needs no second operator.
#[derive(Debug, Clone, Copy)]
enum Direct {
    /// Resend within the provider's key window.
    Retry,
    /// Acknowledge a conflict on a terminal payment.
    Acknowledge,
}

/// Does `direct` on the payment's open dead letter, with its audit row, in one transaction.
async fn directly(
    conn: &mut PgConnection,
    caller: &Caller,
    entry: Entry,
    payment_id: PaymentId,
    reason: &str,
    direct: Direct,
    state: &OperatorsState,
) -> Result<Resolved, OperatorError> {
    let mut tx = sqlx::Acquire::begin(conn).await.context("cannot start a transaction")?;
    let seen = queries::snapshot(&mut tx, payment_id).await?;
    caller.account.see(seen.tenant_id, || no_open_entry(payment_id))?;
    let operator = caller.account.actor()?;
    let done = match direct {
        Direct::Retry => {
            let resend = Retry {
                payment_id,
                operator: &operator,
                reason,
                resend_horizon: state.resend_horizon,
                outside_key_window: false,
            };
            actions::retry(&mut tx, &resend).await?
        }
        Direct::Acknowledge => {
            actions::resolve(&mut tx, payment_id, &Resolution::Acknowledge, &operator, reason).await?
        }
    };
    let entry = entry.payment(seen.tenant_id, payment_id).reason(reason).before(json!(seen)).after(json!(done));
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the action")?;
    Ok(done)
}

fn no_open_entry(payment_id: PaymentId) -> OperatorError {
    OperatorError::NotFound(format!("payment {payment_id} has no open dead letter"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    /// `succeeded`, `failed` or `acknowledged`.
    #[serde(rename = "as")]
    outcome: ResolveAs,
    reason: String,
    charge_id: Option<String>,
    amount: Option<Amount>,
    currency: Option<Currency>,
    charged_at: Option<String>,
    #[serde(default)]
    force: bool,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ResolveAs {
    Succeeded,
    Failed,
    Acknowledged,
}

/// `POST /v1/payments/{id}/resolve`: acknowledges a conflict (200), or proposes settling the
/// payment as succeeded or failed (202), for an approver.
async fn resolve(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let payment_id = payment_id(&path)?;
            let entry = Entry::new("payment.resolve", Outcome::Done).on_payment(payment_id);
            let outcome = async {
                let asked: ResolveBody = body(&bytes)?;
                let decision = match asked.outcome {
                    ResolveAs::Acknowledged => Asked::Acknowledge,
                    ResolveAs::Failed => Asked::Failed { charge_id: asked.charge_id, force: asked.force },
                    ResolveAs::Succeeded => Asked::Succeeded {
                        charge_id: asked.charge_id,
                        amount: asked.amount,
                        currency: asked.currency,
                        charged_at: asked.charged_at,
                    },
                };
                resolve_payment(&state, &caller, payment_id, decision, &asked.reason).await
            };
            change(&state, &caller, entry, outcome.await.map(acted)).await
        }
        .await,
    )
}

/// Acknowledges a conflict on `payment_id` at once, or proposes settling it as succeeded or failed,
/// for an approver. A refused change is the caller's to record ([`change`]).
pub async fn resolve_payment(
    state: &OperatorsState,
    caller: &Caller,
    payment_id: PaymentId,
    decision: Asked,
    reason: &str,
) -> Result<Acted, OperatorError> {
    caller.account.require(Role::Operator, "resolve a payment")?;
    let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
    if matches!(decision, Asked::Acknowledge) {
        let entry = Entry::new("payment.resolve", Outcome::Done).on_payment(payment_id);
        let done = directly(&mut conn, caller, entry, payment_id, reason, Direct::Acknowledge, state).await?;
        return Ok(Acted::Done(Effect::Payment(done)));
    }
    // Scope first: looking the charge up must not tell a limited operator that the payment exists.
    let (tenant_id, _) = queries::open_payment(&mut conn, payment_id).await?;
    caller.account.see(tenant_id, || no_open_entry(payment_id))?;
    let provider = || {
        ConfiguredProvider::new(&state.provider)
            .context("cannot build the provider client")
            .map_err(OperatorError::Failed)
    };
    let resolution = actions::resolution(&mut conn, provider, payment_id, decision).await?;
    let action = Proposed::resolution(resolution)?;
    propose(state, &mut conn, caller, Subject::Payment(payment_id), &action, reason).await
}

/// Proposes `action` on `subject` as the caller, to wait for an approver.
async fn propose(
    state: &OperatorsState,
    conn: &mut PgConnection,
    caller: &Caller,
    subject: Subject,
    action: &Proposed,
    reason: &str,
) -> Result<Acted, OperatorError> {
    let source = caller.source.as_deref();
    let proposal = proposals::propose(conn, &caller.account, source, subject, action, reason, state.limits()).await?;
    Ok(Acted::Proposed { proposal })
}

#[derive(Debug, Deserialize)]
struct ProposalQuery {
    status: Option<ProposalStatus>,
    payment_id: Option<PaymentId>,
}

/// `GET /v1/proposals[?status=pending][&payment_id=…]`: newest first.
async fn list_proposals(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let query: ProposalQuery = query(&request)?;
            let mut conn = connection(&state).await?;
            let scope = &caller.account.scope;
            let list = proposals::list(&mut conn, scope, query.payment_id, query.status).await.map_err(problem)?;
            Ok(ok(StatusCode::OK, &list))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionBody {
    reason: String,
}

/// `POST /v1/proposals/{id}/approve|reject|withdraw`.
async fn decide(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let (proposal_id, decision) = path.into_inner();
            let proposal_id = proposal_id_of(&proposal_id)?;
            let decision = Decision::from_path(&decision)?;
            let entry = Entry::new(decision.audit_action(), Outcome::Done).proposal(proposal_id);
            let outcome = async {
                let asked: DecisionBody = body(&bytes)?;
                decide_proposal(&state, &caller, proposal_id, decision, &asked.reason).await
            };
            change(&state, &caller, entry, outcome.await.map(|decided| ok(StatusCode::OK, &decided))).await
        }
        .await,
    )
}

fn proposal_id_of(text: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(text).map_err(|_| Problem::new(ProblemType::NotFound, format!("there is no proposal {text:?}")))
}

/// What an operator decides about a proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Do it (an approver, on someone else's proposal, with a fresh sign-in).
    Approve,
    /// Close it undone: reject (an approver) or withdraw (its maker).
    Close(Closing),
}

impl Decision {
    /// From the last segment of `/v1/proposals/{id}/{decision}`.
    pub fn from_path(text: &str) -> Result<Self, Problem> {
        match text {
            "approve" => Ok(Self::Approve),
            "reject" => Ok(Self::Close(Closing::Reject)),
            "withdraw" => Ok(Self::Close(Closing::Withdraw)),
            _ => Err(Problem::new(ProblemType::NotFound, "a proposal can be approved, rejected or withdrawn")),
        }
    }

    pub const fn audit_action(self) -> &'static str {
        match self {
            Self::Approve => "proposal.approve",
            Self::Close(Closing::Reject) => "proposal.reject",
            Self::Close(Closing::Withdraw) => "proposal.withdraw",
        }
    }
}

/// What a decision did.
#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
pub enum Decided {
    /// Approved, and done.
    Approved(proposals::Approved),
    /// Closed undone.
    Closed(proposals::ProposalView),
}

/// Approves, rejects or withdraws proposal `proposal_id`. A refused change is the caller's to record
/// ([`change`]).
pub async fn decide_proposal(
    state: &OperatorsState,
    caller: &Caller,
    proposal_id: Uuid,
    decision: Decision,
    reason: &str,
) -> Result<Decided, OperatorError> {
    let mut conn = state.pool.acquire().await.context("cannot reach the database")?;
    let source = caller.source.as_deref();
    match decision {
        Decision::Approve => {
            caller.require_fresh(state.fresh_sign_in, "approve a proposal")?;
            let approved =
                proposals::approve(&mut conn, &caller.account, source, proposal_id, reason, state.limits()).await?;
            Ok(Decided::Approved(approved))
        }
        Decision::Close(how) => {
            let closed = proposals::close(&mut conn, &caller.account, source, proposal_id, how, reason).await?;
            Ok(Decided::Closed(closed))
        }
    }
}

#[derive(Debug, Deserialize)]
struct AuditQuery {
    operator: Option<String>,
    tenant_id: Option<TenantId>,
    payment_id: Option<PaymentId>,
    action: Option<String>,
    before: Option<i64>,
    /// RFC 3339: only rows written at or after it.
    #[serde(default, with = "time::serde::rfc3339::option")]
    since: Option<time::OffsetDateTime>,
    /// RFC 3339: only rows written before it.
    #[serde(default, with = "time::serde::rfc3339::option")]
    until: Option<time::OffsetDateTime>,
    limit: Option<i64>,
}

/// `GET /v1/audit[?operator=][&tenant_id=][&payment_id=][&action=][&since=][&until=][&before=][&limit=]`:
/// newest first; `before` is the smallest `audit_id` of the previous page, `since` and `until`
/// RFC 3339 times.
async fn audit_trail(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let query: AuditQuery = query(&request)?;
            let limit = query.limit.unwrap_or(100);
            if !(1..=1000).contains(&limit) {
                return Err(Problem::new(ProblemType::InvalidRequest, "limit must be between 1 and 1000"));
            }
            let filter = audit::Filter {
                operator: query.operator,
                tenant_id: query.tenant_id,
                payment_id: query.payment_id,
                action: query.action,
                before_id: query.before,
                since: query.since,
                until: query.until,
                limit,
            };
            let mut conn = connection(&state).await?;
            let rows = audit::list(&mut conn, &filter, &caller.account.scope).await.map_err(problem)?;
            Ok(ok(StatusCode::OK, &rows))
        }
        .await,
    )
}

/// `GET /v1/operators` (admin).
async fn list_operators(state: web::Data<OperatorsState>, request: HttpRequest) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            manage_operators(&caller, "list the operators").map_err(problem)?;
            let mut conn = connection(&state).await?;
            Ok(ok(StatusCode::OK, &accounts::list(&mut conn).await.map_err(problem)?))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewOperatorBody {
    name: String,
    role: Role,
    /// Tenant names; absent for every tenant.
    tenants: Option<Vec<String>>,
    /// The identity at the OpenID provider they sign in as.
    oidc_subject: Option<String>,
    reason: String,
}

/// `POST /v1/operators` (admin): 201 with the new account and, for a local account, its
/// enrollment code.
async fn create_operator(state: web::Data<OperatorsState>, request: HttpRequest, bytes: web::Bytes) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let outcome = async {
                let asked: NewOperatorBody = body(&bytes)?;
                let new = NewOperator {
                    name: &asked.name,
                    role: asked.role,
                    tenants: asked.tenants.as_deref(),
                    oidc_subject: asked.oidc_subject.as_deref(),
                };
                make_operator(&state, &caller, &new, &asked.reason).await
            };
            let entry = Entry::new("operator.create", Outcome::Done);
            change(&state, &caller, entry, outcome.await.map(|created| ok(StatusCode::CREATED, &created))).await
        }
        .await,
    )
}

/// Makes operator `new` (an admin of every tenant), with its audit row, and an enrollment code when
/// they are to sign in with a local password.
pub async fn make_operator(
    state: &OperatorsState,
    caller: &Caller,
    new: &NewOperator<'_>,
    reason: &str,
) -> Result<CreatedOperator, OperatorError> {
    manage_operators(caller, "create an operator")?;
    let reason = require_reason(reason)?;
    let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
    let created = accounts::create(&mut tx, new, &caller.account.name).await?;
    let enrollment = if created.oidc_subject.is_none() && state.sessions.local.allow(&created.name) {
        let (id, name) = (created.operator_id, created.name.as_str());
        Some(enrollment::issue(&mut tx, id, name, caller.account.operator_id, state.enrollment_ttl).await?)
    } else {
        None
    };
    let code_expires_at = enrollment.as_ref().map(|code| code.expires_at.unix_timestamp());
    let after = json!({ "operator": created, "enrollment_code_expires_at": code_expires_at });
    let entry = Entry::new("operator.create", Outcome::Done).reason(reason).after(after);
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the new operator")?;
    Ok(CreatedOperator { operator: created, enrollment })
}

/// `POST /v1/operators/{name}/enrollment` `{reason}` (admin of every tenant, for another operator):
/// 201 with a fresh enrollment code for one who lost their password.
async fn reset_enrollment(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let outcome = async {
                let asked: DecisionBody = body(&bytes)?;
                fresh_code(&state, &caller, &path, &asked.reason).await
            };
            let entry = Entry::new("operator.enrollment", Outcome::Done);
            change(&state, &caller, entry, outcome.await.map(|issued| ok(StatusCode::CREATED, &issued))).await
        }
        .await,
    )
}

/// Issues operator `name` a fresh enrollment code, as an admin of every tenant: their local password
/// is removed, their sessions end and their tokens are revoked at once (whoever knows the old
/// password can no longer use it or what it made), and the code replaces any earlier one.
pub async fn fresh_code(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    reason: &str,
) -> Result<IssuedCode, OperatorError> {
    manage_operators(caller, "issue an operator an enrollment code")?;
    let reason = require_reason(reason)?;
    if caller.account.name == name {
        return Err(OperatorError::Forbidden(
            "nobody issues themself an enrollment code: change your password with the old one, or ask another admin"
                .into(),
        ));
    }
    if !state.sessions.local.allow(name) {
        return Err(OperatorError::Refused(format!(
            "{name} may not have a local password: with an OpenID provider configured, only the break-glass account \
             has one; they sign in at the provider"
        )));
    }
    let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
    let owner = accounts::find(&mut tx, name).await?;
    let ended = sessions::store_password(&mut tx, owner.operator_id, None, None).await?;
    let issued =
        enrollment::issue(&mut tx, owner.operator_id, &owner.name, caller.account.operator_id, state.enrollment_ttl)
            .await?;
    let after = json!({
        "operator": owner.name, "password": "removed", "sessions_ended": ended.sessions,
        "tokens_revoked": ended.tokens, "enrollment_code_expires_at": issued.expires_at.unix_timestamp(),
    });
    let entry = Entry::new("operator.enrollment", Outcome::Done).reason(reason).after(after);
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the enrollment code")?;
    Ok(issued)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangesBody {
    role: Option<Role>,
    /// Tenant names the operator is limited to from now on.
    tenants: Option<Vec<String>>,
    /// Every tenant from now on.
    #[serde(default)]
    every_tenant: bool,
    reason: String,
}

/// `PATCH /v1/operators/{name}` `{role?, tenants? | every_tenant?, reason}` (admin): another
/// operator's role or tenants, changed.
async fn update_operator(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let outcome = async {
                let asked: ChangesBody = body(&bytes)?;
                let tenants = match (asked.every_tenant, asked.tenants) {
                    (true, Some(_)) => {
                        return Err(OperatorError::Invalid("give tenants or every_tenant, not both".into()));
                    }
                    (true, None) => Some(None),
                    (false, tenants) => tenants.map(Some),
                };
                change_operator(&state, &caller, &path, asked.role, tenants, &asked.reason).await
            };
            let entry = Entry::new("operator.update", Outcome::Done);
            change(&state, &caller, entry, outcome.await.map(|after| ok(StatusCode::OK, &after))).await
        }
        .await,
    )
}

/// Changes another operator's `role` and `tenants` (`Some(None)`: every tenant), as an admin of
/// every tenant, with its audit row.
pub async fn change_operator(
    state: &OperatorsState,
    caller: &Caller,
    name: &str,
    role: Option<Role>,
    tenants: Option<Option<Vec<String>>>,
    reason: &str,
) -> Result<accounts::OperatorView, OperatorError> {
    manage_operators(caller, "change an operator")?;
    let reason = require_reason(reason)?;
    let changes = accounts::Changes { role, tenants: tenants.as_ref().map(|t| t.as_deref()) };
    let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
    let (before, after) = accounts::update(&mut tx, &caller.account, name, &changes).await?;
    let entry = Entry::new("operator.update", Outcome::Done).reason(reason).before(json!(before)).after(json!(after));
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the change")?;
    Ok(after)
}

/// `DELETE /v1/operators/{name}` `{reason}` (admin): another operator disabled, their tokens and
/// sessions with them (204).
async fn disable_operator(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let outcome = async {
                let asked: DecisionBody = body(&bytes)?;
                disable(&state, &caller, &path, &asked.reason).await
            };
            let entry = Entry::new("operator.disable", Outcome::Done);
            change(&state, &caller, entry, outcome.await.map(|()| HttpResponse::NoContent().finish())).await
        }
        .await,
    )
}

/// Disables another operator, their tokens and sessions with them (an admin of every tenant),
/// with its audit row.
pub async fn disable(state: &OperatorsState, caller: &Caller, name: &str, reason: &str) -> Result<(), OperatorError> {
    manage_operators(caller, "disable an operator")?;
    let reason = require_reason(reason)?;
    let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
    let before = accounts::disable(&mut tx, &caller.account, name).await?;
    let entry = Entry::new("operator.disable", Outcome::Done)
        .reason(reason)
        .before(json!(before))
        .after(json!({ "disabled": true }));
    audit::record(&mut tx, &caller.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the change")?;
    Ok(())
}

/// Only the operator themself or an admin may see or issue an operator's tokens.
fn own_or_admin(caller: &Caller, name: &str, to: &str) -> Result<(), OperatorError> {
    if caller.account.name == name { Ok(()) } else { manage_operators(caller, to) }
}

/// Only an admin of every tenant manages operators: one limited to some tenants could otherwise make
/// or take over an account that sees every tenant.
pub fn manage_operators(caller: &Caller, to: &str) -> Result<(), OperatorError> {
    caller.account.require(Role::Admin, to)?;
    if caller.account.scope != Scope::Every {
        return Err(OperatorError::Forbidden(format!(
            "{} is an admin of some tenants only; only an admin of every tenant may {to}",
            caller.account.name
        )));
    }
    Ok(())
}

/// `GET /v1/operators/{name}/tokens`: the operator's own, or anyone's for an admin of every tenant.
async fn list_tokens(state: web::Data<OperatorsState>, request: HttpRequest, path: web::Path<String>) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            own_or_admin(&caller, &path, "list another operator's tokens").map_err(problem)?;
            let mut conn = connection(&state).await?;
            let owner = accounts::find(&mut conn, &path).await.map_err(problem)?;
            Ok(ok(StatusCode::OK, &tokens::list(&mut conn, owner.operator_id).await.map_err(problem)?))
        }
        .await,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTokenBody {
    label: String,
    expires_in_days: Option<u32>,
    reason: String,
}

/// `POST /v1/operators/{name}/tokens`: 201 with the token, shown this once.
async fn issue_token(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(async {
        let caller = caller(&state, &request).await?;
        let entry = Entry::new("token.issue", Outcome::Done);
        change(&state, &caller, entry.clone(), async {
            let asked: NewTokenBody = body(&bytes)?;
            own_or_admin(&caller, &path, "issue a token to another operator")?;
            // A token outlives the session it is issued from: only a fresh sign-in may issue one.
            caller.require_fresh(state.fresh_sign_in, "issue a token")?;
            let reason = require_reason(&asked.reason)?;
            let ttl = asked.expires_in_days.map_or(state.token_ttl, |days| Duration::from_secs(u64::from(days) * 86_400));
            if ttl.is_zero() || ttl > state.max_token_ttl {
                return Err(OperatorError::Invalid(format!(
                    "expires_in_days must be between 1 and {}",
                    state.max_token_ttl.as_secs() / 86_400
                )));
            }
            let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
            let owner = accounts::find(&mut tx, &path).await?;
            let made_by = signing_in::made_by(&caller, &owner);
                    let issued =
                        tokens::issue(&mut tx, owner.operator_id, &owner.name, &asked.label, ttl, made_by).await?;
            let after = json!({ "operator": owner.name, "token_id": issued.token_id, "expires_at": issued.expires_at.unix_timestamp() });
            audit::record(&mut tx, &caller.actor(), &entry.reason(reason).after(after)).await?;
            tx.commit().await.context("cannot commit the token")?;
            Ok(ok(StatusCode::CREATED, &issued))
        }.await)
        .await
    }.await)
}

/// `DELETE /v1/tokens/{id}` with `{"reason": …}`: one's own token, or anyone's for an admin of every
/// tenant.
async fn revoke_token(
    state: web::Data<OperatorsState>,
    request: HttpRequest,
    path: web::Path<String>,
    bytes: web::Bytes,
) -> HttpResponse {
    respond(
        async {
            let caller = caller(&state, &request).await?;
            let token_id = Uuid::parse_str(&path)
                .map_err(|_| Problem::new(ProblemType::NotFound, format!("there is no token {:?}", path.as_str())))?;
            let entry = Entry::new("token.revoke", Outcome::Done);
            change(
                &state,
                &caller,
                entry.clone(),
                async {
                    let asked: DecisionBody = body(&bytes)?;
                    let reason = require_reason(&asked.reason)?;
                    let mut tx = state.pool.begin().await.context("cannot start a transaction")?;
                    let owner = tokens::revoke(&mut tx, &caller.account, token_id).await?;
                    let after = json!({ "operator": owner, "token_id": token_id, "revoked": true });
                    audit::record(&mut tx, &caller.actor(), &entry.reason(reason).after(after)).await?;
                    tx.commit().await.context("cannot commit the revocation")?;
                    Ok(HttpResponse::NoContent().finish())
                }
                .await,
            )
            .await
        }
        .await,
    )
}

/// Any other path: a problem+json 404.
async fn not_found() -> HttpResponse {
    Problem::new(ProblemType::NotFound, "there is nothing here").to_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resolve_body_reads_its_money_typed_and_refuses_a_bad_amount_or_currency_by_name() {
        let resolve = |amount: Value, currency: &str| {
            let text = json!({
                "as": "succeeded", "reason": "seen", "charge_id": "ch_1", "amount": amount, "currency": currency,
                "charged_at": "2026-01-10T12:00:00Z",
            })
            .to_string();
            body::<ResolveBody>(text.as_bytes())
        };

        let asked = resolve(json!(1999), "EUR").unwrap();
        let too_much = resolve(json!(Amount::MAX + 1), "EUR").unwrap_err().to_string();
        let lower = resolve(json!(1999), "eur").unwrap_err().to_string();

        assert_eq!((asked.amount, asked.currency), (Amount::new(1999).ok(), Currency::parse("EUR").ok()));
        assert!(too_much.contains("amount 1000000000001 must be an integer number of minor units"), "{too_much}");
        assert!(lower.contains(r#"currency "eur" must be three upper-case letters"#), "{lower}");
    }
}
