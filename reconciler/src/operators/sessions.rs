//! Signing in with a local password, and the browser sessions that follow: kept in PostgreSQL,
//! carried by an HttpOnly, Secure, SameSite=Strict cookie, ended when idle too long, at their
//! absolute expiry, on signing out, or everywhere at once.
//!
//! Sign-ins are rate-limited per operator name: after `attempts` refusals within `window`, every
//! sign-in of that name is refused until the window has passed, the right password too. Refusals
//! are counted from the audit trail, where each one is recorded.

use std::time::Duration;

use anyhow::Context as _;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;

use super::audit::{self, Actor, Entry, Outcome};
use super::{Account, Role, Scope, passwords};
use crate::operator_error::OperatorError;

/// The session cookie's name.
pub const COOKIE: &str = "oncepay_session";

/// How sessions and sign-ins are limited.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// A session unused this long ends.
    pub idle: Duration,
    /// A session ends this long after its sign-in, used or not.
    pub max: Duration,
    /// Refused sign-ins of one name that lock it …
    pub attempts: u32,
    /// … within this window.
    pub window: Duration,
}

/// Who uses a session for a request: the person, which keeps it from ending idle, or a page
/// refreshing itself, which does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// The person asked for it.
    ByThePerson,
    /// A page refreshed itself: an unattended page must not keep the session alive.
    InTheBackground,
}

/// A session just opened.
pub struct NewSession {
    /// The cookie's value, for the `Set-Cookie` header only.
    pub cookie: SecretString,
    /// Who signed in.
    pub account: Account,
    /// When the session ends at the latest.
    pub expires_at: OffsetDateTime,
}

/// Why a sign-in was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The name and password do not match an operator with a local password.
    #[error("wrong name or password")]
    Wrong,
    /// Too many refusals for this name lately.
    #[error("too many failed sign-ins for this name: try again in {} minutes", .0.as_secs().div_ceil(60))]
    Locked(Duration),
    /// Something failed underneath.
    #[error(transparent)]
    Failed(#[from] OperatorError),
}

/// Signs `name` in with `password` from `source`; every outcome is recorded in the audit trail.
pub async fn sign_in(
    pool: &PgPool,
    name: &str,
    password: SecretString,
    source: Option<&str>,
    policy: &Policy,
) -> Result<NewSession, Refused> {
    // The name as recorded: what was typed, cut to the column's longest name.
    let recorded: String = name.chars().take(63).collect();
    let recorded = if recorded.trim().is_empty() { "(no name)".to_owned() } else { recorded };
    let mut conn = pool.acquire().await.context("cannot reach the database").map_err(OperatorError::Failed)?;
    let refusals = sqlx::query_scalar!(
        r#"
        SELECT count(*) AS "n!" FROM operator_audit
        WHERE operator_name = $1 AND action = 'session.sign_in' AND outcome = 'refused'
          AND at > now() - make_interval(secs => $2)
        "#,
        recorded,
        policy.window.as_secs_f64(),
    )
    .fetch_one(&mut *conn)
    .await
    .context("cannot read the sign-ins")
    .map_err(OperatorError::Failed)?;
    let row = sqlx::query!(
        r#"
        SELECT operator_id, name, role AS "role: Role", tenant_ids, password_hash,
               COALESCE(password_set_by, operator_id) AS "made_by!"
        FROM operators WHERE name = $1 AND disabled_at IS NULL
        "#,
        name,
    )
    .fetch_optional(&mut *conn)
    .await
    .context("cannot read the operator")
    .map_err(OperatorError::Failed)?;
    let refuse =
        |why: &str| Entry::new("session.sign_in", Outcome::Refused).detail(serde_json::json!({ "refusal": why }));
    let operator_id = row.as_ref().map(|row| row.operator_id);
    let actor = Actor { operator_id, name: &recorded, source };
    if refusals >= i64::from(policy.attempts) {
        audit::record(&mut conn, &actor, &refuse("locked")).await?;
        return Err(Refused::Locked(policy.window));
    }
    let stored = row.as_ref().and_then(|row| row.password_hash.clone());
    // Hashing takes tens of milliseconds of CPU: off the async threads.
    let matches = tokio::task::spawn_blocking(move || passwords::verify(stored.as_deref(), &password))
        .await
        .context("the password check panicked")
        .map_err(OperatorError::Failed)?;
    let Some(row) = row.filter(|_| matches) else {
        audit::record(&mut conn, &actor, &refuse("wrong name or password")).await?;
        return Err(Refused::Wrong);
    };
    let account = Account {
        operator_id: row.operator_id,
        name: row.name,
        role: row.role,
        scope: Scope::from_column(row.tenant_ids),
        made_by: row.made_by,
    };
    Ok(open(&mut conn, account, source, policy, "password").await?)
}

