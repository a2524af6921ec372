//! Our side of a window, read from the database: the ledger entries the charges' comparison needs,
//! and the refunds (with their ledger entries) the refunds' comparison needs.
//!
//! Only reads, and reads more than the window: an entry booked just outside it is read too when the
//! provider's side names it, so that the two sides are not told apart by a boundary.

use std::collections::{BTreeSet, HashMap};

use anyhow::Context;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::refund_status::RefundStatus;
use oncepay_provider::{Charge, Refund};
use sqlx::PgConnection;
use time::OffsetDateTime;

use crate::recon::compare::{LedgerEntry, payment_of};
use crate::recon::refunds::{OurRefund, RefundEntry, refund_of};
use oncepay_store::recon_runs::Window;

/// The ledger entries booked in the window, plus those of every payment the charges name (so a
/// charge is matched to its entry even if the two sides put it on different sides of a boundary).
pub async fn charge_entries(
    conn: &mut PgConnection,
    window: &Window,
    charges: &[Charge],
) -> anyhow::Result<Vec<LedgerEntry>> {
    let mut with_tenant: BTreeSet<(TenantId, PaymentId)> = BTreeSet::new();
    let mut without_tenant: BTreeSet<PaymentId> = BTreeSet::new();
    for charge in charges {
        match payment_of(charge) {
            Some((Some(tenant), payment)) => {
                with_tenant.insert((tenant, payment));
            }
            Some((None, payment)) => {
                without_tenant.insert(payment);
            }
            None => {}
        }
    }
    let (tenants, payments): (Vec<_>, Vec<_>) = with_tenant.iter().map(|(t, p)| (t.as_uuid(), p.as_uuid())).unzip();
    let rows = sqlx::query!(
        r#"
        SELECT tenant_id AS "tenant_id!: TenantId", payment_id AS "payment_id!: PaymentId",
               provider_charge_id AS "provider_charge_id!", amount AS "amount!: Amount",
               currency AS "currency!: Currency", charged_at AS "charged_at!"
        FROM ledger_entries WHERE charged_at >= $1 AND charged_at < $2
        UNION
        SELECT tenant_id, payment_id, provider_charge_id, amount, currency, charged_at
        FROM ledger_entries WHERE (tenant_id, payment_id) IN (SELECT * FROM unnest($3::uuid[], $4::uuid[]))
        "#,
        window.start,
        window.end,
        &tenants,
        &payments,
    )
    .fetch_all(&mut *conn)
    .await
    .context("cannot read the ledger")?;
    let mut entries: HashMap<PaymentId, LedgerEntry> = HashMap::new();
    let mut add = |tenant_id, payment_id, provider_charge_id, amount, currency, charged_at: OffsetDateTime| {
        entries.insert(
            payment_id,
            LedgerEntry {
                tenant_id,
                payment_id,
                provider_charge_id,
                amount,
                currency,
                charged_at,
                in_window: window.start <= charged_at && charged_at < window.end,
            },
        );
    };
    for r in rows {
        add(r.tenant_id, r.payment_id, r.provider_charge_id, r.amount, r.currency, r.charged_at);
    }
    if !without_tenant.is_empty() {
        // Charges whose metadata a provider dropped name only the payment: rare, and read by id alone.
        let ids: Vec<_> = without_tenant.iter().map(PaymentId::as_uuid).collect();
        let rows = sqlx::query!(
            r#"
            SELECT tenant_id AS "tenant_id: TenantId", payment_id AS "payment_id: PaymentId",
                   provider_charge_id, amount AS "amount: Amount", currency AS "currency: Currency", charged_at
            FROM ledger_entries WHERE payment_id = ANY($1)
            "#,
            &ids,
        )
        .fetch_all(&mut *conn)
        .await
        .context("cannot read the ledger")?;
        for r in rows {
            add(r.tenant_id, r.payment_id, r.provider_charge_id, r.amount, r.currency, r.charged_at);
        }
    }
    Ok(entries.into_values().collect())
}

