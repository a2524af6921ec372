//! Refunds at the provider: what oncepay asks for, how it looks a refund up, and every way a refund
//! call can end.
//!
//! A refund is sent as a charge is: under a downstream key derived from the refund's id
//! ([`RefundId::downstream_key`]), the same on every attempt, and every answer is classified as
//! definitive ([`RefundOutcome::Refunded`], [`RefundOutcome::Failed`]), not sent, or uncertain.
//! A refund the provider took but has not finished ([`RefundOutcome::Unfinished`]) is settled
//! later, by a lookup or a webhook, as an uncertain one is.

use std::collections::BTreeMap;
use std::time::Duration;

use oncepay_domain::ids::{DownstreamKey, PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_domain::provider_ref::ProviderAccount;

use crate::metadata_keys;
use crate::outcome::{NotSentReason, UncertainReason, Unsettled, read, response_json};
use crate::wire::{ErrorBody, Refund, RefundState};

/// What oncepay asks the provider to refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundRequest {
    /// Sent as the provider's `Idempotency-Key`; the same on every attempt for one refund.
    pub downstream_key: DownstreamKey,
    /// The provider's id of the payment's charge (a simulator `ch_…`, a Stripe `pi_…`).
    pub charge_id: String,
    /// The amount to give back, in minor units.
    pub amount: Amount,
    /// The payment's currency.
    pub currency: Currency,
    /// Why, in the provider's words (`duplicate`, `fraudulent`, `requested_by_customer`), if given.
    pub reason: Option<String>,
    /// The merchant's metadata plus oncepay's own keys, the refund's among them.
    pub metadata: BTreeMap<String, String>,
    /// The provider account that holds the charge; `None` for oncepay's own.
    pub account: Option<ProviderAccount>,
}

impl RefundRequest {
    /// The request for one refund of one payment's charge, in oncepay's own account: the merchant's
    /// metadata plus the keys that name the tenant, the payment and the refund. A refund of a
    /// charge in a connected account sets `account` on the result.
    #[allow(clippy::too_many_arguments)]
    pub fn for_refund(
        tenant_id: TenantId,
        payment_id: PaymentId,
        refund_id: RefundId,
        charge_id: String,
        amount: Amount,
        currency: Currency,
        reason: Option<String>,
        merchant_metadata: &BTreeMap<String, String>,
    ) -> Self {
        Self {
            downstream_key: refund_id.downstream_key(),
            charge_id,
            amount,
            currency,
            reason,
            metadata: Self::metadata(tenant_id, payment_id, refund_id, merchant_metadata),
            account: None,
        }
    }

    /// The metadata sent with a refund: the merchant's, plus the keys that name the tenant, the
    /// payment and the refund.
    pub(crate) fn metadata(
        tenant_id: TenantId,
        payment_id: PaymentId,
        refund_id: RefundId,
        merchant_metadata: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let mut metadata = merchant_metadata.clone();
        metadata.insert(metadata_keys::TENANT_ID.to_owned(), tenant_id.to_string());
        metadata.insert(metadata_keys::PAYMENT_ID.to_owned(), payment_id.to_string());
        metadata.insert(metadata_keys::REFUND_ID.to_owned(), refund_id.to_string());
        metadata
    }
}

/// Which refunds to look for: those made under one downstream key, of one charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundLookup {
    /// The refund's downstream key.
    pub key: DownstreamKey,
    /// The charge it refunds.
    pub charge_id: String,
    /// The account that holds the charge; `None` for oncepay's own.
    pub account: Option<ProviderAccount>,
}

/// How a `create_refund` call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundOutcome {
    /// The money went back to the customer.
    Refunded(Refund),
    /// The provider refused or failed the refund: this request moved no money.
    Failed {
        /// A stable code (the provider's, or `provider_rejected` for a 400).
        code: String,
        /// A human-readable reason.
        message: String,
        /// The refund's own failed object, when the provider showed one: what proves that no
        /// earlier request under the same key moved money either.
        refund_id: Option<String>,
    },
    /// The provider took the refund but has not finished it (Stripe's `pending`): settled later.
    Unfinished(Refund),
    /// No refund can have been created by this request; retry later with the same key.
    NotSent {
        /// Why.
        reason: NotSentReason,
        /// The provider's `Retry-After`, if it gave one.
        retry_after: Option<Duration>,
    },
    /// The provider may have refunded; reconcile.
    Uncertain(UncertainReason),
}

