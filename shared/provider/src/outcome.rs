//! Every way a provider call can end, as a type.
//!
//! - Definitive ([`SendOutcome::Charged`], [`SendOutcome::Declined`]): this request charged, or moved
//!   no money. A decline ends the payment `failed` unless an earlier send may have charged and the
//!   provider showed no failed charge of the payment's own (then the reconciler settles it).
//! - Not sent ([`SendOutcome::NotSent`]): the request provably never reached the provider, or the
//!   provider provably refused it without creating anything. Safe to retry with backoff.
//! - Uncertain ([`SendOutcome::Uncertain`]): the provider may have charged and the response was lost,
//!   or says nothing readable (a body that names a member twice is that, whatever its status). Only
//!   the reconciler may settle it.
//!
//! When in doubt a case is uncertain: calling an unsent request uncertain costs a reconciliation;
//! calling a sent one "not sent" can cost a double charge.

use std::time::Duration;

use oncepay_domain::strict_json::{self, StrictJsonError};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::wire::{Charge, ChargeStatus, ErrorBody};

/// How a `create_charge` call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// The customer was charged.
    Charged(Charge),
    /// The provider declined, or rejected the request as invalid: this request moved no money.
    Declined {
        /// A stable code (`card_declined`, or `provider_rejected` for a 400).
        code: String,
        /// A human-readable reason.
        message: String,
        /// The payment's own failed charge, when the provider showed one: what proves that the
        /// payment charged nothing under its key. Without it, a decline or refusal proves only that
        /// this request charged nothing, not an earlier one with the same key.
        charge_id: Option<String>,
    },
    /// No charge can have been created by this request; retry later with the same key.
    NotSent {
        /// Why.
        reason: NotSentReason,
        /// The provider's `Retry-After`, if it gave one.
        retry_after: Option<Duration>,
    },
    /// The provider may have charged; reconcile.
    Uncertain(UncertainReason),
}

/// Why a request provably created no charge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotSentReason {
    /// No connection was made (refused, DNS failure, connect timeout).
    #[error("could not connect to the provider")]
    ConnectFailed,
    /// The request could not be built locally.
    #[error("the request could not be built")]
    LocalError,
    /// 429: the provider rate-limited us before doing anything.
    #[error("the provider rate-limited the request")]
    RateLimited,
    /// 401/403: the provider refused our credentials before doing anything.
    #[error("the provider refused oncepay's credentials (HTTP {0})")]
    Unauthorized(u16),
}

/// Why the outcome of a request is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UncertainReason {
    /// No response within the timeout.
    #[error("the provider did not respond in time")]
    Timeout,
    /// The connection broke after the request was sent.
    #[error("the connection broke after the request was sent")]
    ConnectionLost,
    /// A 5xx: the provider may have charged before failing.
    #[error("the provider responded with HTTP {0}")]
    ServerError(u16),
    /// 409: an earlier attempt with the same key is still in flight at the provider.
    #[error("an earlier attempt with the same key is still in flight at the provider")]
    KeyInFlight,
    /// The provider saw this key before with other parameters (the simulator's 422, Stripe's 400
    /// `idempotency_error`): what the first request did is unknown.
    #[error("the provider saw this idempotency key before with other parameters")]
    KeyReused,
    /// A status the protocol does not define.
    #[error("the provider responded with an unexpected HTTP {0}")]
    UnexpectedStatus(u16),
    /// A success whose body could not be read: the charge probably exists.
    #[error("the provider's response could not be read")]
    UnreadableResponse,
    /// The provider took the payment but has not finished it (Stripe's `processing` or
    /// `requires_action`): it may still take the money.
    #[error("the provider has not finished the payment yet")]
    NotFinal,
}

/// A lookup (`GET`) that got no usable response. Lookups are safe to repeat.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The provider could not be reached, or did not respond.
    #[error("the provider could not be reached: {0}")]
    Transport(#[source] reqwest::Error),
    /// The provider responded with an error status.
    #[error("the provider responded with HTTP {0}")]
    Status(u16),
    /// The response body could not be read.
    #[error("the provider's response could not be read: {0}")]
    Unreadable(String),
    /// The provider responded, but what it showed proves neither a charge nor its absence (an
    /// eventually consistent search that found nothing, an intent still processing).
    #[error("the provider's responses prove nothing yet: {0}")]
    Inconclusive(String),
}