/// Opens a session for `account`, who just proved who they are by `method` (`password`, `oidc`),
/// and records the sign-in.
pub async fn open(
    conn: &mut PgConnection,
    account: Account,
    source: Option<&str>,
    policy: &Policy,
    method: &str,
) -> Result<NewSession, OperatorError> {
    let mut raw = [0u8; 32];
    rand::rng().fill_bytes(&mut raw);
    let cookie = SecretString::from(URL_SAFE_NO_PAD.encode(raw));
    let expires_at = sqlx::query_scalar!(
        r#"
        INSERT INTO operator_sessions (session_sha256, operator_id, expires_at, source, credential_by)
        VALUES ($1, $2, now() + make_interval(secs => $3), $4, $5)
        RETURNING expires_at
        "#,
        digest(&cookie),
        account.operator_id,
        policy.max.as_secs_f64(),
        source,
        account.made_by,
    )
    .fetch_one(&mut *conn)
    .await
    .context("cannot open the session")?;
    let signed_in = Entry::new("session.sign_in", Outcome::Done).detail(serde_json::json!({ "method": method }));
    audit::record(conn, &Actor::of(&account, source), &signed_in).await?;
    Ok(NewSession { cookie, account, expires_at })
}

/// The account of an open session, and when it signed in; `None` for an unknown, ended, idle or
/// expired session. Marks the session as used.
pub async fn authenticate(
    conn: &mut PgConnection,
    cookie: &str,
    idle: Duration,
    used: Use,
) -> Result<Option<(Account, OffsetDateTime)>, OperatorError> {
    let cookie = SecretString::from(cookie.to_owned());
    let row = sqlx::query!(
        r#"
        UPDATE operator_sessions s SET last_seen_at = CASE WHEN $3 THEN now() ELSE s.last_seen_at END
        FROM operators o
        WHERE s.session_sha256 = $1 AND o.operator_id = s.operator_id AND s.ended_at IS NULL
          AND s.expires_at > now() AND s.last_seen_at > now() - make_interval(secs => $2)
          AND o.disabled_at IS NULL
        RETURNING o.operator_id, o.name, o.role AS "role: Role", o.tenant_ids, s.signed_in_at,
                  COALESCE(s.credential_by, o.operator_id) AS "made_by!"
        "#,
        digest(&cookie),
        idle.as_secs_f64(),
        used == Use::ByThePerson,
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the session")?;
    Ok(row.map(|row| {
        let account = Account {
            operator_id: row.operator_id,
            name: row.name,
            role: row.role,
            scope: Scope::from_column(row.tenant_ids),
            made_by: row.made_by,
        };
        (account, row.signed_in_at)
    }))
}

/// Ends the session of `cookie`.
pub async fn sign_out(conn: &mut PgConnection, cookie: &str) -> Result<(), OperatorError> {
    let cookie = SecretString::from(cookie.to_owned());
    sqlx::query!(
        "UPDATE operator_sessions SET ended_at = now() WHERE session_sha256 = $1 AND ended_at IS NULL",
        digest(&cookie),
    )
    .execute(conn)
    .await
    .context("cannot end the session")?;
    Ok(())
}

/// Ends every open session of an operator; returns how many.
pub async fn sign_out_everywhere(conn: &mut PgConnection, operator_id: uuid::Uuid) -> Result<u64, OperatorError> {
    let ended = sqlx::query!(
        "UPDATE operator_sessions SET ended_at = now() WHERE operator_id = $1 AND ended_at IS NULL",
        operator_id,
    )
    .execute(conn)
    .await
    .context("cannot end the sessions")?;
    Ok(ended.rows_affected())
}

/// Sets an operator's local password, in the caller's transaction, and ends their sessions.
pub async fn set_password(
    conn: &mut PgConnection,
    operator_id: uuid::Uuid,
    password: SecretString,
    set_by: uuid::Uuid,
) -> Result<(), OperatorError> {
    let hashed = tokio::task::spawn_blocking(move || passwords::hash(&password))
        .await
        .context("the password hashing panicked")??;
    sqlx::query!(
        "UPDATE operators SET password_hash = $2, password_set_by = $3 WHERE operator_id = $1",
        operator_id,
        hashed,
        set_by,
    )
    .execute(&mut *conn)
    .await
    .context("cannot store the password")?;
    sign_out_everywhere(conn, operator_id).await?;
    Ok(())
}

fn digest(cookie: &SecretString) -> Vec<u8> {
    Sha256::digest(cookie.expose_secret().as_bytes()).to_vec()
}
