//! Refunds the provider had not finished when a run read them (`recon_unfinished_refunds`): which
//! are still open, to be read again by id on every run, and recording what a run saw of them.
//!
//! The rows live as [`super::unfinished`]'s charges do: opened by the run that first sees the refund
//! unfinished, closed by the run that reads it final, opened again by a run that sees it unfinished
//! again, and all of it written with the run's discrepancies, so a run that fails changes nothing
//! here.

use anyhow::Context;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_provider::{Refund, RefundState, metadata_keys};
use sqlx::PgConnection;
use time::OffsetDateTime;
use uuid::Uuid;

use super::refunds::{payment_named, refund_of};

/// An open row: a refund to read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRefund {
    /// The account that holds it (`None`: oncepay's own).
    pub account: Option<ProviderAccount>,
    /// The refund as the provider last showed it (the metadata: only the ids oncepay reads).
    pub last_seen: Refund,
}

/// Every open row, oldest refund first.
pub async fn open(conn: &mut PgConnection) -> anyhow::Result<Vec<OpenRefund>> {
    let rows = sqlx::query!(
        r#"
        SELECT provider_refund_id, provider_account AS "provider_account: ProviderAccount",
               tenant_id AS "tenant_id: TenantId", payment_id AS "payment_id: PaymentId",
               refund_id AS "refund_id: RefundId", provider_charge_id, amount, currency, idempotency_key, created
        FROM recon_unfinished_refunds WHERE settled_run_id IS NULL
        ORDER BY created, provider_refund_id
        "#
    )
    .fetch_all(conn)
    .await
    .context("cannot read the refunds left unfinished by earlier runs")?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let mut metadata = metadata_keys::naming(r.tenant_id, r.payment_id);
            if let Some(refund_id) = r.refund_id {
                metadata.insert(metadata_keys::REFUND_ID.to_owned(), refund_id.to_string());
            }
            OpenRefund {
                last_seen: Refund {
                    id: r.provider_refund_id,
                    status: RefundState::Pending,
                    charge: r.provider_charge_id,
                    amount: r.amount,
                    currency: r.currency,
                    idempotency_key: r.idempotency_key,
                    created: r.created.unix_timestamp(),
                    metadata,
                    failure_reason: None,
                    account: r.provider_account.as_ref().map(|a| a.as_str().to_owned()),
                },
                account: r.provider_account,
            }
        })
        .collect())
}

/// Records what run `run_id` saw: `still` unfinished (opened, or kept open), and `settled` read final
/// (closed). Part of the transaction that completes the run.
pub async fn record(conn: &mut PgConnection, run_id: Uuid, still: &[Refund], settled: &[String]) -> anyhow::Result<()> {
    for refund in still {
        let named = refund_of(refund);
        let created = OffsetDateTime::from_unix_timestamp(refund.created)
            .with_context(|| format!("refund {} was created at no time ({})", refund.id, refund.created))?;
        sqlx::query!(
            r#"
            INSERT INTO recon_unfinished_refunds (provider_refund_id, provider_account, tenant_id, payment_id,
                                                  refund_id, provider_charge_id, amount, currency, idempotency_key,
                                                  created, first_run_id, last_run_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)
            ON CONFLICT (provider_refund_id) DO UPDATE
            SET last_run_id = EXCLUDED.last_run_id, settled_run_id = NULL
            "#,
            refund.id,
            refund.account,
            named.and_then(|(tenant, _)| tenant).map(|t| t.as_uuid()),
            payment_named(refund).map(|p| p.as_uuid()),
            named.map(|(_, refund_id)| refund_id.as_uuid()),
            refund.charge,
            refund.amount,
            refund.currency,
            refund.idempotency_key,
            created,
            run_id,
        )
        .execute(&mut *conn)
        .await
        .context("cannot record an unfinished refund")?;
    }
    sqlx::query!(
        r#"
        UPDATE recon_unfinished_refunds SET settled_run_id = $1, last_run_id = $1
        WHERE provider_refund_id = ANY($2) AND settled_run_id IS NULL
        "#,
        run_id,
        settled,
    )
    .execute(&mut *conn)
    .await
    .context("cannot close the refunds now final")?;
    Ok(())
}
