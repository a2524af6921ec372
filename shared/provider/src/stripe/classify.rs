//! What Stripe's response to creating and confirming a PaymentIntent means, as a [`SendOutcome`],
//! and what its response to creating a Refund means, as a [`RefundOutcome`]. Pure: no I/O.
//!
//! Stripe saves the first response to an idempotency key, errors included, and replays it to every
//! resend with that key; its rate limiter and most parameter checks run before that layer and save
//! nothing. So a response is the outcome of the first request that reached the endpoint with this key,
//! or of a check that every resend (the same parameters, the same API version) fails alike. A response
//! that does not prove what happened is uncertain: a wrong "declined" or "not sent" can lose or
//! double a charge, a wrong "uncertain" costs a reconciliation.

use std::time::Duration;

use serde_json::Value;

use crate::outcome::{read, response_json};
use oncepay_domain::ids::DownstreamKey;

use crate::{NotSentReason, RefundOutcome, RefundRequest, SendOutcome, UncertainReason};

use super::wire::{
    DECLINED, ErrorBody, PaymentIntent, RefundStatus, Settled, StripeError, StripeRefund, error_types, in_our_words,
};

/// The failure code of a request Stripe refused as invalid.
pub const PROVIDER_REJECTED: &str = "provider_rejected";

/// The code Stripe gives a 429 that came from a lock on an object, not from the rate limiter.
const LOCK_TIMEOUT: &str = "lock_timeout";

/// Classifies Stripe's response to `POST /v1/payment_intents` with `confirm=true`, sent under the
/// idempotency key `key`.
pub fn create_outcome(status: u16, retry_after: Option<Duration>, body: &[u8], key: &str) -> SendOutcome {
    // Read once, strictly: a body that names a member twice is uncertain whatever the status.
    let json = match response_json(body) {
        Ok(json) => json,
        Err(reason) => return SendOutcome::Uncertain(reason),
    };
    let body = json.as_ref();
    match status {
        200 => match read::<PaymentIntent>(body) {
            Some(intent) => intent_outcome(&intent, key),
            // A 200 means the intent exists; a body cut short or mangled does not say how it ended.
            None => SendOutcome::Uncertain(UncertainReason::UnreadableResponse),
        },
        402 => match read_error(body) {
            Some(error) if error.error_type == error_types::CARD => card_declined(&error, key),
            _ => unexpected(status),
        },
        400 => match read_error(body) {
            // The key was used before with other parameters: the first request's outcome is unknown.
            Some(error) if error.error_type == error_types::IDEMPOTENCY => {
                SendOutcome::Uncertain(UncertainReason::KeyReused)
            }
            Some(error) if error.error_type == error_types::INVALID_REQUEST => rejected(&error, key),
            // Not Stripe's error shape (a proxy's page, say): nothing proves no charge was made.
            _ => unexpected(status),
        },
        // Authentication runs before anything else, and saves nothing under the key.
        401 | 403 => SendOutcome::NotSent { reason: NotSentReason::Unauthorized(status), retry_after: None },
        429 => match read_error(body) {
            // A lock on an object is met while the request runs, not before it: no proof of nothing.
            Some(error) if error.code.as_deref() == Some(LOCK_TIMEOUT) => unexpected(status),
            // The rate limiter runs before the idempotency layer and before any work.
            _ => SendOutcome::NotSent { reason: NotSentReason::RateLimited, retry_after },
        },
        409 => SendOutcome::Uncertain(UncertainReason::KeyInFlight),
        // Including a 500 replayed for a resend: the first request may have charged before failing.
        500..=599 => SendOutcome::Uncertain(UncertainReason::ServerError(status)),
        other => unexpected(other),
    }
}

fn read_error(body: Option<&Value>) -> Option<StripeError> {
    read::<ErrorBody>(body).map(|b| b.error)
}

/// A status, or a body under a status, that does not prove how the request ended.
const fn unexpected(status: u16) -> SendOutcome {
    SendOutcome::Uncertain(UncertainReason::UnexpectedStatus(status))
}

/// The outcome an intent in a response shows. An intent that is not this payment's proves nothing
/// about it, charged or declined.
fn intent_outcome(intent: &PaymentIntent, key: &str) -> SendOutcome {
    if !is_own(intent, key) {
        return unexpected(200);
    }
    match intent.settled(key) {
        Settled::Final(charge) if charge.status == crate::ChargeStatus::Succeeded => SendOutcome::Charged(*charge),
        Settled::Final(charge) => SendOutcome::Declined {
            code: charge.failure_code.unwrap_or_else(|| "declined".to_owned()),
            message: charge.failure_message.unwrap_or_else(|| in_our_words(DECLINED, None, None)),
            charge_id: Some(charge.id),
        },
        // `processing`, `requires_action` and the like may still take the money: the reconciler
        // settles them.
        Settled::NotFinal(_) => SendOutcome::Uncertain(UncertainReason::NotFinal),
    }
}

