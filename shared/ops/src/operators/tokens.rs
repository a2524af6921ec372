//! Personal tokens: issued to an operator for a while, shown once, stored as a hash, revocable.
//!
//! A request to the operations API carries one as `Authorization: Bearer oot_…`; [`authenticate`]
//! turns it into the [`Account`] it acts as, or into nothing at all.

use std::io::{self, Write};
use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::operator_token;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Account, Role, Scope};
use crate::operator_error::OperatorError;
use crate::render::{self, Report};

/// A token just issued, with the token itself, shown this once.
#[derive(Debug, Serialize, Deserialize)]
pub struct IssuedToken {
    /// Its id, for revoking it.
    pub token_id: Uuid,
    /// Whose it is.
    pub operator: String,
    /// What it is for.
    pub label: String,
    /// When it stops working.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// The bearer token.
    pub token: String,
    /// A local password set with it (the first admin's, made by the bootstrap), shown this once too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// That it is not shown again.
    pub notice: String,
}

impl Report for IssuedToken {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "operator  {}", self.operator)?;
        writeln!(out, "token id  {}", self.token_id)?;
        writeln!(out, "expires   {}", render::timestamp(self.expires_at))?;
        writeln!(out, "token     {}", self.token)?;
        if let Some(password) = &self.password {
            writeln!(out, "password  {password}   (to sign in at POST /v1/session)")?;
        }
        writeln!(out, "{}", self.notice)
    }

    fn json(&self) -> serde_json::Value {
        render::to_json(self)
    }
}

/// What [`IssuedToken::notice`] says.
pub const SHOWN_ONCE: &str = "This token (and password) is shown once and cannot be shown again: store it now.";

/// One of an operator's tokens, without its secret.
#[derive(Debug, Serialize, Deserialize)]
pub struct TokenView {
    /// Its id.
    pub token_id: Uuid,
    /// What it is for.
    pub label: String,
    /// When it was issued.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When it stops working.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// When it was revoked, if it was.
    #[serde(with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
}

/// Issues a token to operator `operator_id` (named `operator`) that works for `ttl`, in the caller's
/// transaction; `issued_by` is who receives it to pass on, and so can act with it.
pub async fn issue(
    conn: &mut PgConnection,
    operator_id: Uuid,
    operator: &str,
    label: &str,
    ttl: Duration,
    issued_by: Uuid,
) -> Result<IssuedToken, OperatorError> {
    let label = label.trim();
    if label.is_empty() || label.chars().count() > 100 {
        return Err(OperatorError::Invalid("say what the token is for with a label of 1 to 100 characters".into()));
    }
    let new = operator_token::generate();
    let expires_at = sqlx::query_scalar!(
        r#"
        INSERT INTO operator_tokens (token_id, operator_id, secret_sha256, label, expires_at, issued_by)
        VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5), $6)
        RETURNING expires_at
        "#,
        new.token_id,
        operator_id,
        new.secret_hash.as_bytes().as_slice(),
        label,
        ttl.as_secs_f64(),
        issued_by,
    )
    .fetch_one(conn)
    .await
    .context("cannot store the token")?;
    Ok(IssuedToken {
        token_id: new.token_id,
        operator: operator.to_owned(),
        label: label.to_owned(),
        expires_at,
        token: new.reveal().to_owned(),
        password: None,
        notice: SHOWN_ONCE.to_owned(),
    })
}

/// The account a presented token acts as: `None` unless it is one of ours, unrevoked, unexpired, and
/// its operator is not disabled. Every failure looks the same to the caller.
pub async fn authenticate(conn: &mut PgConnection, presented: &str) -> Result<Option<Account>, OperatorError> {
    let Some(presented) = operator_token::parse(presented) else { return Ok(None) };
    let row = sqlx::query!(
        r#"
        SELECT t.secret_sha256, o.operator_id, o.name, o.role AS "role: Role", o.tenant_ids,
               COALESCE(t.issued_by, o.operator_id) AS "made_by!"
        FROM operator_tokens t JOIN operators o USING (operator_id)
        WHERE t.token_id = $1 AND t.revoked_at IS NULL AND t.expires_at > now() AND o.disabled_at IS NULL
        "#,
        presented.token_id,
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the token")?;
    Ok(row.filter(|row| presented.secret_hash.matches(&row.secret_sha256)).map(|row| Account {
        operator_id: row.operator_id,
        name: row.name,
        role: row.role,
        scope: Scope::from_column(row.tenant_ids),
        made_by: row.made_by,
    }))
}

/// Lists an operator's tokens, newest first.
pub async fn list(conn: &mut PgConnection, operator_id: Uuid) -> Result<Vec<TokenView>, OperatorError> {
    let tokens = sqlx::query_as!(
        TokenView,
        r#"
        SELECT token_id, label, created_at, expires_at, revoked_at
        FROM operator_tokens WHERE operator_id = $1
        ORDER BY created_at DESC
        "#,
        operator_id,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the tokens")?;
    Ok(tokens)
}

/// Revokes every unrevoked token of an operator, in the caller's transaction; returns how many.
pub async fn revoke_all(conn: &mut PgConnection, operator_id: Uuid) -> Result<u64, OperatorError> {
    let revoked = sqlx::query!(
        "UPDATE operator_tokens SET revoked_at = now() WHERE operator_id = $1 AND revoked_at IS NULL",
        operator_id,
    )
    .execute(conn)
    .await
    .context("cannot revoke the tokens")?;
    Ok(revoked.rows_affected())
}

/// Revokes token `token_id`: an operator may revoke their own, an admin of every tenant anyone's
/// (one limited to some tenants manages no other operator's credentials). Returns whose it was. In
/// the caller's transaction.
pub async fn revoke(conn: &mut PgConnection, by: &Account, token_id: Uuid) -> Result<String, OperatorError> {
    let owner = sqlx::query!(
        r#"
        SELECT o.operator_id, o.name, t.revoked_at
        FROM operator_tokens t JOIN operators o USING (operator_id)
        WHERE t.token_id = $1
        FOR UPDATE OF t
        "#,
        token_id,
    )
    .fetch_optional(&mut *conn)
    .await
    .context("cannot read the token")?
    .ok_or_else(|| OperatorError::NotFound(format!("there is no token {token_id}")))?;
    if owner.operator_id != by.operator_id {
        let to = "revoke another operator's token";
        by.require(Role::Admin, to)?;
        if by.scope != Scope::Every {
            return Err(OperatorError::Forbidden(format!(
                "{} is an admin of some tenants only; only an admin of every tenant may {to}",
                by.name
            )));
        }
    }
    if owner.revoked_at.is_some() {
        return Err(OperatorError::Refused(format!("token {token_id} of {} is already revoked", owner.name)));
    }
    sqlx::query!("UPDATE operator_tokens SET revoked_at = now() WHERE token_id = $1", token_id)
        .execute(conn)
        .await
        .context("cannot revoke the token")?;
    Ok(owner.name)
}
