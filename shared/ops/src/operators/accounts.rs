//! Operator accounts: creating one (by an admin, or the first admin of an empty installation from
//! the command line), finding one by name, and listing them.

use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::ids::TenantId;
use oncepay_store::tenants;
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{Acquire, PgConnection};
use time::OffsetDateTime;
use uuid::Uuid;

use super::audit::{self, Actor, Entry, Outcome};
use super::tokens::{self, IssuedToken};
use super::{Account, OperatorName, Role, Scope};
use super::{passwords, sessions};
use crate::operator_error::OperatorError;

/// An operator as other operators see them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OperatorView {
    /// Their id.
    pub operator_id: Uuid,
    /// Their name.
    pub name: String,
    /// Their role.
    pub role: Role,
    /// The names of the tenants they are limited to; none means every tenant.
    pub tenants: Option<Vec<String>>,
    /// When the account was made.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Who made it.
    pub created_by: String,
    /// The identity at the OpenID provider they sign in as, if linked.
    #[serde(default)]
    pub oidc_subject: Option<String>,
}

/// A new account, and the code they set their own password with (none for one who signs in at the
/// OpenID provider, or who may not have a local password).
#[derive(Debug, Serialize, Deserialize)]
pub struct CreatedOperator {
    /// The account.
    #[serde(flatten)]
    pub operator: OperatorView,
    /// Their enrollment code, shown this once.
    pub enrollment: Option<super::enrollment::IssuedCode>,
}

/// What a new account is to be.
#[derive(Debug, Clone)]
pub struct NewOperator<'a> {
    /// Their name.
    pub name: &'a str,
    /// Their role.
    pub role: Role,
    /// The names of the tenants they are limited to; `None` for every tenant.
    pub tenants: Option<&'a [String]>,
    /// The identity at the OpenID provider they sign in as (its `sub`), if any.
    pub oidc_subject: Option<&'a str>,
}

/// Creates an account, in the caller's transaction. `created_by` is who made it.
pub async fn create(
    conn: &mut PgConnection,
    new: &NewOperator<'_>,
    created_by: &str,
) -> Result<OperatorView, OperatorError> {
    let name = OperatorName::parse(new.name)?;
    let scope = match new.tenants {
        None => Scope::Every,
        Some([]) => {
            return Err(OperatorError::Invalid(
                "name at least one tenant, or leave the tenants out for every tenant".into(),
            ));
        }
        Some(names) => Scope::Only(tenant_ids(conn, names).await?),
    };
    let oidc_subject = new.oidc_subject.map(str::trim);
    if oidc_subject.is_some_and(|subject| subject.is_empty() || subject.len() > 255) {
        return Err(OperatorError::Invalid("oidc_subject must have 1 to 255 characters".into()));
    }
    let operator_id = Uuid::now_v7();
    let tenant_ids = scope.to_column();
    let created = sqlx::query!(
        r#"
        INSERT INTO operators (operator_id, name, role, tenant_ids, created_by, oidc_subject)
        VALUES ($1, $2, $3, $4, $5, $6)
        ON CONFLICT DO NOTHING
        RETURNING created_at
        "#,
        operator_id,
        name.as_str(),
        new.role as Role,
        tenant_ids.as_deref(),
        created_by,
        oidc_subject,
    )
    .fetch_optional(conn)
    .await
    .context("cannot create the operator")?
    .ok_or_else(|| {
        OperatorError::Refused(format!(
            "an operator named {name}, or one linked to the same identity at the OpenID provider, already exists"
        ))
    })?;
    Ok(OperatorView {
        operator_id,
        name: name.as_str().to_owned(),
        role: new.role,
        tenants: new.tenants.map(<[String]>::to_vec),
        created_at: created.created_at,
        created_by: created_by.to_owned(),
        oidc_subject: oidc_subject.map(str::to_owned),
    })
}

async fn tenant_ids(conn: &mut PgConnection, names: &[String]) -> Result<Vec<TenantId>, OperatorError> {
    let mut ids = Vec::with_capacity(names.len());
    for name in names {
        let tenant = tenants::find_by_name(conn, name)
            .await
            .context("cannot read the tenants")?
            .ok_or_else(|| OperatorError::NotFound(format!("there is no tenant named {name}")))?;
        ids.push(tenant.tenant_id);
    }
    Ok(ids)
}