/// A 402 `card_error`: the card was declined, unless the intent it carries shows otherwise. Only the
/// payment's own failed intent is named (`charge_id`) as proof that the payment charged nothing.
fn card_declined(error: &StripeError, key: &str) -> SendOutcome {
    if let Some(intent) = &error.payment_intent
        && !own_failed(intent, key)
    {
        return unexpected(402);
    }
    SendOutcome::Declined {
        code: error
            .decline_code
            .as_deref()
            .or(error.code.as_deref())
            .filter(|c| !c.trim().is_empty())
            .unwrap_or("card_declined")
            .to_owned(),
        message: in_our_words(DECLINED, error.code.as_deref(), error.decline_code.as_deref()),
        charge_id: error.payment_intent.as_ref().map(|i| i.id.clone()),
    }
}

/// A 400 `invalid_request_error`: this request charged nothing. Either it is the saved outcome of
/// the first request that ran with the key, or it comes from a check that runs before the
/// idempotency layer, and then it says nothing of an earlier request with the key, which may have
/// charged before something changed (a payment method detached, a limit lowered). So it names the
/// payment's own failed intent as proof when the body carries one, and otherwise leaves the worker
/// to judge whether an earlier send may have charged. An intent that may still take money, or that
/// is another payment's, overrules it.
fn rejected(error: &StripeError, key: &str) -> SendOutcome {
    if let Some(intent) = &error.payment_intent
        && !own_failed(intent, key)
    {
        return unexpected(400);
    }
    SendOutcome::Declined {
        code: PROVIDER_REJECTED.to_owned(),
        message: in_our_words("Stripe refused the request as invalid", error.code.as_deref(), None),
        charge_id: error.payment_intent.as_ref().map(|i| i.id.clone()),
    }
}

/// Whether `intent` names, in its metadata, the payment whose downstream key is `key`.
fn is_own(intent: &PaymentIntent, key: &str) -> bool {
    intent.payment_id().is_some_and(|payment| DownstreamKey::parse_payment_id(key) == Some(payment))
}

/// Whether `intent` is the failed intent of the payment whose downstream key is `key`.
fn own_failed(intent: &PaymentIntent, key: &str) -> bool {
    is_own(intent, key)
        && matches!(intent.settled(key), Settled::Final(charge) if charge.status == crate::ChargeStatus::Failed)
}

/// The start of a failed refund's message, which Stripe's reason follows.
pub const REFUND_FAILED: &str = "Stripe could not refund the payment";

/// Classifies Stripe's response to `POST /v1/refunds` for `request`, sent under its downstream key.
/// The account is the request's: Stripe's objects do not name the one they live in.
///
/// The same rules as for a charge (the idempotency layer replays a key's first response, errors
/// included; the rate limiter and authentication run before it), with a refund's own meanings, as
/// Stripe's API reference documents the Refund object's `status`: `succeeded` is refunded;
/// `pending` and `requires_action` are taken but not finished; `failed` (its `failure_reason`
/// says why) and `canceled` moved no money, and name the refund as proof of it. Refunds have no
/// `card_error`, so a 402 proves nothing.
pub fn refund_outcome(
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
    request: &RefundRequest,
) -> RefundOutcome {
    let json = match response_json(body) {
        Ok(json) => json,
        Err(reason) => return RefundOutcome::Uncertain(reason),
    };
    let body = json.as_ref();
    match status {
        200 => match read::<StripeRefund>(body) {
            Some(refund) => refund_shown(&refund, request),
            // A 200 means the refund exists; a body cut short or mangled does not say how it ended.
            None => RefundOutcome::Uncertain(UncertainReason::UnreadableResponse),
        },
        400 => match read_error(body) {
            Some(error) if error.error_type == error_types::IDEMPOTENCY => {
                RefundOutcome::Uncertain(UncertainReason::KeyReused)
            }
            Some(error) if error.error_type == error_types::INVALID_REQUEST => refund_refused(&error),
            _ => refund_unexpected(status),
        },
        401 | 403 => RefundOutcome::NotSent { reason: NotSentReason::Unauthorized(status), retry_after: None },
        429 => match read_error(body) {
            Some(error) if error.code.as_deref() == Some(LOCK_TIMEOUT) => refund_unexpected(status),
            _ => RefundOutcome::NotSent { reason: NotSentReason::RateLimited, retry_after },
        },
        409 => RefundOutcome::Uncertain(UncertainReason::KeyInFlight),
        // Including a 500 replayed for a resend: the first request may have refunded before failing.
        500..=599 => RefundOutcome::Uncertain(UncertainReason::ServerError(status)),
        // A 402 is a card's decline, which a refund never gets; a 404 names no object of ours.
        other => refund_unexpected(other),
    }
}

/// A status, or a body under a status, that does not prove how a refund request ended.
const fn refund_unexpected(status: u16) -> RefundOutcome {
    RefundOutcome::Uncertain(UncertainReason::UnexpectedStatus(status))
}