impl RefundOutcome {
    /// Classifies an HTTP response to `POST /v1/refunds`, sent under the idempotency key `key`, as
    /// [`SendOutcome::from_response`](crate::SendOutcome::from_response) classifies a charge's.
    pub fn from_response(status: u16, retry_after: Option<Duration>, body: &[u8], key: &str) -> Self {
        let json = match response_json(body) {
            Ok(json) => json,
            Err(reason) => return Self::Uncertain(reason),
        };
        match status {
            201 | 200 => match read::<Refund>(json.as_ref()) {
                // The settlement judges a succeeded refund's key and amount, as it does a charge's.
                Some(refund) if refund.status == RefundState::Succeeded => Self::Refunded(refund),
                Some(refund) if refund.status == RefundState::Pending => Self::Unfinished(refund),
                // A failed or canceled refund proves that no money moved only if it is this key's own.
                Some(refund) if refund.idempotency_key.as_deref() != Some(key) => {
                    Self::Uncertain(UncertainReason::UnexpectedStatus(status))
                }
                Some(refund) => {
                    let (code, message) = match refund.status {
                        RefundState::Canceled => ("refund_canceled", "The provider canceled the refund."),
                        _ => ("refund_failed", "The provider failed the refund."),
                    };
                    Self::Failed {
                        code: refund.failure_reason.unwrap_or_else(|| code.to_owned()),
                        message: message.to_owned(),
                        refund_id: Some(refund.id),
                    }
                }
                None => Self::Uncertain(UncertainReason::UnreadableResponse),
            },
            402 => match read::<ErrorBody>(json.as_ref()) {
                Some(ErrorBody { error }) => {
                    Self::Failed { code: error.code, message: error.message, refund_id: error.refund }
                }
                None => Self::Failed {
                    code: "refund_failed".to_owned(),
                    message: "The provider failed the refund.".to_owned(),
                    refund_id: None,
                },
            },
            // Refused before anything was made: over the charge's amount, a charge that cannot be
            // refunded, or an invalid request.
            400 => Self::Failed {
                code: "provider_rejected".to_owned(),
                message: read::<ErrorBody>(json.as_ref())
                    .map(|b| b.error.message)
                    .unwrap_or_else(|| "The provider rejected the refund as invalid.".to_owned()),
                refund_id: None,
            },
            other => Unsettled::from_status(other, retry_after).into(),
        }
    }

    /// Classifies a call that got no HTTP response.
    pub fn from_transport_error(error: &reqwest::Error) -> Self {
        Unsettled::from_transport_error(error).into()
    }

    /// A short label for metrics and logs: `refunded`, `failed`, `unfinished`, `not_sent`,
    /// `uncertain`.
    pub const fn class(&self) -> &'static str {
        match self {
            Self::Refunded(_) => "refunded",
            Self::Failed { .. } => "failed",
            Self::Unfinished(_) => "unfinished",
            Self::NotSent { .. } => "not_sent",
            Self::Uncertain(_) => "uncertain",
        }
    }
}

impl From<Unsettled> for RefundOutcome {
    fn from(unsettled: Unsettled) -> Self {
        match unsettled {
            Unsettled::NotSent { reason, retry_after } => Self::NotSent { reason, retry_after },
            Unsettled::Uncertain(reason) => Self::Uncertain(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The key the requests below were sent under, as the refunds in their responses name it.
    const KEY: &str = "oncepay-refund-x";

    fn refund(status: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "id": "re_1", "status": status, "charge": "ch_1", "amount": 100, "currency": "EUR",
            "idempotency_key": KEY, "created": 1
        }))
        .unwrap()
    }

