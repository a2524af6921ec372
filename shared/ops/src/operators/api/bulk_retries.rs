//! Bulk retries: the resend of a frozen selection of dead-lettered payments that an operator
//! confirmed in the console, worked by the reconciler one payment at a time.
//!
//! [`create`] writes the selection, exactly the payments the operator was shown, with an audit row.
//! [`BulkRetrier`] then resends each as that operator would have one by one, through
//! [`retry_payment`]: their role and tenants are checked again for every payment, a resend past the
//! key window or one that needs approval becomes a proposal, a refused one is recorded in the audit
//! trail. Each payment's resend and its result are written in one transaction, so a restart resumes
//! with the next payment and no payment is resent twice. The job keeps who made the credential the
//! operator confirmed it with, so a resend it proposes cannot be approved by that person.

use std::time::Duration;

use anyhow::Context as _;
use oncepay_domain::ids::{PaymentId, TenantId};
use serde_json::{Value, json};
use sqlx::PgConnection;
use time::OffsetDateTime;
use uuid::Uuid;

use super::OperatorsState;
use super::retry_payment;
use super::signing_in::{Caller, Via};
use crate::operator_error::OperatorError;
use crate::operators::audit::{self, Actor, Entry, Outcome};
use crate::operators::reports::Acted;
use crate::operators::{Account, Role, accounts};
use oncepay_service::runner::Pass;

/// The most payments one bulk retry may hold.
pub const MAX_PAYMENTS: usize = 500;

/// Writes a bulk retry of `payments` (in this order) for `by`, who selected them with `filter`, and
/// its audit row. Refused whole unless every payment has an open `unresolved` dead letter of a
/// tenant `by` may see: a conflict is an operator's decision on its own, never part of a bulk.
pub async fn create(
    conn: &mut PgConnection,
    by: &Caller,
    reason: &str,
    filter: Value,
    payments: &[PaymentId],
) -> Result<Uuid, OperatorError> {
    by.account.require(Role::Operator, "retry payments")?;
    let reason = crate::dead_letters::actions::require_reason(reason)?;
    if payments.is_empty() || payments.len() > MAX_PAYMENTS {
        return Err(OperatorError::Invalid(format!("a bulk retry holds 1 to {MAX_PAYMENTS} payments")));
    }
    let ids: Vec<Uuid> = payments.iter().map(|p| p.as_uuid()).collect();
    let mut tx = sqlx::Acquire::begin(conn).await.context("cannot start a transaction")?;
    let scope = by.account.scope.to_column();
    let found = sqlx::query!(
        r#"
        SELECT tenant_id AS "tenant_id: TenantId", payment_id AS "payment_id: PaymentId" FROM dead_letters
        WHERE tenant_id IN (SELECT tenant_id FROM tenants WHERE $1::uuid[] IS NULL OR tenant_id = ANY ($1))
          AND payment_id = ANY ($2) AND resolved_at IS NULL AND kind = 'unresolved'
        "#,
        scope.as_deref(),
        &ids,
    )
    .fetch_all(&mut *tx)
    .await
    .context("cannot read the selected payments")?;
    let tenant_of = |payment_id: &PaymentId| found.iter().find(|f| f.payment_id == *payment_id).map(|f| f.tenant_id);
    let mut tenants = Vec::with_capacity(payments.len());
    for payment_id in payments {
        let tenant_id = tenant_of(payment_id).ok_or_else(|| {
            OperatorError::NotFound(format!(
                "payment {payment_id} has no open unresolved dead letter to retry; nothing was started"
            ))
        })?;
        tenants.push(tenant_id.as_uuid());
    }
    let bulk_retry_id = Uuid::now_v7();
    sqlx::query!(
        r#"
        INSERT INTO bulk_retries (bulk_retry_id, operator_id, reason, filter, credential_by)
        VALUES ($1, $2, $3, $4, $5)
        "#,
        bulk_retry_id,
        by.account.operator_id,
        reason,
        filter,
        by.account.made_by,
    )
    .execute(&mut *tx)
    .await
    .context("cannot write the bulk retry")?;
    sqlx::query!(
        r#"
        INSERT INTO bulk_retry_items (bulk_retry_id, position, tenant_id, payment_id)
        SELECT $1, item.position - 1, item.tenant_id, item.payment_id
        FROM unnest($2::uuid[], $3::uuid[]) WITH ORDINALITY AS item (tenant_id, payment_id, position)
        "#,
        bulk_retry_id,
        &tenants,
        &ids,
    )
    .execute(&mut *tx)
    .await
    .context("cannot write the bulk retry's payments")?;
    let entry = Entry::new("bulk_retry.create", Outcome::Done)
        .reason(reason)
        .detail(json!({ "bulk_retry_id": bulk_retry_id, "payments": payments.len(), "filter": filter }));
    audit::record(&mut tx, &by.actor(), &entry).await?;
    tx.commit().await.context("cannot commit the bulk retry")?;
    Ok(bulk_retry_id)
}