impl SendOutcome {
    /// Classifies an HTTP response to `POST /v1/charges`, sent under the idempotency key `key`.
    pub fn from_response(status: u16, retry_after: Option<Duration>, body: &[u8], key: &str) -> Self {
        let json = match response_json(body) {
            Ok(json) => json,
            Err(reason) => return Self::Uncertain(reason),
        };
        match status {
            201 | 200 => match read::<Charge>(json.as_ref()) {
                // The settlement judges a succeeded charge's key, and makes a wrong one an operator's
                // conflict; a failed one is proof of no charge only if it is this payment's.
                Some(charge) if charge.status == ChargeStatus::Succeeded => Self::Charged(charge),
                Some(charge) if charge.idempotency_key != key => {
                    Self::Uncertain(UncertainReason::UnexpectedStatus(status))
                }
                Some(charge) => Self::Declined {
                    code: charge.failure_code.unwrap_or_else(|| "declined".to_owned()),
                    message: charge.failure_message.unwrap_or_else(|| "The provider declined the charge.".to_owned()),
                    charge_id: Some(charge.id),
                },
                None => Self::Uncertain(UncertainReason::UnreadableResponse),
            },
            402 => match read::<ErrorBody>(json.as_ref()) {
                Some(ErrorBody { error }) => {
                    Self::Declined { code: error.code, message: error.message, charge_id: error.charge }
                }
                None => Self::Declined {
                    code: "declined".to_owned(),
                    message: "The provider declined the charge.".to_owned(),
                    charge_id: None,
                },
            },
            400 => Self::Declined {
                code: "provider_rejected".to_owned(),
                message: read::<ErrorBody>(json.as_ref())
                    .map(|b| b.error.message)
                    .unwrap_or_else(|| "The provider rejected the request as invalid.".to_owned()),
                charge_id: None,
            },
            other => Unsettled::from_status(other, retry_after).into(),
        }
    }

    /// Classifies a call that got no HTTP response.
    pub fn from_transport_error(error: &reqwest::Error) -> Self {
        Unsettled::from_transport_error(error).into()
    }

    /// A short label for metrics and logs: `charged`, `declined`, `not_sent`, `uncertain`.
    pub const fn class(&self) -> &'static str {
        match self {
            Self::Charged(_) => "charged",
            Self::Declined { .. } => "declined",
            Self::NotSent { .. } => "not_sent",
            Self::Uncertain(_) => "uncertain",
        }
    }
}

/// How a create ended when its response says nothing of the object it asked for: provably not
/// sent, or uncertain. Shared by every kind of create (charges, refunds), so a status or a broken
/// connection means the same for each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unsettled {
    /// Nothing can have been created by this request.
    NotSent {
        /// Why.
        reason: NotSentReason,
        /// The provider's `Retry-After`, if it gave one.
        retry_after: Option<Duration>,
    },
    /// Something may have been created.
    Uncertain(UncertainReason),
}

impl Unsettled {
    /// Classifies a status that does not show the object: 401, 403 and 429 refuse before acting;
    /// 409, 422, a 5xx and anything the protocol does not define prove nothing.
    pub(crate) fn from_status(status: u16, retry_after: Option<Duration>) -> Self {
        match status {
            401 | 403 => Self::NotSent { reason: NotSentReason::Unauthorized(status), retry_after: None },
            429 => Self::NotSent { reason: NotSentReason::RateLimited, retry_after },
            409 => Self::Uncertain(UncertainReason::KeyInFlight),
            422 => Self::Uncertain(UncertainReason::KeyReused),
            500..=599 => Self::Uncertain(UncertainReason::ServerError(status)),
            other => Self::Uncertain(UncertainReason::UnexpectedStatus(other)),
        }
    }

    /// Classifies a call that got no HTTP response.
    pub(crate) fn from_transport_error(error: &reqwest::Error) -> Self {
        if error.is_builder() {
            Self::NotSent { reason: NotSentReason::LocalError, retry_after: None }
        } else if error.is_connect() {
            // Connect errors (refused, DNS, connect timeout) happen before a byte of the request left.
            Self::NotSent { reason: NotSentReason::ConnectFailed, retry_after: None }
        } else if error.is_timeout() {
            Self::Uncertain(UncertainReason::Timeout)
        } else {
            Self::Uncertain(UncertainReason::ConnectionLost)
        }
    }
}

impl From<Unsettled> for SendOutcome {
    fn from(unsettled: Unsettled) -> Self {
        match unsettled {
            Unsettled::NotSent { reason, retry_after } => Self::NotSent { reason, retry_after },
            Unsettled::Uncertain(reason) => Self::Uncertain(reason),
        }
    }
}