    #[test]
    fn each_response_is_classified() {
        let failed = br#"{"error":{"code":"expired_or_canceled_card","message":"No","refund":"re_9"}}"#;
        let cases: Vec<(u16, Vec<u8>, &str)> = vec![
            (201, refund("succeeded"), "refunded"),
            (200, refund("succeeded"), "refunded"),
            (201, refund("failed"), "failed"),
            (200, refund("canceled"), "failed"),
            (201, refund("pending"), "unfinished"),
            (201, b"{not json".to_vec(), "uncertain"),
            (201, b"".to_vec(), "uncertain"),
            (402, failed.to_vec(), "failed"),
            (402, b"".to_vec(), "failed"),
            (400, b"".to_vec(), "failed"),
            (401, b"".to_vec(), "not_sent"),
            (403, b"".to_vec(), "not_sent"),
            (429, b"".to_vec(), "not_sent"),
            (409, b"".to_vec(), "uncertain"),
            (422, b"".to_vec(), "uncertain"),
            (500, b"".to_vec(), "uncertain"),
            (502, b"".to_vec(), "uncertain"),
            (503, b"".to_vec(), "uncertain"),
            (302, b"".to_vec(), "uncertain"),
            (404, b"".to_vec(), "uncertain"),
        ];
        for (status, body, class) in cases {
            assert_eq!(RefundOutcome::from_response(status, None, &body, KEY).class(), class, "HTTP {status}");
        }
    }