/// Every oncepay refund the provider's `refunds` name, plus every refund booked in the window, each
/// with its ledger entry if it has one (wherever it was booked) and its payment's charge.
pub async fn refunds(conn: &mut PgConnection, window: &Window, refunds: &[Refund]) -> anyhow::Result<Vec<OurRefund>> {
    let mut with_tenant: BTreeSet<(TenantId, RefundId)> = BTreeSet::new();
    let mut without_tenant: BTreeSet<RefundId> = BTreeSet::new();
    for refund in refunds {
        match refund_of(refund) {
            Some((Some(tenant), refund_id)) => {
                with_tenant.insert((tenant, refund_id));
            }
            Some((None, refund_id)) => {
                without_tenant.insert(refund_id);
            }
            None => {}
        }
    }
    let (tenants, named): (Vec<_>, Vec<_>) = with_tenant.iter().map(|(t, r)| (t.as_uuid(), r.as_uuid())).unzip();
    let by_id_alone: Vec<_> = without_tenant.iter().map(RefundId::as_uuid).collect();
    let rows = sqlx::query!(
        r#"
        SELECT r.tenant_id AS "tenant_id!: TenantId", r.refund_id AS "refund_id!: RefundId",
               r.payment_id AS "payment_id!: PaymentId", p.provider_charge_id AS "charge_id?",
               r.status AS "status!: RefundStatus", r.amount AS "amount!: Amount", r.currency AS "currency!: Currency",
               l.provider_refund_id AS "provider_refund_id?", l.amount AS "booked_amount?: Amount",
               l.currency AS "booked_currency?: Currency", l.refunded_at AS "refunded_at?"
        FROM refund_ledger_entries l
        JOIN refunds r ON r.tenant_id = l.tenant_id AND r.refund_id = l.refund_id
        JOIN payments p ON p.tenant_id = r.tenant_id AND p.payment_id = r.payment_id
        WHERE l.refunded_at >= $1 AND l.refunded_at < $2
        UNION
        SELECT r.tenant_id, r.refund_id, r.payment_id, p.provider_charge_id, r.status, r.amount, r.currency,
               l.provider_refund_id, l.amount, l.currency, l.refunded_at
        FROM refunds r
        JOIN payments p ON p.tenant_id = r.tenant_id AND p.payment_id = r.payment_id
        LEFT JOIN refund_ledger_entries l ON l.tenant_id = r.tenant_id AND l.refund_id = r.refund_id
        WHERE (r.tenant_id, r.refund_id) IN (SELECT * FROM unnest($3::uuid[], $4::uuid[]))
        UNION
        -- Refunds whose metadata a provider dropped name only the refund, through their key: rare,
        -- and read by id alone only when there are any.
        SELECT r.tenant_id, r.refund_id, r.payment_id, p.provider_charge_id, r.status, r.amount, r.currency,
               l.provider_refund_id, l.amount, l.currency, l.refunded_at
        FROM refunds r
        JOIN payments p ON p.tenant_id = r.tenant_id AND p.payment_id = r.payment_id
        LEFT JOIN refund_ledger_entries l ON l.tenant_id = r.tenant_id AND l.refund_id = r.refund_id
        WHERE cardinality($5::uuid[]) > 0 AND r.refund_id = ANY($5)
        "#,
        window.start,
        window.end,
        &tenants,
        &named,
        &by_id_alone,
    )
    .fetch_all(&mut *conn)
    .await
    .context("cannot read the refunds and the refund ledger")?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let entry = match (r.provider_refund_id, r.booked_amount, r.booked_currency, r.refunded_at) {
                (Some(provider_refund_id), Some(amount), Some(currency), Some(refunded_at)) => Some(RefundEntry {
                    provider_refund_id,
                    amount,
                    currency,
                    refunded_at,
                    in_window: window.start <= refunded_at && refunded_at < window.end,
                }),
                _ => None,
            };
            OurRefund {
                tenant_id: r.tenant_id,
                refund_id: r.refund_id,
                payment_id: r.payment_id,
                charge_id: r.charge_id,
                status: r.status,
                amount: r.amount,
                currency: r.currency,
                entry,
            }
        })
        .collect())
}