/// A create's response body, read once and strictly, for every adapter's classification: its JSON,
/// or `None` when it is not JSON. A body that names a member twice, or names one with one of
/// serde_json's private marker names, is an error: it means different things to different readers, so it proves nothing,
/// whatever the status says.
pub(crate) fn response_json(body: &[u8]) -> Result<Option<Value>, UncertainReason> {
    match strict_json::parse(body) {
        Ok(json) => Ok(Some(json)),
        Err(StrictJsonError::Json(_)) => Ok(None),
        Err(StrictJsonError::RepeatedMember { .. } | StrictJsonError::ReservedMember { .. }) => {
            Err(UncertainReason::UnreadableResponse)
        }
    }
}

/// `json` as a `T`, if it is one.
pub(crate) fn read<T: DeserializeOwned>(json: Option<&Value>) -> Option<T> {
    json.and_then(|json| T::deserialize(json).ok())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The key the requests below were sent under, as the charges in their responses name it.
    const KEY: &str = "oncepay-x";

    fn charge(status: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "id": "ch_1", "status": status, "amount": 100, "currency": "EUR", "customer": "c",
            "idempotency_key": "oncepay-x", "created": 1, "failure_code": "card_declined",
            "failure_message": "declined"
        }))
        .unwrap()
    }

    #[test]
    fn each_response_is_classified() {
        let decline = br#"{"error":{"code":"insufficient_funds","message":"No money","charge":"ch_9"}}"#;
        let cases: Vec<(u16, Vec<u8>, &str)> = vec![
            (201, charge("succeeded"), "charged"),
            (201, charge("failed"), "declined"),
            (201, b"{not json".to_vec(), "uncertain"),
            (402, decline.to_vec(), "declined"),
            (402, b"".to_vec(), "declined"),
            (400, b"".to_vec(), "declined"),
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
            assert_eq!(SendOutcome::from_response(status, None, &body, KEY).class(), class, "HTTP {status}");
        }
    }

    /// Readers disagree on which of two members counts, so such a body proves nothing: not a charge,
    /// not a decline, not a refusal before acting.
    #[test]
    fn a_body_that_names_a_member_twice_is_uncertain_whatever_the_status() {
        let charge = |status: &str, metadata: &str| {
            format!(
                r#"{{"id":"ch_1","status":"{status}","amount":100,"currency":"EUR","customer":"c",
                    "idempotency_key":"oncepay-x","created":1,"metadata":{metadata}}}"#
            )
        };
        let cases = [
            (201, charge("succeeded", r#"{"oncepay_payment_id":"a","oncepay_payment_id":"b"}"#)),
            (201, charge("succeeded", "{}").replace(r#""created":1"#, r#""created":1,"note":1,"note":2"#)),
            (200, charge("failed", r#"{"order":"1","order":"2"}"#)),
            (402, r#"{"error":{"code":"card_declined","message":"No","charge":"ch_1","charge":"ch_2"}}"#.to_owned()),
            (402, r#"{"error":{"code":"card_declined","message":"No"},"error":{"code":"x","message":"y"}}"#.to_owned()),
            (400, r#"{"error":{"code":"invalid","message":"No","message":"Yes"}}"#.to_owned()),
            (401, r#"{"error":{"code":"auth","code":"auth","message":"No"}}"#.to_owned()),
            (429, r#"{"retry":1,"retry":2}"#.to_owned()),
            (409, r#"{"a":1,"a":1}"#.to_owned()),
            (503, r#"{"a":1,"a":1}"#.to_owned()),
            // serde_json would read the text this member holds as the body.
            (402, r#"{"$serde_json::private::RawValue":"{\"error\":{\"code\":\"x\",\"message\":\"y\"}}"}"#.to_owned()),
        ];
        for (status, body) in cases {
            assert_eq!(
                SendOutcome::from_response(status, None, body.as_bytes(), KEY),
                SendOutcome::Uncertain(UncertainReason::UnreadableResponse),
                "HTTP {status}: {body}"
            );
        }
    }

    /// Only the payment's own failed charge proves that it charged nothing: a failed charge made under
    /// another key says nothing of this payment.
    #[test]
    fn a_failed_charge_under_another_key_proves_nothing() {
        let body = String::from_utf8(charge("failed")).unwrap().replace(KEY, "oncepay-another");

        let outcome = SendOutcome::from_response(201, None, body.as_bytes(), KEY);

        assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::UnexpectedStatus(201)));
    }

    #[test]
    fn a_decline_keeps_the_providers_code_and_charge() {
        let body = br#"{"error":{"code":"insufficient_funds","message":"No money","charge":"ch_9"}}"#;

        let outcome = SendOutcome::from_response(402, None, body, KEY);

        assert_eq!(
            outcome,
            SendOutcome::Declined {
                code: "insufficient_funds".into(),
                message: "No money".into(),
                charge_id: Some("ch_9".into())
            }
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;
        use super::KEY;
        use crate::wire::strategies::{charge, error_body, with_a_repeated_member};

        /// What a provider, a proxy or a broken connection may put in a body.
        fn any_body() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                charge().prop_map(|c| serde_json::to_vec(&c).unwrap()),
                error_body().prop_map(|e| serde_json::to_vec(&e).unwrap()),
                // A success cut short: the charge exists, its response did not arrive whole.
                (charge(), any::<proptest::sample::Index>()).prop_map(|(c, cut)| {
                    let text = serde_json::to_vec(&c).unwrap();
                    text[..cut.index(text.len())].to_vec()
                }),
                proptest::collection::vec(any::<u8>(), 0..256),
                Just(b"<html>502 Bad Gateway</html>".to_vec()),
            ]
        }

        proptest! {
            /// "Not sent" allows a resend with backoff, so only a response that proves nothing was
            /// done may be classified so: whatever the body says, only 401, 403 and 429.
            #[test]
            fn only_a_refusal_before_acting_is_not_sent(status in 100u16..=999, body in any_body()) {
                let outcome = SendOutcome::from_response(status, None, &body, KEY);

                if matches!(outcome, SendOutcome::NotSent { .. }) {
                    prop_assert!([401, 403, 429].contains(&status), "HTTP {} was called not sent", status);
                }
            }

            #[test]
            fn a_server_error_is_uncertain_whatever_its_body_says(status in 500u16..=599, body in any_body()) {
                prop_assert_eq!(
                    SendOutcome::from_response(status, None, &body, KEY),
                    SendOutcome::Uncertain(UncertainReason::ServerError(status))
                );
            }

            /// A payment is recorded as charged only from a success that shows a succeeded charge,
            /// and with exactly that charge.
            #[test]
            fn charged_only_from_a_success_showing_a_succeeded_charge(status in 100u16..=999, body in any_body()) {
                if let SendOutcome::Charged(charge) = SendOutcome::from_response(status, None, &body, KEY) {
                    prop_assert!(status == 200 || status == 201, "HTTP {} was called charged", status);
                    prop_assert_eq!(charge.status, ChargeStatus::Succeeded);
                    prop_assert_eq!(serde_json::from_slice::<Charge>(&body).ok(), Some(charge));
                }
            }

            /// A body that names a member twice reads differently to different readers: whatever
            /// the status, it proves nothing.
            #[test]
            fn a_body_naming_a_member_twice_is_uncertain_whatever_the_status(
                status in 100u16..=999,
                body in with_a_repeated_member(prop_oneof![
                    charge().prop_map(|c| serde_json::to_value(c).unwrap()),
                    error_body().prop_map(|e| serde_json::to_value(e).unwrap()),
                ]),
            ) {
                prop_assert_eq!(
                    SendOutcome::from_response(status, None, &body, KEY),
                    SendOutcome::Uncertain(UncertainReason::UnreadableResponse)
                );
            }

            /// A success whose body cannot be read may well have charged: never a decline.
            #[test]
            fn an_unreadable_success_is_uncertain(
                status in prop_oneof![Just(200u16), Just(201)],
                body in any_body().prop_filter("unreadable", |body| serde_json::from_slice::<Charge>(body).is_err()),
            ) {
                prop_assert_eq!(
                    SendOutcome::from_response(status, None, &body, KEY),
                    SendOutcome::Uncertain(UncertainReason::UnreadableResponse)
                );
            }
        }
    }

    #[test]
    fn rate_limiting_carries_the_providers_retry_after() {
        let outcome = SendOutcome::from_response(429, Some(Duration::from_secs(3)), b"", KEY);

        assert_eq!(
            outcome,
            SendOutcome::NotSent { reason: NotSentReason::RateLimited, retry_after: Some(Duration::from_secs(3)) }
        );
    }
}