/// The outcome a refund in a 200 shows. A refund that is not this request's (its metadata names
/// another oncepay refund, or it refunds another intent) proves nothing about this one.
fn refund_shown(refund: &StripeRefund, request: &RefundRequest) -> RefundOutcome {
    let ours = request.downstream_key.refund_id().is_some_and(|id| refund.is_for(id, &request.charge_id));
    if !ours {
        return refund_unexpected(200);
    }
    let booked = refund.to_refund(&request.charge_id, request.account.as_ref().map(|a| a.as_str()));
    match refund.status {
        Some(RefundStatus::Succeeded) => RefundOutcome::Refunded(booked),
        Some(RefundStatus::Failed) => RefundOutcome::Failed {
            code: refund
                .failure_reason
                .clone()
                .filter(|r| !r.trim().is_empty())
                .unwrap_or_else(|| "refund_failed".into()),
            message: in_our_words(REFUND_FAILED, refund.failure_reason.as_deref(), None),
            refund_id: Some(refund.id.clone()),
        },
        Some(RefundStatus::Canceled) => RefundOutcome::Failed {
            code: "refund_canceled".to_owned(),
            message: "Stripe canceled the refund.".to_owned(),
            refund_id: Some(refund.id.clone()),
        },
        // `pending`, `requires_action`, a status from the future or none: it may still move money.
        Some(RefundStatus::Pending | RefundStatus::RequiresAction | RefundStatus::Other) | None => {
            RefundOutcome::Unfinished(booked)
        }
    }
}