/// A bulk retry as the console shows it.
#[derive(Debug)]
pub struct BulkRetry {
    pub bulk_retry_id: Uuid,
    pub operator: String,
    pub reason: String,
    pub created_at: OffsetDateTime,
    pub finished_at: Option<OffsetDateTime>,
    /// Its payments, in order.
    pub items: Vec<Item>,
}

/// One payment of a bulk retry, and what its resend did.
#[derive(Debug)]
pub struct Item {
    pub payment_id: PaymentId,
    /// `retried`, `proposed` or `refused`; `None` while it waits.
    pub outcome: Option<String>,
    pub detail: Option<String>,
}

/// Bulk retry `bulk_retry_id`, with the payments of the tenants `account` may see.
pub async fn read(conn: &mut PgConnection, account: &Account, bulk_retry_id: Uuid) -> Result<BulkRetry, OperatorError> {
    let head = sqlx::query!(
        r#"
        SELECT b.reason, b.created_at, b.finished_at, o.name AS operator
        FROM bulk_retries b JOIN operators o USING (operator_id) WHERE b.bulk_retry_id = $1
        "#,
        bulk_retry_id,
    )
    .fetch_optional(&mut *conn)
    .await
    .context("cannot read the bulk retry")?
    .ok_or_else(|| OperatorError::NotFound(format!("there is no bulk retry {bulk_retry_id}")))?;
    let scope = account.scope.to_column();
    let items = sqlx::query_as!(
        Item,
        r#"
        SELECT payment_id AS "payment_id: PaymentId", outcome, detail
        FROM bulk_retry_items WHERE bulk_retry_id = $1 AND ($2::uuid[] IS NULL OR tenant_id = ANY ($2))
        ORDER BY position
        "#,
        bulk_retry_id,
        scope.as_deref(),
    )
    .fetch_all(conn)
    .await
    .context("cannot read the bulk retry's payments")?;
    // None of its payments is of a tenant the operator may see: as if it did not exist.
    if items.is_empty() {
        return Err(OperatorError::NotFound(format!("there is no bulk retry {bulk_retry_id}")));
    }
    Ok(BulkRetry {
        bulk_retry_id,
        operator: head.operator,
        reason: head.reason,
        created_at: head.created_at,
        finished_at: head.finished_at,
        items,
    })
}

/// How long the reconciler waits for new bulk retries when none has work left.
const INTERVAL: Duration = Duration::from_millis(500);

/// Works the bulk retries: each pass resends the next waiting payment of the oldest unfinished one.
pub struct BulkRetrier {
    state: OperatorsState,
}

impl BulkRetrier {
    /// A worker acting with the operations API's rules and limits.
    pub const fn new(state: OperatorsState) -> Self {
        Self { state }
    }
}

impl Pass for BulkRetrier {
    const NAME: &'static str = "bulk_retries";

    fn interval(&self) -> Duration {
        INTERVAL
    }

