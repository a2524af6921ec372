//! Refunds, stored: the row ([`Refund`]) and its rendering as the resource clients see, the reads
//! of one refund and of a payment's refunds, and the modules that write them: [`intake`] (accept or
//! replay), [`sending`] (the worker's claim and the sweeper's takeover), [`settling`] (every
//! status change, and the one place a provider's refund becomes a settlement).
//!
//! A refund moves through its own states ([`oncepay_domain::refund_status`]), as a compare-and-set
//! with an audit row (`refund_events`), like a payment. What a payment has promised back is kept on its row
//! (`payments.refunds_reserved`), so that refunds never add up to more than the charge
//! (`migrations/0300_refunds.sql`).

pub mod intake;
pub mod sending;
pub mod settling;

use std::collections::BTreeMap;

use sqlx::PgConnection;
use sqlx::types::Json;
use time::OffsetDateTime;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::payment::Failure;
use oncepay_domain::refund::{RefundReason, RefundResource};
use oncepay_domain::refund_status::RefundStatus;

use crate::StoreError;

/// The channel a refund's status changes are announced on, with the refund id as payload: what its
/// long polls wait for.
pub const REFUND_CHANNEL: &str = "oncepay_refund";

/// The channel that wakes the workers for refunds to send, with the tenant id as payload.
pub const REFUND_OUTBOX_CHANNEL: &str = "oncepay_refund_outbox";

/// A row of `refunds`.
#[derive(Debug, Clone)]
pub struct Refund {
    /// The owner.
    pub tenant_id: TenantId,
    /// The refund's id.
    pub refund_id: RefundId,
    /// The payment it gives money back from.
    pub payment_id: PaymentId,
    /// Where it stands.
    pub status: RefundStatus,
    /// How much, in minor units.
    pub amount: Amount,
    /// The payment's currency.
    pub currency: Currency,
    /// Why, if the merchant said (one of [`RefundReason`]'s names).
    pub reason: Option<String>,
    /// The merchant's key/value pairs.
    pub metadata: Json<BTreeMap<String, String>>,
    /// The provider's refund, once known.
    pub provider_refund_id: Option<String>,
    /// Why it failed, when `status` is `failed`.
    pub failure_code: Option<String>,
    /// A readable explanation of `failure_code`.
    pub failure_message: Option<String>,
    /// How many times a worker claimed it for sending.
    pub send_attempts: i32,
    /// When a worker first claimed it.
    pub first_sent_at: Option<OffsetDateTime>,
    /// Whether a send may have reached the provider.
    pub may_have_moved: bool,
    /// Who asked: `api` or `operator:<name>`.
    pub requested_by: String,
    /// When it was accepted.
    pub created_at: OffsetDateTime,
    /// When its status last changed.
    pub updated_at: OffsetDateTime,
    /// How many rows its history has: the place of its latest change.
    pub event_count: i32,
}

impl From<&Refund> for RefundResource {
    fn from(refund: &Refund) -> Self {
        let failure = match (&refund.failure_code, &refund.failure_message) {
            (Some(code), Some(message)) if refund.status == RefundStatus::Failed => {
                Some(Failure { code: code.clone(), message: message.clone() })
            }
            _ => None,
        };
        Self {
            id: refund.refund_id,
            payment_id: refund.payment_id,
            status: refund.status,
            amount: refund.amount.minor_units(),
            currency: refund.currency.as_str().to_owned(),
            reason: refund.reason.as_deref().and_then(RefundReason::parse),
            metadata: refund.metadata.0.clone(),
            created_at: refund.created_at,
            updated_at: refund.updated_at,
            provider_refund_id: refund.provider_refund_id.clone(),
            failure,
        }
    }
}

/// One refund of a tenant, if it has it.
pub async fn find(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    refund_id: RefundId,
) -> Result<Option<Refund>, StoreError> {
    Ok(sqlx::query_as!(
        Refund,
        r#"
        SELECT tenant_id AS "tenant_id: TenantId", refund_id AS "refund_id: RefundId",
               payment_id AS "payment_id: PaymentId", status AS "status: RefundStatus",
               amount AS "amount: Amount", currency AS "currency: Currency", reason,
               metadata AS "metadata: Json<BTreeMap<String, String>>", provider_refund_id, failure_code,
               failure_message, send_attempts, first_sent_at, may_have_moved, requested_by, created_at,
               updated_at, event_count
        FROM refunds
        WHERE tenant_id = $1 AND refund_id = $2
        "#,
        tenant_id.as_uuid(),
        refund_id.as_uuid(),
    )
    .fetch_optional(conn)
    .await?)
}

/// A payment's refunds, oldest first; empty for a payment the tenant does not have.
pub async fn of_payment(
    conn: &mut PgConnection,
    tenant_id: TenantId,
    payment_id: PaymentId,
) -> Result<Vec<Refund>, StoreError> {
    Ok(sqlx::query_as!(
        Refund,
        r#"
        SELECT tenant_id AS "tenant_id: TenantId", refund_id AS "refund_id: RefundId",
               payment_id AS "payment_id: PaymentId", status AS "status: RefundStatus",
               amount AS "amount: Amount", currency AS "currency: Currency", reason,
               metadata AS "metadata: Json<BTreeMap<String, String>>", provider_refund_id, failure_code,
               failure_message, send_attempts, first_sent_at, may_have_moved, requested_by, created_at,
               updated_at, event_count
        FROM refunds
        WHERE tenant_id = $1 AND payment_id = $2
        ORDER BY created_at, refund_id
        "#,
        tenant_id.as_uuid(),
        payment_id.as_uuid(),
    )
    .fetch_all(conn)
    .await?)
}