/// Every account, by name.
pub async fn list(conn: &mut PgConnection) -> Result<Vec<OperatorView>, OperatorError> {
    views(conn, None).await
}

/// The account named `name`, as operators see it.
async fn view(conn: &mut PgConnection, name: &str) -> Result<OperatorView, OperatorError> {
    let found = views(conn, Some(name)).await?.into_iter().next();
    found.ok_or_else(|| OperatorError::NotFound(format!("there is no operator named {name}")))
}

async fn views(conn: &mut PgConnection, name: Option<&str>) -> Result<Vec<OperatorView>, OperatorError> {
    let rows = sqlx::query!(
        r#"
        SELECT o.operator_id, o.name, o.role AS "role: Role", o.created_at, o.created_by, o.oidc_subject,
               (SELECT array_agg(t.name ORDER BY t.name) FROM tenants t WHERE t.tenant_id = ANY (o.tenant_ids))
                   AS tenants
        FROM operators o
        WHERE o.disabled_at IS NULL AND ($1::text IS NULL OR o.name = $1)
        ORDER BY o.name
        "#,
        name,
    )
    .fetch_all(conn)
    .await
    .context("cannot read the operators")?;
    Ok(rows
        .into_iter()
        .map(|r| OperatorView {
            operator_id: r.operator_id,
            name: r.name,
            role: r.role,
            tenants: r.tenants,
            created_at: r.created_at,
            created_by: r.created_by,
            oidc_subject: r.oidc_subject,
        })
        .collect())
}

/// What changes about an account; `None` leaves it as it is.
#[derive(Debug, Clone, Default)]
pub struct Changes<'a> {
    /// A new role.
    pub role: Option<Role>,
    /// A new scope: `Some(None)` for every tenant, `Some(Some(names))` for those tenants.
    pub tenants: Option<Option<&'a [String]>>,
}

/// Changes another operator's role or tenants, in the caller's transaction; returns the account
/// before and after. Nobody changes their own account: another admin does.
pub async fn update(
    conn: &mut PgConnection,
    by: &Account,
    name: &str,
    changes: &Changes<'_>,
) -> Result<(OperatorView, OperatorView), OperatorError> {
    if by.name == name {
        return Err(OperatorError::Forbidden("nobody changes their own role or tenants: another admin does".into()));
    }
    if changes.role.is_none() && changes.tenants.is_none() {
        return Err(OperatorError::Invalid("say what changes: a role, tenants, or every tenant".into()));
    }
    let before = view(conn, name).await?;
    let scope = match changes.tenants {
        None => None,
        Some(None) => Some(Scope::Every),
        Some(Some([])) => return Err(OperatorError::Invalid("name at least one tenant, or every tenant".into())),
        Some(Some(names)) => Some(Scope::Only(tenant_ids(conn, names).await?)),
    };
    let rescoped = scope.is_some();
    let tenant_ids = scope.as_ref().and_then(Scope::to_column);
    sqlx::query!(
        r#"
        UPDATE operators
        SET role = COALESCE($2, role),
            tenant_ids = CASE WHEN $3 THEN $4 ELSE tenant_ids END
        WHERE name = $1 AND disabled_at IS NULL
        "#,
        name,
        changes.role as Option<Role>,
        rescoped,
        tenant_ids.as_deref(),
    )
    .execute(&mut *conn)
    .await
    .context("cannot change the operator")?;
    let after = view(conn, name).await?;
    Ok((before, after))
}

/// Disables another operator, in the caller's transaction: their sessions end and their tokens are
/// revoked at once, their enrollment code is dropped, their pending proposals are withdrawn, and
/// their name stays in the audit trail. Returns the account as it was.
pub async fn disable(conn: &mut PgConnection, by: &Account, name: &str) -> Result<OperatorView, OperatorError> {
    if by.name == name {
        return Err(OperatorError::Forbidden("nobody disables their own account: another admin does".into()));
    }
    let before = view(conn, name).await?;
    sqlx::query!("UPDATE operators SET disabled_at = now() WHERE operator_id = $1", before.operator_id)
        .execute(&mut *conn)
        .await
        .context("cannot disable the operator")?;
    super::sessions::sign_out_everywhere(conn, before.operator_id).await?;
    sqlx::query!("DELETE FROM operator_enrollments WHERE operator_id = $1", before.operator_id)
        .execute(&mut *conn)
        .await
        .context("cannot drop their enrollment code")?;
    // What they proposed no longer has anyone behind it.
    sqlx::query!(
        r#"
        UPDATE proposals SET status = 'withdrawn', decided_by = $2, decided_at = now(),
                             decision_note = 'its proposer was disabled'
        WHERE proposed_by = $1 AND status = 'pending'
        "#,
        before.operator_id,
        by.operator_id,
    )
    .execute(conn)
    .await
    .context("cannot withdraw their proposals")?;
    Ok(before)
}

