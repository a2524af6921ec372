//! Charges the provider had not finished when a run read them (`recon_unfinished_charges`): which
//! are still open, to be read again by id on every run, and recording what a run saw of them.
//!
//! A row is opened by the run that first sees the charge unfinished and closed by the run that reads
//! it final; a run that sees it unfinished again opens it again. All of it is written with the run's
//! discrepancies, so a run that fails changes nothing here.

use anyhow::Context;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::provider_ref::ProviderAccount;
use oncepay_provider::{UnfinishedCharge, metadata_keys};
use sqlx::PgConnection;
use time::OffsetDateTime;
use uuid::Uuid;

/// An open row: a charge to read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    /// The account that holds it (`None`: oncepay's own).
    pub account: Option<ProviderAccount>,
    /// The charge as the provider last showed it.
    pub last_seen: UnfinishedCharge,
}

/// Every open row, oldest charge first.
pub async fn open(conn: &mut PgConnection) -> anyhow::Result<Vec<Open>> {
    let rows = sqlx::query!(
        r#"
        SELECT provider_charge_id, provider_account AS "provider_account: ProviderAccount",
               tenant_id AS "tenant_id: TenantId", payment_id AS "payment_id: PaymentId", status, amount, currency,
               created
        FROM recon_unfinished_charges WHERE settled_run_id IS NULL
        ORDER BY created, provider_charge_id
        "#
    )
    .fetch_all(conn)
    .await
    .context("cannot read the charges left unfinished by earlier runs")?;
    Ok(rows
        .into_iter()
        .map(|r| Open {
            last_seen: UnfinishedCharge {
                id: r.provider_charge_id,
                status: r.status,
                amount: r.amount,
                currency: r.currency,
                created: r.created.unix_timestamp(),
                metadata: metadata_keys::naming(r.tenant_id, r.payment_id),
                account: r.provider_account.as_ref().map(|a| a.as_str().to_owned()),
            },
            account: r.provider_account,
        })
        .collect())
}

/// Records what run `run_id` saw: `still` unfinished (opened, or kept open), and `settled` read final
/// (closed). Part of the transaction that completes the run.
pub async fn record(
    conn: &mut PgConnection,
    run_id: Uuid,
    still: &[UnfinishedCharge],
    settled: &[String],
) -> anyhow::Result<()> {
    for charge in still {
        let (tenant_id, payment_id) = charge.payment_ref();
        let created = OffsetDateTime::from_unix_timestamp(charge.created)
            .with_context(|| format!("charge {} was created at no time ({})", charge.id, charge.created))?;
        sqlx::query!(
            r#"
            INSERT INTO recon_unfinished_charges (provider_charge_id, provider_account, tenant_id, payment_id, status,
                                                  amount, currency, created, first_run_id, last_run_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)
            ON CONFLICT (provider_charge_id) DO UPDATE
            SET status = EXCLUDED.status, last_run_id = EXCLUDED.last_run_id, settled_run_id = NULL
            "#,
            charge.id,
            charge.account,
            tenant_id.map(|t| t.as_uuid()),
            payment_id.map(|p| p.as_uuid()),
            charge.status,
            charge.amount,
            charge.currency,
            created,
            run_id,
        )
        .execute(&mut *conn)
        .await
        .context("cannot record an unfinished charge")?;
    }
    sqlx::query!(
        r#"
        UPDATE recon_unfinished_charges SET settled_run_id = $1, last_run_id = $1
        WHERE provider_charge_id = ANY($2) AND settled_run_id IS NULL
        "#,
        run_id,
        settled,
    )
    .execute(&mut *conn)
    .await
    .context("cannot close the charges now final")?;
    Ok(())
}
