//! Signing in with a local password, and the browser sessions that follow: kept in PostgreSQL,
//! carried by an HttpOnly, Secure, SameSite=Strict cookie, ended when idle too long, at their
//! absolute expiry, on signing out, or everywhere at once (which revokes the operator's tokens too).
//!
//! A sign-in passes the limits of [`super::limits`] first (its source's attempts, then its name's
//! refusals, with the name's checks one at a time), then takes a permit of the process's
//! [`Hashing`] bound; only then is the password hashed, an unknown name's at the same cost. When
//! an OpenID provider is configured only the break-glass account ([`LocalPasswords`]) signs in
//! with a password. A refusal is recorded with fixed words and, for a name no operator has, under
//! no name at all.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{self, Actor, Entry, Outcome};
use super::limits::{self, Limits, Source};
use super::passwords::Hashing;
use super::{Account, Role, Scope};
use crate::metrics;
use crate::operator_error::OperatorError;

/// The session cookie's name.
pub const COOKIE: &str = "oncepay_session";

/// The name a refusal is recorded under when the name typed is no operator's.
pub const UNKNOWN_NAME: &str = "(unknown name)";

/// What a refused password check is recorded as.
pub const WRONG: &str = "wrong name or password";

/// Who may sign in with a local password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalPasswords {
    /// Every operator with one (no OpenID provider is configured).
    Everyone,
    /// Only this break-glass account (an OpenID provider is configured).
    BreakGlass(String),
    /// Nobody (an OpenID provider is configured, and no break-glass account).
    Nobody,
}

impl LocalPasswords {
    /// Whether operator `name` may sign in with a local password.
    pub fn allow(&self, name: &str) -> bool {
        match self {
            Self::Everyone => true,
            Self::BreakGlass(account) => account == name,
            Self::Nobody => false,
        }
    }

    /// Whether `name` is the break-glass account, whose every use is recorded.
    pub fn is_break_glass(&self, name: &str) -> bool {
        matches!(self, Self::BreakGlass(account) if account == name)
    }

    /// The break-glass account, if there is one.
    pub fn break_glass(&self) -> Option<&str> {
        match self {
            Self::BreakGlass(account) => Some(account),
            Self::Everyone | Self::Nobody => None,
        }
    }
}