    #[test]
    fn a_failure_keeps_the_providers_code_and_refund_and_a_refusal_names_none() {
        let body = br#"{"error":{"code":"expired_or_canceled_card","message":"The card expired.","refund":"re_9"}}"#;
        let refusal = br#"{"error":{"code":"amount_too_large","message":"Only 5 left.","refund":"re_9"}}"#;
        let failed_refund = String::from_utf8(refund("failed"))
            .unwrap()
            .replace(r#""created":1"#, r#""created":1,"failure_reason":"lost_or_stolen_card""#);
        let cases = [
            (402, body.to_vec(), "expired_or_canceled_card", "The card expired.", Some("re_9")),
            (400, refusal.to_vec(), "provider_rejected", "Only 5 left.", None),
            (201, failed_refund.into_bytes(), "lost_or_stolen_card", "The provider failed the refund.", Some("re_1")),
            (201, refund("canceled"), "refund_canceled", "The provider canceled the refund.", Some("re_1")),
        ];
        for (status, body, code, message, refund_id) in cases {
            let outcome = RefundOutcome::from_response(status, None, &body, KEY);

            assert_eq!(
                outcome,
                RefundOutcome::Failed {
                    code: code.into(),
                    message: message.into(),
                    refund_id: refund_id.map(str::to_owned)
                },
                "HTTP {status}"
            );
        }
    }

    /// Only the refund's own failed object proves that it moved no money: a failed refund made
    /// under another key, or under none it reports, says nothing of this one.
    #[test]
    fn a_failed_refund_under_another_key_or_none_proves_nothing() {
        let other = String::from_utf8(refund("failed")).unwrap().replace(KEY, "oncepay-refund-another");
        let unnamed =
            String::from_utf8(refund("canceled")).unwrap().replace(&format!(r#""idempotency_key":"{KEY}","#), "");

        for body in [other, unnamed] {
            let outcome = RefundOutcome::from_response(201, None, body.as_bytes(), KEY);

            assert_eq!(outcome, RefundOutcome::Uncertain(UncertainReason::UnexpectedStatus(201)), "{body}");
        }
    }

    #[test]
    fn a_body_that_names_a_member_twice_is_uncertain_whatever_the_status() {
        let refund = String::from_utf8(refund("succeeded")).unwrap();
        let cases = [
            (201, refund.replace(r#""amount":100"#, r#""amount":100,"amount":1"#)),
            (200, refund.replace(r#""created":1"#, r#""created":1,"metadata":{"a":"1","a":"2"}"#)),
            (402, r#"{"error":{"code":"declined","message":"No","refund":"re_1","refund":"re_2"}}"#.to_owned()),
            (400, r#"{"error":{"code":"amount_too_large","message":"No","message":"Yes"}}"#.to_owned()),
            (429, r#"{"retry":1,"retry":2}"#.to_owned()),
            (503, r#"{"a":1,"a":1}"#.to_owned()),
        ];
        for (status, body) in cases {
            assert_eq!(
                RefundOutcome::from_response(status, None, body.as_bytes(), KEY),
                RefundOutcome::Uncertain(UncertainReason::UnreadableResponse),
                "HTTP {status}: {body}"
            );
        }
    }

    #[test]
    fn rate_limiting_carries_the_providers_retry_after() {
        let outcome = RefundOutcome::from_response(429, Some(Duration::from_secs(3)), b"", KEY);

        assert_eq!(
            outcome,
            RefundOutcome::NotSent { reason: NotSentReason::RateLimited, retry_after: Some(Duration::from_secs(3)) }
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;
        use super::KEY;
        use crate::wire::strategies::{error_body, refund, with_a_repeated_member};

        /// What a provider, a proxy or a broken connection may put in a body.
        fn any_body() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                refund().prop_map(|r| serde_json::to_vec(&r).unwrap()),
                refund()
                    .prop_map(|r| serde_json::to_vec(&Refund { idempotency_key: Some(KEY.to_owned()), ..r }).unwrap()),
                error_body().prop_map(|e| serde_json::to_vec(&e).unwrap()),
                (refund(), any::<proptest::sample::Index>()).prop_map(|(r, cut)| {
                    let text = serde_json::to_vec(&r).unwrap();
                    text[..cut.index(text.len())].to_vec()
                }),
                proptest::collection::vec(any::<u8>(), 0..256),
                Just(b"<html>502 Bad Gateway</html>".to_vec()),
            ]
        }

        proptest! {
            /// "Not sent" allows a resend with backoff: whatever the body says, only 401, 403, 429.
            #[test]
            fn only_a_refusal_before_acting_is_not_sent(status in 100u16..=999, body in any_body()) {
                let outcome = RefundOutcome::from_response(status, None, &body, KEY);

                if matches!(outcome, RefundOutcome::NotSent { .. }) {
                    prop_assert!([401, 403, 429].contains(&status), "HTTP {} was called not sent", status);
                }
            }

            #[test]
            fn a_server_error_is_uncertain_whatever_its_body_says(status in 500u16..=599, body in any_body()) {
                prop_assert_eq!(
                    RefundOutcome::from_response(status, None, &body, KEY),
                    RefundOutcome::Uncertain(UncertainReason::ServerError(status))
                );
            }

            /// A refund is recorded as made only from a success that shows a succeeded refund, and
            /// with exactly that refund.
            #[test]
            fn refunded_only_from_a_success_showing_a_succeeded_refund(status in 100u16..=999, body in any_body()) {
                if let RefundOutcome::Refunded(refund) = RefundOutcome::from_response(status, None, &body, KEY) {
                    prop_assert!(status == 200 || status == 201, "HTTP {} was called refunded", status);
                    prop_assert_eq!(refund.status, RefundState::Succeeded);
                    prop_assert_eq!(serde_json::from_slice::<Refund>(&body).ok(), Some(refund));
                }
            }

            /// A failure that names a refund names one the provider showed as failed under this
            /// key, or one it named in a 402: never one that may have moved money.
            #[test]
            fn a_failure_names_only_a_refund_shown_failed(status in 100u16..=999, body in any_body()) {
                if let RefundOutcome::Failed { refund_id: Some(id), .. } = RefundOutcome::from_response(status, None, &body, KEY) {
                    match status {
                        200 | 201 => {
                            let refund: Refund = serde_json::from_slice(&body).unwrap();
                            prop_assert!(matches!(refund.status, RefundState::Failed | RefundState::Canceled));
                            prop_assert_eq!(refund.idempotency_key.as_deref(), Some(KEY));
                            prop_assert_eq!(refund.id, id);
                        }
                        402 => {}
                        other => prop_assert!(false, "HTTP {} named refund {}", other, id),
                    }
                }
            }

            #[test]
            fn a_body_naming_a_member_twice_is_uncertain_whatever_the_status(
                status in 100u16..=999,
                body in with_a_repeated_member(prop_oneof![
                    refund().prop_map(|r| serde_json::to_value(r).unwrap()),
                    error_body().prop_map(|e| serde_json::to_value(e).unwrap()),
                ]),
            ) {
                prop_assert_eq!(
                    RefundOutcome::from_response(status, None, &body, KEY),
                    RefundOutcome::Uncertain(UncertainReason::UnreadableResponse)
                );
            }

            /// A success whose body cannot be read may well have refunded: never a failure.
            #[test]
            fn an_unreadable_success_is_uncertain(
                status in prop_oneof![Just(200u16), Just(201)],
                body in any_body().prop_filter("unreadable", |body| serde_json::from_slice::<Refund>(body).is_err()),
            ) {
                prop_assert_eq!(
                    RefundOutcome::from_response(status, None, &body, KEY),
                    RefundOutcome::Uncertain(UncertainReason::UnreadableResponse)
                );
            }
        }
    }
}
