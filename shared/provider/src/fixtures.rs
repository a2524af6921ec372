//! Test data: charges and refunds as the provider reports them. Only dev-dependencies turn on the `fixtures`
//! feature, so no binary carries this.

use std::collections::BTreeMap;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};

use crate::{Charge, ChargeStatus, Refund, RefundState, metadata_keys};

/// When every fixture charge and refund was made, in Unix seconds (2025-11-22).
pub const CREATED: i64 = 1_763_800_000;

/// A charge of `amount` EUR cents made under `payment_id`'s downstream key, with a decline code
/// when it failed and no metadata. Change any field with struct update syntax:
/// `Charge { currency: "USD".into(), ..charge(…) }`.
pub fn charge(payment_id: PaymentId, id: &str, status: ChargeStatus, amount: i64) -> Charge {
    let declined = status == ChargeStatus::Failed;
    Charge {
        id: id.to_owned(),
        status,
        amount,
        currency: "EUR".to_owned(),
        customer: "cus_1".to_owned(),
        idempotency_key: payment_id.downstream_key().as_str().to_owned(),
        created: CREATED,
        metadata: BTreeMap::new(),
        failure_code: declined.then(|| "card_declined".to_owned()),
        failure_message: declined.then(|| "The card was declined.".to_owned()),
        payment_method: None,
        account: None,
    }
}

/// The metadata oncepay puts on a charge, naming its tenant and payment.
pub fn metadata(tenant_id: TenantId, payment_id: PaymentId) -> BTreeMap<String, String> {
    [
        (metadata_keys::TENANT_ID.to_owned(), tenant_id.to_string()),
        (metadata_keys::PAYMENT_ID.to_owned(), payment_id.to_string()),
    ]
    .into()
}

/// A refund of `amount` EUR cents of `charge`, made under `refund_id`'s downstream key, with a
/// failure reason when it failed and no metadata. Change any field with struct update syntax:
/// `Refund { metadata: …, ..refund(…) }`.
pub fn refund(refund_id: RefundId, id: &str, charge: &str, status: RefundState, amount: i64) -> Refund {
    Refund {
        id: id.to_owned(),
        status,
        charge: charge.to_owned(),
        amount,
        currency: "EUR".to_owned(),
        idempotency_key: Some(refund_id.downstream_key().as_str().to_owned()),
        created: CREATED,
        metadata: BTreeMap::new(),
        failure_reason: (status == RefundState::Failed).then(|| "declined".to_owned()),
        account: None,
    }
}