    async fn pass(&self) -> anyhow::Result<bool> {
        let mut tx = self.state.pool.begin().await.context("cannot start a transaction")?;
        let waiting = sqlx::query!(
            r#"
            SELECT i.bulk_retry_id, i.position, i.payment_id AS "payment_id: PaymentId", b.reason,
                   o.name AS operator, o.operator_id, COALESCE(b.credential_by, o.operator_id) AS "credential_by!"
            FROM bulk_retry_items i
            JOIN bulk_retries b USING (bulk_retry_id)
            JOIN operators o ON o.operator_id = b.operator_id
            WHERE i.outcome IS NULL
            ORDER BY b.created_at, i.bulk_retry_id, i.position
            LIMIT 1
            FOR UPDATE OF i SKIP LOCKED
            "#,
        )
        .fetch_optional(&mut *tx)
        .await
        .context("cannot read the next payment of a bulk retry")?;
        let Some(item) = waiting else { return Ok(false) };
        let source = format!("bulk retry {}", item.bulk_retry_id);
        let outcome = match accounts::find(&mut tx, &item.operator).await {
            Ok(account) => {
                // Whoever made the credential the job was confirmed with stands behind it, as behind
                // a resend the operator asked for by hand.
                let account = Account { made_by: item.credential_by, ..account };
                let caller = Caller { account, via: Via::Job, source: Some(source.clone()) };
                let acted = retry_payment(&self.state, &mut tx, &caller, item.payment_id, &item.reason, false).await;
                refused_as(&mut tx, &caller, item.payment_id, acted).await?
            }
            // Disabled since: nothing more is done in their name, and the trail says so.
            Err(OperatorError::NotFound(_)) => {
                let why = format!("{} is no longer an operator", item.operator);
                let actor = Actor { operator_id: Some(item.operator_id), name: &item.operator, source: Some(&source) };
                let entry = Entry::new("payment.retry", Outcome::Refused)
                    .on_payment(item.payment_id)
                    .detail(json!({ "refusal": why }));
                audit::record(&mut tx, &actor, &entry).await?;
                Err(why)
            }
            Err(error) => return Err(anyhow::Error::new(error)),
        };
        let (result, detail) = match outcome {
            Ok(Acted::Done(_)) => ("retried", "queued to be sent again".to_owned()),
            Ok(Acted::Proposed { proposal }) => {
                ("proposed", format!("proposal {} waits for an approver", proposal.proposal_id))
            }
            Err(why) => ("refused", why),
        };
        sqlx::query!(
            r#"
            UPDATE bulk_retry_items SET outcome = $3, detail = $4, done_at = now()
            WHERE bulk_retry_id = $1 AND position = $2
            "#,
            item.bulk_retry_id,
            item.position,
            result,
            detail,
        )
        .execute(&mut *tx)
        .await
        .context("cannot record the result of a bulk retry's payment")?;
        sqlx::query!(
            r#"
            UPDATE bulk_retries SET finished_at = now()
            WHERE bulk_retry_id = $1 AND finished_at IS NULL
              AND NOT EXISTS (SELECT 1 FROM bulk_retry_items WHERE bulk_retry_id = $1 AND outcome IS NULL)
            "#,
            item.bulk_retry_id,
        )
        .execute(&mut *tx)
        .await
        .context("cannot finish the bulk retry")?;
        tx.commit().await.context("cannot commit a bulk retry's payment")?;
        Ok(true)
    }
}

/// What a resend did, or why it was refused, after recording a refused one in the audit trail, in
/// the same transaction. A failure underneath is an error: the payment waits for the next pass.
async fn refused_as(
    conn: &mut PgConnection,
    caller: &Caller,
    payment_id: PaymentId,
    acted: Result<Acted, OperatorError>,
) -> anyhow::Result<Result<Acted, String>> {
    match acted {
        Ok(acted) => Ok(Ok(acted)),
        Err(OperatorError::Failed(error)) => Err(error),
        Err(why) => {
            let entry = Entry::new("payment.retry", Outcome::Refused)
                .on_payment(payment_id)
                .detail(json!({ "refusal": why.to_string() }));
            audit::record(conn, &caller.actor(), &entry).await?;
            Ok(Err(why.to_string()))
        }
    }
}