/// The account named `name`.
pub async fn find(conn: &mut PgConnection, name: &str) -> Result<Account, OperatorError> {
    lookup(conn, Some(name), None)
        .await?
        .ok_or_else(|| OperatorError::NotFound(format!("there is no operator named {name}")))
}

/// The account linked to the identity `subject` at the OpenID provider, if any.
pub async fn find_by_subject(conn: &mut PgConnection, subject: &str) -> Result<Option<Account>, OperatorError> {
    lookup(conn, None, Some(subject)).await
}

/// The enabled account with `name`, or linked to `subject`.
async fn lookup(
    conn: &mut PgConnection,
    name: Option<&str>,
    subject: Option<&str>,
) -> Result<Option<Account>, OperatorError> {
    let row = sqlx::query!(
        r#"
        SELECT operator_id, name, role AS "role: Role", tenant_ids
        FROM operators
        WHERE disabled_at IS NULL AND ($1::text IS NULL OR name = $1) AND ($2::text IS NULL OR oidc_subject = $2)
        "#,
        name,
        subject,
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the operator")?;
    Ok(row.map(|row| Account {
        operator_id: row.operator_id,
        name: row.name,
        role: row.role,
        scope: Scope::from_column(row.tenant_ids),
        made_by: row.operator_id,
    }))
}

/// `operators bootstrap`: on an installation with no operator yet, creates the first admin with a
/// token and a random local password, both shown once; refused once any operator exists (admins
/// then create the rest through the operations API). With `migrate`, the only operator command
/// that works on the database directly.
pub async fn bootstrap(conn: &mut PgConnection, name: &str, token_ttl: Duration) -> Result<IssuedToken, OperatorError> {
    let mut tx = conn.begin().await.context("cannot start a transaction")?;
    // Two bootstraps at once: the second waits here, then finds the first's admin.
    sqlx::query!("LOCK TABLE operators IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .context("cannot lock the operators")?;
    let existing = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM operators"#)
        .fetch_one(&mut *tx)
        .await
        .context("cannot read the operators")?;
    if existing > 0 {
        // Now, not when the connection is next used: the lock must not outlive the refusal.
        tx.rollback().await.context("cannot end the transaction")?;
        return Err(OperatorError::Refused(
            "this installation has operators already: an admin creates more through the operations API \
             (POST /v1/operators)"
                .into(),
        ));
    }
    let admin = NewOperator { name, role: Role::Admin, tenants: None, oidc_subject: None };
    let created = create(&mut tx, &admin, "bootstrap").await?;
    let (id, name) = (created.operator_id, created.name.as_str());
    // The password first: storing one ends every token the operator had.
    let password = passwords::generate();
    let hashed = {
        let password = password.clone();
        tokio::task::spawn_blocking(move || passwords::hash(&password)).await.context("the hashing panicked")??
    };
    sessions::store_password(&mut tx, id, Some(&hashed), Some(id)).await?;
    let mut issued = tokens::issue(&mut tx, id, name, "bootstrap", token_ttl, id).await?;
    issued.password = Some(password.expose_secret().to_owned());
    let actor = Actor { operator_id: Some(created.operator_id), name: &created.name, source: None };
    let entry = Entry::new("operator.bootstrap", Outcome::Done)
        .reason("the first admin of an empty installation")
        .after(json!({ "operator": created.name, "role": Role::Admin, "token_id": issued.token_id }));
    audit::record(&mut tx, &actor, &entry).await?;
    tx.commit().await.context("cannot commit the first admin")?;
    Ok(issued)
}
