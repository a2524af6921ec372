//! Enrollment: how an operator sets their own local password, so that nobody else made it.
//!
//! An admin of every tenant gets a one-time code for an operator ([`issue`]): random, shown once to
//! be passed on, kept only as its SHA-256, expiring, and replaced by a fresher one. The operator
//! gives it back with their name and a new password ([`enroll`]); the code is used up, and the
//! password is theirs (`password_set_by` names them). Enrolling passes the same limits as signing in
//! (a wrong code counts as a refused sign-in of the name) and hashes within the same bound.
//!
//! An admin who kept a code could enroll in the operator's place: the audit trail names who issued
//! each code and from which address each enrollment came.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{self, Actor, Entry, Outcome};
use super::limits;
use super::passwords::{self, Hashing};
use super::sessions::{self, Policy, Refused};
use crate::operator_error::OperatorError;
use crate::render::{self, Report};

/// How every code begins.
pub const PREFIX: &str = "oec_";

/// What a wrong, used or expired code is recorded as.
const WRONG_CODE: &str = "wrong name or code, or the code expired or was used";

/// A code just issued, shown this once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IssuedCode {
    /// Whose it is.
    pub operator: String,
    /// The code.
    pub code: String,
    /// When it stops working.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// What to do with it.
    pub notice: String,
}

impl Report for IssuedCode {
    fn human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "operator         {}", self.operator)?;
        writeln!(out, "enrollment code  {}", self.code)?;
        writeln!(out, "expires          {}", render::timestamp(self.expires_at))?;
        writeln!(out, "{}", self.notice)
    }

    fn json(&self) -> serde_json::Value {
        render::to_json(self)
    }
}

/// Issues operator `operator_id` (named `operator`) a code that works for `ttl`, replacing any
/// earlier one, in the caller's transaction.
pub async fn issue(
    conn: &mut PgConnection,
    operator_id: Uuid,
    operator: &str,
    issued_by: Uuid,
    ttl: Duration,
) -> Result<IssuedCode, OperatorError> {
    let mut raw = [0u8; 24];
    rand::rng().fill_bytes(&mut raw);
    let code = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(raw));
    let expires_at = sqlx::query_scalar!(
        r#"
        INSERT INTO operator_enrollments (operator_id, code_sha256, issued_by, expires_at)
        VALUES ($1, $2, $3, now() + make_interval(secs => $4))
        ON CONFLICT (operator_id) DO UPDATE
            SET code_sha256 = EXCLUDED.code_sha256, issued_by = EXCLUDED.issued_by,
                issued_at = EXCLUDED.issued_at, expires_at = EXCLUDED.expires_at
        RETURNING expires_at
        "#,
        operator_id,
        digest(&code),
        issued_by,
        ttl.as_secs_f64(),
    )
    .fetch_one(conn)
    .await
    .context("cannot store the enrollment code")?;
    Ok(IssuedCode {
        operator: operator.to_owned(),
        code,
        expires_at,
        notice: format!(
            "Shown once: give it to {operator} yourself. It works once, until it expires, at \
             POST /v1/enrollment, the console's /console/enroll or `oncepay-reconciler operators enroll {operator}`."
        ),
    })
}

/// Sets `name`'s password to `password` with their `code`, from `source`. A wrong, used or expired
/// code is a refusal, recorded and counted against the name; a password too short or too long is
/// refused before anything is checked, and leaves the code usable.
pub async fn enroll(
    pool: &PgPool,
    hashing: &Arc<Hashing>,
    name: &str,
    code: &SecretString,
    password: SecretString,
    source: Option<&str>,
    policy: &Policy,
) -> Result<(), Refused> {
    passwords::check_length(&password)?;
    let subject = limits::name_subject(name);
    let mut conn = pool.acquire().await.context("cannot reach the database").map_err(OperatorError::Failed)?;
    let found = sessions::stored(&mut conn, name).await?;
    sessions::admit(&mut conn, source, &policy.limits, &sessions::actor_of(found.as_ref(), source), "operator.enroll")
        .await?;
    drop(conn);
    let permit = hashing.try_start()?;
    let mut tx = pool.begin().await.context("cannot start a transaction").map_err(OperatorError::Failed)?;
    let found = sessions::stored(&mut tx, name).await?;
    let actor = sessions::actor_of(found.as_ref(), source);
    if let Err(refused) = sessions::hold(&mut tx, &subject, &policy.limits, &actor, "operator.enroll").await {
        tx.commit().await.context("cannot commit the refusal").map_err(OperatorError::Failed)?;
        return Err(refused);
    }
    let used = match found.as_ref().filter(|found| policy.local.allow(&found.account.name)) {
        Some(found) => sqlx::query_scalar!(
            r#"
            DELETE FROM operator_enrollments
            WHERE operator_id = $1 AND code_sha256 = $2 AND expires_at > now()
            RETURNING (SELECT name FROM operators WHERE operator_id = issued_by) AS "issued_by!"
            "#,
            found.account.operator_id,
            digest(code.expose_secret()),
        )
        .fetch_optional(&mut *tx)
        .await
        .context("cannot read the enrollment code")
        .map_err(OperatorError::Failed)?,
        None => None,
    };
    let (Some(found), Some(issued_by)) = (found.as_ref(), used) else {
        limits::refuse_name(&mut tx, &subject, &policy.limits).await?;
        let entry = Entry::new("operator.enroll", Outcome::Refused).detail(json!({ "refusal": WRONG_CODE }));
        audit::record(&mut tx, &actor, &entry).await?;
        tx.commit().await.context("cannot commit the refusal").map_err(OperatorError::Failed)?;
        return Err(Refused::Wrong);
    };
    let hashed = permit.hash(password).await?;
    drop(permit);
    let operator_id = found.account.operator_id;
    sessions::store_password(&mut tx, operator_id, Some(&hashed), Some(operator_id)).await?;
    limits::forgive_name(&mut tx, &subject).await?;
    sessions::readmit(&mut tx, source).await?;
    let entry = Entry::new("operator.enroll", Outcome::Done)
        .after(json!({ "operator": found.account.name, "code_issued_by": issued_by, "password_set_by": "themself" }));
    audit::record(&mut tx, &Actor::of(&found.account, source), &entry).await?;
    tx.commit().await.context("cannot commit the enrollment").map_err(OperatorError::Failed)?;
    Ok(())
}

fn digest(code: &str) -> Vec<u8> {
    Sha256::digest(code.trim().as_bytes()).to_vec()
}