/// A 400 `invalid_request_error` (`charge_already_refunded`, `amount_too_large`, an unknown
/// intent, ...): this request refunded nothing. As for a charge, the code is oncepay's
/// `provider_rejected`, with Stripe's own code in the message, and it names no refund as proof: it
/// says nothing of an earlier request with the key, whose saved response may have expired, so the
/// worker judges whether an earlier send may have refunded.
fn refund_refused(error: &StripeError) -> RefundOutcome {
    RefundOutcome::Failed {
        code: PROVIDER_REJECTED.to_owned(),
        message: in_our_words("Stripe refused the refund as invalid", error.code.as_deref(), None),
        refund_id: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::ChargeStatus;
    use crate::stripe::wire::samples::{declined_intent, error, intent, refund};

    const PAYMENT: &str = "0196a0c4-0000-7000-8000-0000000000aa";
    const KEY: &str = "oncepay-0196a0c4-0000-7000-8000-0000000000aa";

    fn bytes(value: &Value) -> Vec<u8> {
        serde_json::to_vec(value).unwrap()
    }

    fn card_error(with_intent: Option<Value>) -> Value {
        let mut body = error("card_error", Some("card_declined"), "Your card has insufficient funds.");
        body["error"]["decline_code"] = json!("insufficient_funds");
        if let Some(intent) = with_intent {
            body["error"]["payment_intent"] = intent;
        }
        body
    }

    fn invalid_request(with_intent: Option<Value>) -> Value {
        let mut body = error("invalid_request_error", Some("resource_missing"), "No such PaymentMethod: 'pm_x'");
        body["error"]["param"] = json!("payment_method");
        if let Some(intent) = with_intent {
            body["error"]["payment_intent"] = intent;
        }
        body
    }

    fn label(outcome: &SendOutcome) -> String {
        match outcome {
            SendOutcome::Charged(_) => "charged".into(),
            SendOutcome::Declined { code, .. } => format!("declined {code}"),
            SendOutcome::NotSent { reason, .. } => format!("not sent: {reason}"),
            SendOutcome::Uncertain(reason) => format!("uncertain: {reason}"),
        }
    }

    #[test]
    fn each_response_stripe_documents_is_classified() {
        let idempotency = error(
            "idempotency_error",
            None,
            "Keys for idempotent requests can only be used with the same parameters they were first used with.",
        );
        let lock = error("invalid_request_error", Some("lock_timeout"), "This object cannot be accessed right now.");
        let rate = error("invalid_request_error", Some("rate_limit"), "Too many requests.");
        let api = error("api_error", None, "Something went wrong on Stripe's end.");
        let not_final = "uncertain: the provider has not finished the payment yet";
        let cases: Vec<(&str, u16, Vec<u8>, &str)> = vec![
            ("succeeded", 200, bytes(&intent("pi_1", "succeeded", PAYMENT)), "charged"),
            ("processing", 200, bytes(&intent("pi_1", "processing", PAYMENT)), not_final),
            ("requires_action", 200, bytes(&intent("pi_1", "requires_action", PAYMENT)), not_final),
            ("requires_confirmation", 200, bytes(&intent("pi_1", "requires_confirmation", PAYMENT)), not_final),
            ("requires_capture", 200, bytes(&intent("pi_1", "requires_capture", PAYMENT)), not_final),
            ("never confirmed", 200, bytes(&intent("pi_1", "requires_payment_method", PAYMENT)), not_final),
            ("failed confirmation", 200, bytes(&declined_intent("pi_1", PAYMENT)), "declined insufficient_funds"),
            ("canceled", 200, bytes(&intent("pi_1", "canceled", PAYMENT)), "declined canceled"),
            (
                "unreadable 200",
                200,
                b"{\"id\":\"pi_1\",\"sta".to_vec(),
                "uncertain: the provider's response could not be read",
            ),
            (
                "card declined",
                402,
                bytes(&card_error(Some(declined_intent("pi_1", PAYMENT)))),
                "declined insufficient_funds",
            ),
            ("card declined, no intent", 402, bytes(&card_error(None)), "declined insufficient_funds"),
            (
                "card error, intent still processing",
                402,
                bytes(&card_error(Some(intent("pi_1", "processing", PAYMENT)))),
                "uncertain: the provider responded with an unexpected HTTP 402",
            ),
            ("402 not a card error", 402, bytes(&api), "uncertain: the provider responded with an unexpected HTTP 402"),
            ("402 unreadable", 402, b"".to_vec(), "uncertain: the provider responded with an unexpected HTTP 402"),
            (
                "idempotency error",
                400,
                bytes(&idempotency),
                "uncertain: the provider saw this idempotency key before with other parameters",
            ),
            ("invalid request", 400, bytes(&invalid_request(None)), "declined provider_rejected"),
            (
                "invalid request, failed intent",
                400,
                bytes(&invalid_request(Some(declined_intent("pi_1", PAYMENT)))),
                "declined provider_rejected",
            ),
            (
                "invalid request, intent that may still charge",
                400,
                bytes(&invalid_request(Some(intent("pi_1", "requires_action", PAYMENT)))),
                "uncertain: the provider responded with an unexpected HTTP 400",
            ),
            (
                "400 from a proxy",
                400,
                b"<html>Bad Request</html>".to_vec(),
                "uncertain: the provider responded with an unexpected HTTP 400",
            ),
            ("400 api_error", 400, bytes(&api), "uncertain: the provider responded with an unexpected HTTP 400"),
            (
                "401",
                401,
                bytes(&error("invalid_request_error", None, "Invalid API Key provided")),
                "not sent: the provider refused oncepay's credentials (HTTP 401)",
            ),
            ("403", 403, b"".to_vec(), "not sent: the provider refused oncepay's credentials (HTTP 403)"),
            ("429 rate limited", 429, bytes(&rate), "not sent: the provider rate-limited the request"),
            ("429 empty", 429, b"".to_vec(), "not sent: the provider rate-limited the request"),
            ("429 lock timeout", 429, bytes(&lock), "uncertain: the provider responded with an unexpected HTTP 429"),
            (
                "409 in flight",
                409,
                bytes(&error("idempotency_error", Some("idempotency_key_in_use"), "in use")),
                "uncertain: an earlier attempt with the same key is still in flight at the provider",
            ),
            ("500 replayed", 500, bytes(&api), "uncertain: the provider responded with HTTP 500"),
            ("502", 502, b"".to_vec(), "uncertain: the provider responded with HTTP 502"),
            ("404", 404, b"".to_vec(), "uncertain: the provider responded with an unexpected HTTP 404"),
            ("424", 424, bytes(&api), "uncertain: the provider responded with an unexpected HTTP 424"),
            (
                "201",
                201,
                bytes(&intent("pi_1", "succeeded", PAYMENT)),
                "uncertain: the provider responded with an unexpected HTTP 201",
            ),
        ];
        for (name, status, body, expected) in cases {
            let outcome = create_outcome(status, None, &body, KEY);

            assert_eq!(label(&outcome), expected, "{name}");
        }
    }

    /// Readers disagree on which of two members counts, so such a body proves nothing, whatever the
    /// status: not a charge, not a decline, not a refusal before any work.
    #[test]
    fn a_body_that_names_a_member_twice_is_uncertain_whatever_the_status() {
        let text = |value: &Value| serde_json::to_string(value).unwrap();
        let ours = format!(r#""oncepay_payment_id":"{PAYMENT}""#);
        let other = r#""oncepay_payment_id":"0196a0c4-0000-7000-8000-0000000000bb""#;
        let succeeded = text(&intent("pi_1", "succeeded", PAYMENT));
        let declined = text(&card_error(Some(declined_intent("pi_1", PAYMENT))));
        let cases: Vec<(&str, u16, String)> = vec![
            ("an intent naming two payments", 200, succeeded.replace(&ours, &format!("{ours},{other}"))),
            ("an intent naming two payments, ours last", 200, succeeded.replace(&ours, &format!("{other},{ours}"))),
            (
                "an intent with two statuses",
                200,
                succeeded.replace(r#""status":"#, r#""status":"processing","status":"#),
            ),
            (
                "a field oncepay does not read, twice",
                200,
                succeeded.replace(r#""id":"#, r#""livemode":false,"livemode":true,"id":"#),
            ),
            ("a decline naming two payments", 402, declined.replace(&ours, &format!("{ours},{other}"))),
            (
                "a decline with two decline codes",
                402,
                declined.replace(r#""decline_code":"#, r#""decline_code":"x","decline_code":"#),
            ),
            (
                "two errors",
                400,
                format!(
                    r#"{{"error":{},"error":{}}}"#,
                    text(&invalid_request(None)["error"]),
                    text(&error("idempotency_error", None, "reused")["error"])
                ),
            ),
            (
                "an invalid request with two params",
                400,
                text(&invalid_request(None)).replace(r#""param":"#, r#""param":"amount","param":"#),
            ),
            (
                "a rate limit that is a lock timeout",
                429,
                r#"{"error":{"type":"invalid_request_error","code":"rate_limit","code":"lock_timeout"}}"#.to_owned(),
            ),
            ("401", 401, r#"{"error":{"type":"invalid_request_error","message":"a","message":"b"}}"#.to_owned()),
            ("500", 500, r#"{"error":{"type":"api_error","type":"api_error"}}"#.to_owned()),
        ];
        for (name, status, body) in cases {
            // JSON that serde_json reads, keeping the last of each repeated member.
            assert!(serde_json::from_str::<Value>(&body).is_ok(), "{name}: {body}");
            let outcome = create_outcome(status, None, body.as_bytes(), KEY);

            assert_eq!(label(&outcome), "uncertain: the provider's response could not be read", "{name}: {body}");
        }
    }

    #[test]
    fn a_success_becomes_the_charge_with_the_key_it_was_sent_under() {
        let body = bytes(&intent("pi_1", "succeeded", PAYMENT));

        let SendOutcome::Charged(charge) = create_outcome(200, None, &body, KEY) else { panic!("not charged") };

        assert_eq!(charge.id, "pi_1");
        assert_eq!(charge.status, ChargeStatus::Succeeded);
        assert_eq!(charge.amount, 1999);
        assert_eq!(charge.currency, "EUR");
        assert_eq!(charge.idempotency_key, KEY);
        assert_eq!(charge.created, 1_763_800_000);
        assert_eq!(charge.metadata.get(crate::metadata_keys::PAYMENT_ID).map(String::as_str), Some(PAYMENT));
    }

    #[test]
    fn the_amount_received_is_what_a_success_books() {
        let mut body = intent("pi_1", "succeeded", PAYMENT);
        body["amount_received"] = json!(1500);

        let SendOutcome::Charged(charge) = create_outcome(200, None, &bytes(&body), KEY) else { panic!("not charged") };

        assert_eq!(charge.amount, 1500);
    }

    #[test]
    fn only_the_payments_own_failed_intent_is_named_as_proof_that_it_charged_nothing() {
        const OTHER: &str = "0196a0c4-0000-7000-8000-0000000000bb";
        let charge_id = |status: u16, body: Value| match create_outcome(status, None, &bytes(&body), KEY) {
            SendOutcome::Declined { charge_id, .. } => Ok(charge_id),
            other => Err(label(&other)),
        };
        let uncertain =
            |status: u16| Err(format!("uncertain: the provider responded with an unexpected HTTP {status}"));
        let cases = [
            (
                "decline with its own intent",
                402,
                card_error(Some(declined_intent("pi_1", PAYMENT))),
                Ok(Some("pi_1".into())),
            ),
            ("decline without an intent", 402, card_error(None), Ok(None)),
            (
                "decline with another payment's intent",
                402,
                card_error(Some(declined_intent("pi_2", OTHER))),
                uncertain(402),
            ),
            (
                "refusal with its own intent",
                400,
                invalid_request(Some(declined_intent("pi_1", PAYMENT))),
                Ok(Some("pi_1".into())),
            ),
            ("refusal without an intent", 400, invalid_request(None), Ok(None)),
            (
                "refusal with another payment's intent",
                400,
                invalid_request(Some(declined_intent("pi_2", OTHER))),
                uncertain(400),
            ),
            ("its own declined intent", 200, declined_intent("pi_1", PAYMENT), Ok(Some("pi_1".into()))),
            ("another payment's declined intent", 200, declined_intent("pi_2", OTHER), uncertain(200)),
        ];
        for (name, status, body, expected) in cases {
            assert_eq!(charge_id(status, body), expected, "{name}");
        }
    }

    #[test]
    fn another_payments_succeeded_intent_is_never_taken_for_this_ones_charge() {
        const OTHER: &str = "0196a0c4-0000-7000-8000-0000000000bb";
        let body = bytes(&intent("pi_2", "succeeded", OTHER));

        let outcome = create_outcome(200, None, &body, KEY);

        assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::UnexpectedStatus(200)));
    }

    #[test]
    fn a_card_decline_keeps_the_issuers_reason_and_the_intent() {
        let body = bytes(&card_error(Some(declined_intent("pi_9", PAYMENT))));

        let outcome = create_outcome(402, None, &body, KEY);

        assert_eq!(
            outcome,
            SendOutcome::Declined {
                code: "insufficient_funds".into(),
                message: "Stripe declined the payment (code card_declined, decline code insufficient_funds).".into(),
                charge_id: Some("pi_9".into()),
            }
        );
    }

    #[test]
    fn a_card_decline_without_an_issuer_reason_keeps_stripes_code() {
        let body = bytes(&error("card_error", Some("expired_card"), "Your card has expired."));

        let outcome = create_outcome(402, None, &body, KEY);

        assert!(matches!(outcome, SendOutcome::Declined { ref code, .. } if code == "expired_card"), "{outcome:?}");
    }

    #[test]
    fn an_invalid_request_names_stripes_code_but_never_repeats_its_words() {
        let outcome = create_outcome(400, None, &bytes(&invalid_request(None)), KEY);

        assert_eq!(
            outcome,
            SendOutcome::Declined {
                code: PROVIDER_REJECTED.into(),
                message: "Stripe refused the request as invalid (code resource_missing).".into(),
                charge_id: None,
            }
        );
    }

    #[test]
    fn rate_limiting_carries_stripes_retry_after() {
        let outcome = create_outcome(429, Some(Duration::from_secs(2)), b"", KEY);

        assert_eq!(
            outcome,
            SendOutcome::NotSent { reason: NotSentReason::RateLimited, retry_after: Some(Duration::from_secs(2)) }
        );
    }

    // Refunds.

    const REFUND: &str = "0196a0c4-0000-7000-8000-0000000000cc";
    const OTHER_REFUND: &str = "0196a0c4-0000-7000-8000-0000000000dd";

    fn refund_request() -> RefundRequest {
        let refund: oncepay_domain::ids::RefundId = REFUND.parse().unwrap();
        RefundRequest::for_refund(
            "0196a0c4-0000-7000-8000-000000000001".parse().unwrap(),
            PAYMENT.parse().unwrap(),
            refund,
            "pi_1".to_owned(),
            oncepay_domain::money::Amount::new(500).unwrap(),
            oncepay_domain::money::Currency::parse("EUR").unwrap(),
            None,
            &std::collections::BTreeMap::new(),
        )
    }

    fn refund_label(outcome: &RefundOutcome) -> String {
        match outcome {
            RefundOutcome::Refunded(refund) => format!("refunded {}", refund.id),
            RefundOutcome::Unfinished(refund) => format!("unfinished {}", refund.id),
            RefundOutcome::Failed { code, refund_id, .. } => format!("failed {code} {refund_id:?}"),
            RefundOutcome::NotSent { reason, .. } => format!("not sent: {reason}"),
            RefundOutcome::Uncertain(reason) => format!("uncertain: {reason}"),
        }
    }

    #[test]
    fn each_refund_response_stripe_documents_is_classified() {
        let of = |status: &str| bytes(&refund("re_1", status, REFUND, "pi_1"));
        let refused = |code: &str| bytes(&error("invalid_request_error", Some(code), "Refused."));
        let idempotency = error(
            "idempotency_error",
            None,
            "Keys for idempotent requests can only be used with the same parameters they were first used with.",
        );
        let lock = error("invalid_request_error", Some("lock_timeout"), "This object cannot be accessed right now.");
        let rate = error("invalid_request_error", Some("rate_limit"), "Too many requests.");
        let api = error("api_error", None, "Something went wrong on Stripe's end.");
        let unexpected = |status: u16| format!("uncertain: the provider responded with an unexpected HTTP {status}");
        let mut without_status = refund("re_1", "succeeded", REFUND, "pi_1");
        without_status["status"] = Value::Null;
        let cases: Vec<(&str, u16, Vec<u8>, String)> = vec![
            ("succeeded", 200, of("succeeded"), "refunded re_1".into()),
            ("pending", 200, of("pending"), "unfinished re_1".into()),
            ("requires_action", 200, of("requires_action"), "unfinished re_1".into()),
            ("a status from the future", 200, of("a_status_from_the_future"), "unfinished re_1".into()),
            ("no status", 200, bytes(&without_status), "unfinished re_1".into()),
            ("failed", 200, of("failed"), r#"failed expired_or_canceled_card Some("re_1")"#.into()),
            ("canceled", 200, of("canceled"), r#"failed refund_canceled Some("re_1")"#.into()),
            ("another refund's", 200, bytes(&refund("re_2", "succeeded", OTHER_REFUND, "pi_1")), unexpected(200)),
            ("another intent's", 200, bytes(&refund("re_2", "failed", REFUND, "pi_2")), unexpected(200)),
            (
                "unreadable 200",
                200,
                b"{\"id\":\"re_1\",\"sta".to_vec(),
                "uncertain: the provider's response could not be read".into(),
            ),
            ("already refunded", 400, refused("charge_already_refunded"), "failed provider_rejected None".into()),
            ("more than is left", 400, refused("amount_too_large"), "failed provider_rejected None".into()),
            ("no such intent", 400, refused("resource_missing"), "failed provider_rejected None".into()),
            (
                "invalid, no code",
                400,
                bytes(&error("invalid_request_error", None, "Unexpected reason")),
                "failed provider_rejected None".into(),
            ),
            (
                "idempotency error",
                400,
                bytes(&idempotency),
                "uncertain: the provider saw this idempotency key before with other parameters".into(),
            ),
            ("400 from a proxy", 400, b"<html>Bad Request</html>".to_vec(), unexpected(400)),
            ("400 api_error", 400, bytes(&api), unexpected(400)),
            ("401", 401, b"".to_vec(), "not sent: the provider refused oncepay's credentials (HTTP 401)".into()),
            (
                "403 for an account the key may not touch",
                403,
                bytes(&error("invalid_request_error", None, "The provided key does not have access to account")),
                "not sent: the provider refused oncepay's credentials (HTTP 403)".into(),
            ),
            ("429 rate limited", 429, bytes(&rate), "not sent: the provider rate-limited the request".into()),
            ("429 lock timeout", 429, bytes(&lock), unexpected(429)),
            (
                "409 in flight",
                409,
                bytes(&error("idempotency_error", Some("idempotency_key_in_use"), "in use")),
                "uncertain: an earlier attempt with the same key is still in flight at the provider".into(),
            ),
            ("500 replayed", 500, bytes(&api), "uncertain: the provider responded with HTTP 500".into()),
            ("503", 503, b"".to_vec(), "uncertain: the provider responded with HTTP 503".into()),
            ("402", 402, bytes(&card_error(None)), unexpected(402)),
            ("404", 404, refused("resource_missing"), unexpected(404)),
            ("201", 201, of("succeeded"), unexpected(201)),
        ];
        for (name, status, body, expected) in cases {
            let outcome = refund_outcome(status, None, &body, &refund_request());

            assert_eq!(refund_label(&outcome), expected, "{name}");
        }
    }

    #[test]
    fn a_refund_response_that_names_a_member_twice_is_uncertain_whatever_the_status() {
        let text = serde_json::to_string(&refund("re_1", "succeeded", REFUND, "pi_1")).unwrap();
        let ours = format!(r#""oncepay_refund_id":"{REFUND}""#);
        let cases: Vec<(&str, u16, String)> = vec![
            (
                "a refund naming two refunds",
                200,
                text.replace(&ours, &format!(r#"{ours},"oncepay_refund_id":"{OTHER_REFUND}""#)),
            ),
            (
                "a refund naming two refunds, ours last",
                200,
                text.replace(&ours, &format!(r#""oncepay_refund_id":"{OTHER_REFUND}",{ours}"#)),
            ),
            ("a refund with two statuses", 200, text.replace(r#""status":"#, r#""status":"failed","status":"#)),
            (
                "an error with two codes",
                400,
                r#"{"error":{"type":"invalid_request_error","code":"charge_already_refunded","code":"x"}}"#.to_owned(),
            ),
            (
                "a rate limit that is a lock timeout",
                429,
                r#"{"error":{"type":"invalid_request_error","code":"rate_limit","code":"lock_timeout"}}"#.to_owned(),
            ),
        ];
        for (name, status, body) in cases {
            assert!(serde_json::from_str::<Value>(&body).is_ok(), "{name}: {body}");

            let outcome = refund_outcome(status, None, body.as_bytes(), &refund_request());

            assert_eq!(outcome, RefundOutcome::Uncertain(UncertainReason::UnreadableResponse), "{name}: {body}");
        }
    }

    #[test]
    fn a_succeeded_refund_becomes_the_refund_of_the_intent_in_the_requests_account() {
        let account = oncepay_domain::provider_ref::ProviderAccount::parse("acct_A").unwrap();
        let request = RefundRequest { account: Some(account), ..refund_request() };

        let outcome = refund_outcome(200, None, &bytes(&refund("re_1", "succeeded", REFUND, "pi_1")), &request);

        let RefundOutcome::Refunded(refund) = outcome else { panic!("{outcome:?}") };
        assert_eq!((refund.id.as_str(), refund.status), ("re_1", crate::RefundState::Succeeded));
        assert_eq!((refund.charge.as_str(), refund.amount, refund.currency.as_str()), ("pi_1", 500, "EUR"));
        assert_eq!((refund.idempotency_key.as_deref(), refund.account.as_deref()), (None, Some("acct_A")));
        assert_eq!(refund.metadata.get(crate::metadata_keys::REFUND_ID).map(String::as_str), Some(REFUND));
    }

    #[test]
    fn a_refused_refund_names_stripes_code_but_never_repeats_its_words() {
        let body = bytes(&error(
            "invalid_request_error",
            Some("charge_already_refunded"),
            "Charge ch_3Mt has already been refunded.",
        ));

        let outcome = refund_outcome(400, None, &body, &refund_request());

        assert_eq!(
            outcome,
            RefundOutcome::Failed {
                code: PROVIDER_REJECTED.into(),
                message: "Stripe refused the refund as invalid (code charge_already_refunded).".into(),
                refund_id: None,
            }
        );
    }

    #[test]
    fn a_failed_refund_keeps_stripes_reason_and_its_id() {
        let outcome = refund_outcome(200, None, &bytes(&refund("re_1", "failed", REFUND, "pi_1")), &refund_request());

        assert_eq!(
            outcome,
            RefundOutcome::Failed {
                code: "expired_or_canceled_card".into(),
                message: "Stripe could not refund the payment (code expired_or_canceled_card).".into(),
                refund_id: Some("re_1".into()),
            }
        );
    }

    #[test]
    fn a_rate_limited_refund_carries_stripes_retry_after() {
        let outcome = refund_outcome(429, Some(Duration::from_secs(2)), b"", &refund_request());

        assert_eq!(
            outcome,
            RefundOutcome::NotSent { reason: NotSentReason::RateLimited, retry_after: Some(Duration::from_secs(2)) }
        );
    }

    #[test]
    fn a_refund_sent_under_a_key_that_names_no_refund_is_never_taken_for_one() {
        // A payment's key: no refund of Stripe's can be this request's.
        let request = RefundRequest {
            downstream_key: PAYMENT.parse::<oncepay_domain::ids::PaymentId>().unwrap().downstream_key(),
            ..refund_request()
        };

        let outcome = refund_outcome(200, None, &bytes(&refund("re_1", "succeeded", REFUND, "pi_1")), &request);

        assert_eq!(outcome, RefundOutcome::Uncertain(UncertainReason::UnexpectedStatus(200)));
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;
        use super::{KEY, PAYMENT, bytes, card_error, invalid_request};
        use crate::ChargeStatus;
        use crate::stripe::wire::samples::{declined_intent, error, intent};

        fn status_name() -> impl Strategy<Value = &'static str> {
            prop_oneof![
                Just("succeeded"),
                Just("processing"),
                Just("requires_action"),
                Just("requires_confirmation"),
                Just("requires_capture"),
                Just("requires_payment_method"),
                Just("canceled"),
                Just("a_status_from_the_future"),
            ]
        }

        /// What Stripe, a proxy or a broken connection may put in a body.
        fn any_body() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                status_name().prop_map(|s| bytes(&intent("pi_1", s, PAYMENT))),
                Just(bytes(&declined_intent("pi_1", PAYMENT))),
                status_name().prop_map(|s| bytes(&card_error(Some(intent("pi_1", s, PAYMENT))))),
                status_name().prop_map(|s| bytes(&invalid_request(Some(intent("pi_1", s, PAYMENT))))),
                Just(bytes(&invalid_request(None))),
                Just(bytes(&error("idempotency_error", None, "reused"))),
                Just(bytes(&error("api_error", None, "oops"))),
                // A success cut short.
                (status_name(), any::<proptest::sample::Index>()).prop_map(|(s, cut)| {
                    let text = bytes(&intent("pi_1", s, PAYMENT));
                    text[..cut.index(text.len())].to_vec()
                }),
                proptest::collection::vec(any::<u8>(), 0..256),
            ]
        }

        proptest! {
            /// A body that names a member twice, anywhere, proves nothing, whatever the status.
            #[test]
            fn a_body_naming_a_member_twice_is_uncertain_whatever_the_status(
                status in 100u16..=999,
                body in crate::wire::strategies::with_a_repeated_member(prop_oneof![
                    status_name().prop_map(|s| intent("pi_1", s, PAYMENT)),
                    Just(declined_intent("pi_1", PAYMENT)),
                    status_name().prop_map(|s| card_error(Some(intent("pi_1", s, PAYMENT)))),
                    status_name().prop_map(|s| invalid_request(Some(intent("pi_1", s, PAYMENT)))),
                    Just(error("invalid_request_error", Some("rate_limit"), "Too many requests.")),
                ]),
            ) {
                prop_assert_eq!(
                    create_outcome(status, None, &body, KEY),
                    SendOutcome::Uncertain(UncertainReason::UnreadableResponse)
                );
            }

            /// Only a refusal before any work may be "not sent": 401, 403 and a rate-limit 429.
            #[test]
            fn only_a_refusal_before_any_work_is_not_sent(status in 100u16..=999, body in any_body()) {
                if matches!(create_outcome(status, None, &body, KEY), SendOutcome::NotSent { .. }) {
                    prop_assert!([401, 403, 429].contains(&status), "HTTP {} was called not sent", status);
                }
            }

            #[test]
            fn a_server_error_is_uncertain_whatever_its_body_says(status in 500u16..=599, body in any_body()) {
                prop_assert_eq!(
                    create_outcome(status, None, &body, KEY),
                    SendOutcome::Uncertain(UncertainReason::ServerError(status))
                );
            }

            /// Charged only from a 200 whose intent succeeded, and with that intent.
            #[test]
            fn charged_only_from_a_200_showing_a_succeeded_intent(status in 100u16..=999, body in any_body()) {
                if let SendOutcome::Charged(charge) = create_outcome(status, None, &body, KEY) {
                    prop_assert_eq!(status, 200);
                    let intent: PaymentIntent = serde_json::from_slice(&body).unwrap();
                    prop_assert_eq!(intent.status, crate::stripe::wire::IntentStatus::Succeeded);
                    prop_assert_eq!(charge.id, intent.id);
                    prop_assert_eq!(charge.status, ChargeStatus::Succeeded);
                }
            }

            /// A decline is concluded only where no intent in the body may still take the money.
            #[test]
            fn never_declined_while_an_intent_may_still_charge(status in 100u16..=999, body in any_body()) {
                if let SendOutcome::Declined { .. } = create_outcome(status, None, &body, KEY) {
                    prop_assert!([200, 400, 402].contains(&status), "HTTP {} was called declined", status);
                    let shown = serde_json::from_slice::<PaymentIntent>(&body).ok().or_else(|| {
                        serde_json::from_slice::<ErrorBody>(&body).ok().and_then(|b| b.error.payment_intent.map(|i| *i))
                    });
                    if let Some(intent) = shown {
                        prop_assert!(super::super::own_failed(&intent, KEY), "declined with intent in {:?}", intent.status);
                    }
                }
            }
        }
    }
}