/// How sessions and sign-ins are limited.
#[derive(Debug, Clone)]
pub struct Policy {
    /// A session unused this long ends.
    pub idle: Duration,
    /// A session ends this long after its sign-in, used or not.
    pub max: Duration,
    /// The limits on attempts.
    pub limits: Limits,
    /// Who may sign in with a local password.
    pub local: LocalPasswords,
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

/// Why a sign-in (or an enrollment) was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The name and password (or code) do not match an operator who may use them.
    #[error("wrong name or password")]
    Wrong,
    /// Too many refusals for this name lately.
    #[error("too many failed sign-ins for this name: try again in {} minutes", .0.as_secs().div_ceil(60))]
    Locked(Duration),
    /// Too many attempts from this address lately.
    #[error("too many sign-ins from this address: try again in {} minutes", .0.as_secs().div_ceil(60))]
    TooMany(Duration),
    /// Something failed underneath, or too much is being checked at once.
    #[error(transparent)]
    Failed(#[from] OperatorError),
}

/// An enabled operator, as a sign-in reads them.
pub(super) struct Stored {
    pub(super) account: Account,
    pub(super) password_hash: Option<String>,
}

/// The enabled operator named `name`, with their password hash.
pub(super) async fn stored(conn: &mut PgConnection, name: &str) -> Result<Option<Stored>, OperatorError> {
    let row = sqlx::query!(
        r#"
        SELECT operator_id, name, role AS "role: Role", tenant_ids, password_hash,
               COALESCE(password_set_by, operator_id) AS "made_by!"
        FROM operators WHERE name = $1 AND disabled_at IS NULL
        "#,
        name,
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the operator")?;
    Ok(row.map(|row| Stored {
        account: Account {
            operator_id: row.operator_id,
            name: row.name,
            role: row.role,
            scope: Scope::from_column(row.tenant_ids),
            made_by: row.made_by,
        },
        password_hash: row.password_hash,
    }))
}

/// Who an attempt on `stored` is recorded as: the operator, or nobody in particular.
pub(super) fn actor_of<'a>(stored: Option<&'a Stored>, source: Option<&'a str>) -> Actor<'a> {
    match stored {
        Some(stored) => Actor::of(&stored.account, source),
        None => Actor { operator_id: None, name: UNKNOWN_NAME, source },
    }
}

/// Takes an attempt from `source`'s allowance; past it, records the lock once and refuses.
pub(crate) async fn admit(
    conn: &mut PgConnection,
    source: Option<&str>,
    limits: &Limits,
    actor: &Actor<'_>,
    action: &'static str,
) -> Result<(), Refused> {
    let Some(subject) = limits::source_subject(source) else { return Ok(()) };
    match limits::take_source(conn, &subject, limits).await? {
        Source::Taken => Ok(()),
        Source::Exhausted { note } => {
            ::metrics::counter!(metrics::SIGN_INS_HELD_BACK, "why" => "source").increment(1);
            if note {
                let entry = Entry::new(action, Outcome::Refused)
                    .detail(serde_json::json!({ "refusal": "too many attempts from this address" }));
                audit::record(conn, actor, &entry).await?;
            }
            Err(Refused::TooMany(limits.window))
        }
    }
}

/// Gives back the attempt `admit` took from `source`, which succeeded.
pub(crate) async fn readmit(conn: &mut PgConnection, source: Option<&str>) -> Result<(), OperatorError> {
    match limits::source_subject(source) {
        Some(subject) => limits::give_back(conn, &subject).await,
        None => Ok(()),
    }
}

/// Holds the checks of name `subject` for `tx` and refuses a locked name (recording the lock once):
/// what every check of a password or code of one name goes through first.
pub(super) async fn hold(
    conn: &mut PgConnection,
    subject: &str,
    limits: &Limits,
    actor: &Actor<'_>,
    action: &'static str,
) -> Result<(), Refused> {
    if !limits::hold_name(conn, subject).await? {
        ::metrics::counter!(metrics::SIGN_INS_HELD_BACK, "why" => "busy").increment(1);
        return Err(Refused::Failed(OperatorError::Busy(
            "another sign-in of this name is being checked: try again in a second".into(),
        )));
    }
    if limits::name_locked(conn, subject, limits).await? {
        ::metrics::counter!(metrics::SIGN_INS_HELD_BACK, "why" => "locked").increment(1);
        if limits::note_lock(conn, subject).await? {
            let entry = Entry::new(action, Outcome::Refused).detail(serde_json::json!({ "refusal": "locked" }));
            audit::record(conn, actor, &entry).await?;
        }
        return Err(Refused::Locked(limits.window));
    }
    Ok(())
}

/// Signs `name` in with `password` from `source`. A refusal is recorded in the audit trail, within
/// the limits; a success opens a session and is recorded.
pub async fn sign_in(
    pool: &PgPool,
    hashing: &Arc<Hashing>,
    name: &str,
    password: SecretString,
    source: Option<&str>,
    policy: &Policy,
) -> Result<NewSession, Refused> {
    let subject = limits::name_subject(name);
    let mut conn = pool.acquire().await.context("cannot reach the database").map_err(OperatorError::Failed)?;
    let found = stored(&mut conn, name).await?;
    admit(&mut conn, source, &policy.limits, &actor_of(found.as_ref(), source), "session.sign_in").await?;
    drop(conn);
    let permit = hashing.try_start()?;
    let mut tx = pool.begin().await.context("cannot start a transaction").map_err(OperatorError::Failed)?;
    let found = stored(&mut tx, name).await?;
    let who = found
        .as_ref()
        .map_or((None, UNKNOWN_NAME.to_owned()), |f| (Some(f.account.operator_id), f.account.name.clone()));
    let actor = Actor { operator_id: who.0, name: &who.1, source };
    if let Err(refused) = hold(&mut tx, &subject, &policy.limits, &actor, "session.sign_in").await {
        tx.commit().await.context("cannot commit the refusal").map_err(OperatorError::Failed)?;
        return Err(refused);
    }
    let allowed = found.as_ref().is_some_and(|found| policy.local.allow(&found.account.name));
    let hash = found.as_ref().filter(|_| allowed).and_then(|found| found.password_hash.clone());
    // An unknown name, or one that may not use a password, is hashed all the same.
    let matches = permit.verify(hash, password).await?;
    drop(permit);
    let Some(found) = found.filter(|_| matches) else {
        limits::refuse_name(&mut tx, &subject, &policy.limits).await?;
        let why = if allowed || who.0.is_none() { WRONG } else { "local passwords are off for this account" };
        let entry = Entry::new("session.sign_in", Outcome::Refused).detail(serde_json::json!({ "refusal": why }));
        audit::record(&mut tx, &actor, &entry).await?;
        tx.commit().await.context("cannot commit the refusal").map_err(OperatorError::Failed)?;
        return Err(Refused::Wrong);
    };
    limits::forgive_name(&mut tx, &subject).await?;
    readmit(&mut tx, source).await?;
    let session = open(&mut tx, found.account, source, policy, "password").await?;
    tx.commit().await.context("cannot commit the sign-in").map_err(OperatorError::Failed)?;
    Ok(session)
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
    let detail = if policy.local.is_break_glass(&account.name) {
        serde_json::json!({ "method": method, "break_glass": true })
    } else {
        serde_json::json!({ "method": method })
    };
    let signed_in = Entry::new("session.sign_in", Outcome::Done).detail(detail);
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

/// What ending everything an operator signed in with ended.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Ended {
    /// Sessions ended.
    pub sessions: u64,
    /// Tokens revoked.
    pub tokens: u64,
}

/// Ends every open session of an operator and revokes every token of theirs, in the caller's
/// transaction: a token issued from a session is as good as the session, so it goes with it.
pub async fn sign_out_everywhere(conn: &mut PgConnection, operator_id: Uuid) -> Result<Ended, OperatorError> {
    let ended = sqlx::query!(
        "UPDATE operator_sessions SET ended_at = now() WHERE operator_id = $1 AND ended_at IS NULL",
        operator_id,
    )
    .execute(&mut *conn)
    .await
    .context("cannot end the sessions")?;
    let tokens = super::tokens::revoke_all(conn, operator_id).await?;
    Ok(Ended { sessions: ended.rows_affected(), tokens })
}

/// Stores `hashed` as an operator's local password (or none), made by `set_by`, in the caller's
/// transaction, and ends their sessions and tokens.
pub async fn store_password(
    conn: &mut PgConnection,
    operator_id: Uuid,
    hashed: Option<&str>,
    set_by: Option<Uuid>,
) -> Result<Ended, OperatorError> {
    sqlx::query!(
        "UPDATE operators SET password_hash = $2, password_set_by = $3 WHERE operator_id = $1",
        operator_id,
        hashed,
        set_by,
    )
    .execute(&mut *conn)
    .await
    .context("cannot store the password")?;
    sign_out_everywhere(conn, operator_id).await
}

/// A change of one's own password.
pub struct PasswordChange<'a> {
    /// The password now.
    pub old: SecretString,
    /// The one to be.
    pub new: SecretString,
    /// Why, for the audit trail.
    pub reason: &'a str,
}

/// Changes `account`'s own local password from `old` to `new`, with its audit row saying `reason`:
/// the old one is checked as a sign-in is (the same limits, a wrong one counts against the name),
/// and the new one ends their sessions and tokens.
pub async fn change_password(
    pool: &PgPool,
    hashing: &Arc<Hashing>,
    account: &Account,
    change: PasswordChange<'_>,
    source: Option<&str>,
    policy: &Policy,
) -> Result<Ended, OperatorError> {
    if !policy.local.allow(&account.name) {
        return Err(OperatorError::Forbidden(
            "local passwords are off: with an OpenID provider configured, only the break-glass account has one".into(),
        ));
    }
    let PasswordChange { old, new, reason } = change;
    super::passwords::check_length(&new)?;
    let subject = limits::name_subject(&account.name);
    let actor = Actor::of(account, source);
    let permit = hashing.try_start()?;
    let mut tx = pool.begin().await.context("cannot start a transaction")?;
    let refused = |refused: Refused| match refused {
        Refused::Failed(error) => error,
        other => OperatorError::Forbidden(other.to_string()),
    };
    if let Err(locked) = hold(&mut tx, &subject, &policy.limits, &actor, "operator.password").await {
        tx.commit().await.context("cannot commit the refusal")?;
        return Err(refused(locked));
    }
    let hash = stored(&mut tx, &account.name).await?.and_then(|stored| stored.password_hash);
    if hash.is_none() || !permit.verify(hash, old).await? {
        limits::refuse_name(&mut tx, &subject, &policy.limits).await?;
        tx.commit().await.context("cannot commit the refusal")?;
        return Err(OperatorError::Forbidden("the old password is wrong: nothing was changed".into()));
    }
    let hashed = permit.hash(new).await?;
    drop(permit);
    let ended = store_password(&mut tx, account.operator_id, Some(&hashed), Some(account.operator_id)).await?;
    let after = serde_json::json!({ "operator": account.name, "sessions_ended": ended.sessions, "tokens_revoked": ended.tokens });
    audit::record(&mut tx, &actor, &Entry::new("operator.password", Outcome::Done).reason(reason).after(after)).await?;
    tx.commit().await.context("cannot commit the password")?;
    Ok(ended)
}

fn digest(cookie: &SecretString) -> Vec<u8> {
    Sha256::digest(cookie.expose_secret().as_bytes()).to_vec()
}
