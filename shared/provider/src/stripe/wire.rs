//! Stripe's JSON, as far as oncepay reads it: the PaymentIntent, the Refund, the error body, a list
//! page, a search result and an event.
//!
//! Every type ignores fields it does not name, because Stripe adds fields without a new API version,
//! but a body is read strictly before it becomes one of them (`oncepay_domain::strict_json`): a
//! member named twice, even one ignored here, makes it unreadable. Nothing here decides what a
//! response means: [`classify`](super::classify) and [`lookup`](super::lookup) do.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use oncepay_domain::ids::{PaymentId, RefundId};

use crate::{Charge, ChargeStatus, RefundState, UnfinishedCharge, metadata_keys};

/// Where a PaymentIntent is in its life. Stripe may add statuses; an unknown one is
/// [`IntentStatus::Other`], which is never final.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentStatus {
    /// The money moved.
    Succeeded,
    /// The payment is still being processed (some payment methods settle later).
    Processing,
    /// The customer must act (3-D Secure, a redirect).
    RequiresAction,
    /// The intent waits for a confirmation.
    RequiresConfirmation,
    /// Authorised, waiting for a capture.
    RequiresCapture,
    /// No usable payment method: never confirmed, or its confirmation failed.
    RequiresPaymentMethod,
    /// Cancelled: it will never take money.
    Canceled,
    /// A status this code does not know.
    #[serde(other)]
    Other,
}

/// A reference Stripe sends either as an id or, when expanded, as the object itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Expandable {
    /// The bare id, e.g. `ch_…`.
    Id(String),
    /// The expanded object; only its id is read.
    Object {
        /// The object's id.
        id: String,
    },
}

impl Expandable {
    /// The referenced object's id.
    pub fn id(&self) -> &str {
        match self {
            Self::Id(id) | Self::Object { id } => id,
        }
    }
}

/// Why the last confirmation of an intent failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastPaymentError {
    /// `card_error`, `invalid_request_error`, ...
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// Stripe's code, e.g. `card_declined`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The issuer's reason, e.g. `insufficient_funds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// For humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl LastPaymentError {
    /// The most specific code Stripe gave: the issuer's reason, else Stripe's own code.
    pub fn best_code(&self) -> Option<&str> {
        self.decline_code.as_deref().or(self.code.as_deref()).filter(|c| !c.trim().is_empty())
    }
}

/// oncepay's own words for a payment Stripe did not take: `what` happened, with Stripe's `code` and
/// `decline_code` when it gave them. Stripe's own message is never passed on, to the merchant or
/// its customer: it can say whether an object id exists in the account.
pub fn in_our_words(what: &str, code: Option<&str>, decline_code: Option<&str>) -> String {
    fn given(text: Option<&str>) -> Option<&str> {
        text.map(str::trim).filter(|text| !text.is_empty())
    }
    let codes: Vec<String> = [("code", given(code)), ("decline code", given(decline_code))]
        .into_iter()
        .filter_map(|(name, value)| value.map(|value| format!("{name} {value}")))
        .collect();
    if codes.is_empty() { format!("{what}.") } else { format!("{what} ({}).", codes.join(", ")) }
}

/// The start of a declined payment's failure message, which Stripe's codes follow.
pub const DECLINED: &str = "Stripe declined the payment";

/// A PaymentIntent: one attempt to take one amount, the object oncepay creates for each payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentIntent {
    /// `pi_…`.
    pub id: String,
    /// Where it is in its life.
    pub status: IntentStatus,
    /// The amount asked for, in Stripe's unit of the currency.
    pub amount: i64,
    /// The amount that moved; zero until it succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_received: Option<i64>,
    /// Lower case, e.g. `eur`.
    pub currency: String,
    /// Creation time, Unix seconds.
    pub created: i64,
    /// Key/value pairs as sent, oncepay's own keys among them.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The Stripe Customer, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customer: Option<Expandable>,
    /// The charge of the latest attempt, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_charge: Option<Expandable>,
    /// Why the last confirmation failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_payment_error: Option<LastPaymentError>,
    /// The payment method it was confirmed with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<Expandable>,
}

/// Stripe writes an absent map as `null` in places; both mean "no metadata".
fn null_as_empty<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<BTreeMap<String, String>, D::Error> {
    Ok(Option::deserialize(deserializer)?.unwrap_or_default())
}

/// Where an intent stands, as a payment's evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The intent is final: a succeeded or a failed charge (boxed: a charge is large, and most
    /// intents a list reads are final).
    Final(Box<Charge>),
    /// The intent may still take money; it proves nothing yet.
    NotFinal(IntentStatus),
}

impl PaymentIntent {
    /// The oncepay payment this intent was made for, read from its metadata.
    pub fn payment_id(&self) -> Option<PaymentId> {
        self.metadata.get(metadata_keys::PAYMENT_ID)?.parse().ok()
    }

    /// Whether this intent is final and, if so, the charge it amounts to, made under
    /// `idempotency_key`.
    ///
    /// `requires_payment_method` is final only with a `last_payment_error`: without one, the intent
    /// may be a confirmation still under way, seen half-made by a lookup.
    pub fn settled(&self, idempotency_key: &str) -> Settled {
        let status = match (&self.status, &self.last_payment_error) {
            (IntentStatus::Succeeded, _) => ChargeStatus::Succeeded,
            (IntentStatus::Canceled, _) | (IntentStatus::RequiresPaymentMethod, Some(_)) => ChargeStatus::Failed,
            (other, _) => return Settled::NotFinal(other.clone()),
        };
        let failure = self.last_payment_error.as_ref().filter(|_| status == ChargeStatus::Failed);
        Settled::Final(Box::new(Charge {
            id: self.id.clone(),
            status,
            // What moved, for a success; what was asked, for a failure (nothing moved).
            amount: match status {
                ChargeStatus::Succeeded => self.amount_received.unwrap_or(self.amount),
                ChargeStatus::Failed => self.amount,
            },
            currency: self.currency.to_ascii_uppercase(),
            customer: self.customer.as_ref().map(|c| c.id().to_owned()).unwrap_or_default(),
            idempotency_key: idempotency_key.to_owned(),
            created: self.created,
            metadata: self.metadata.clone(),
            failure_code: match failure {
                Some(error) => error.best_code().map(str::to_owned),
                None if self.status == IntentStatus::Canceled => Some("canceled".to_owned()),
                None => None,
            },
            failure_message: failure.map(|e| in_our_words(DECLINED, e.code.as_deref(), e.decline_code.as_deref())),
            payment_method: self.payment_method.as_ref().map(|m| m.id().to_owned()),
            account: None,
        }))
    }

    /// The intent as an unfinished charge, held by `account` (`None`: oncepay's own).
    pub fn unfinished(&self, account: Option<&str>) -> UnfinishedCharge {
        let status = serde_json::to_value(&self.status).ok().and_then(|v| v.as_str().map(str::to_owned));
        UnfinishedCharge {
            id: self.id.clone(),
            status: status.unwrap_or_else(|| "unknown".to_owned()),
            amount: self.amount,
            currency: self.currency.to_ascii_uppercase(),
            created: self.created,
            metadata: self.metadata.clone(),
            account: account.map(str::to_owned),
        }
    }

    /// [`Self::settled`] for an intent found by a lookup, whose response carries no idempotency key:
    /// the key is the one oncepay derives from the payment its metadata names. An intent naming no
    /// payment gets an empty key, so settlement treats it as another payment's charge.
    pub fn settled_by_metadata(&self) -> Settled {
        let key = self.payment_id().map(|p| p.downstream_key().as_str().to_owned()).unwrap_or_default();
        self.settled(&key)
    }
}

/// Where a Stripe Refund is in its life, as the Refund object documents `status` (`pending`,
/// `requires_action`, `succeeded`, `failed`, `canceled`). Stripe may add statuses; an unknown one
/// is [`RefundStatus::Other`], which is never final.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    /// Submitted, not finished: it may still succeed or fail.
    Pending,
    /// Waits for the customer (refunds to payment methods without native refunds); not a card's.
    RequiresAction,
    /// The money went back. A card refund may still turn `failed` later (a closed card), which
    /// Stripe reports with an event, not with this response.
    Succeeded,
    /// The refund failed: no money went back, and the amount returned to the merchant's balance.
    Failed,
    /// Cancelled before it moved money.
    Canceled,
    /// A status this code does not know.
    #[serde(other)]
    Other,
}

/// A Stripe Refund: one return of (part of) a PaymentIntent's money, the object oncepay creates
/// for each refund.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeRefund {
    /// `re_…`.
    pub id: String,
    /// Where it is in its life; documented as nullable, and a missing one is never final.
    #[serde(default)]
    pub status: Option<RefundStatus>,
    /// Minor units, in Stripe's unit of the currency.
    pub amount: i64,
    /// Lower case, e.g. `eur`.
    pub currency: String,
    /// Creation time, Unix seconds.
    pub created: i64,
    /// Key/value pairs as sent, oncepay's own keys among them.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub metadata: BTreeMap<String, String>,
    /// The PaymentIntent refunded, if the refunded charge belongs to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_intent: Option<Expandable>,
    /// The charge refunded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<Expandable>,
    /// Why it failed, when it did (`lost_or_stolen_card`, `expired_or_canceled_card`, `unknown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
}

impl StripeRefund {
    /// The oncepay refund this refund was made for, read from its metadata.
    pub fn refund_id(&self) -> Option<RefundId> {
        self.metadata.get(metadata_keys::REFUND_ID)?.parse().ok()
    }

    /// Whether this refund was made for the refund `refund` of the PaymentIntent `payment_intent`:
    /// its metadata names the refund, and it names no other intent.
    pub fn is_for(&self, refund: RefundId, payment_intent: &str) -> bool {
        self.refund_id() == Some(refund) && self.payment_intent.as_ref().is_none_or(|pi| pi.id() == payment_intent)
    }

    /// What it refunds, as oncepay books a payment's charge: its PaymentIntent, else (a refund of a
    /// charge made without one, never oncepay's) the bare charge, else nothing.
    pub fn refunded(&self) -> &str {
        self.payment_intent.as_ref().or(self.charge.as_ref()).map_or("", Expandable::id)
    }

    /// Where it stands, in oncepay's words: what is not final (`pending`, `requires_action`, a
    /// status this code does not know, or none) is pending.
    pub fn state(&self) -> RefundState {
        match self.status {
            Some(RefundStatus::Succeeded) => RefundState::Succeeded,
            Some(RefundStatus::Failed) => RefundState::Failed,
            Some(RefundStatus::Canceled) => RefundState::Canceled,
            Some(RefundStatus::Pending | RefundStatus::RequiresAction | RefundStatus::Other) | None => {
                RefundState::Pending
            }
        }
    }

    /// The refund as oncepay books it: of `charge` (the PaymentIntent oncepay knows the payment by),
    /// held by `account` (`None`: oncepay's own). Stripe's objects carry neither the idempotency key
    /// nor the account.
    pub fn to_refund(&self, charge: &str, account: Option<&str>) -> crate::Refund {
        crate::Refund {
            id: self.id.clone(),
            status: self.state(),
            charge: charge.to_owned(),
            amount: self.amount,
            currency: self.currency.to_ascii_uppercase(),
            idempotency_key: None,
            created: self.created,
            metadata: self.metadata.clone(),
            failure_reason: self.failure_reason.clone().filter(|_| self.state() == RefundState::Failed),
            account: account.map(str::to_owned),
        }
    }
}

/// A Charge, as far as a `charge.refunded` event is read: the PaymentIntent it belongs to and the
/// refunds it lists.
///
/// Since API version 2022-11-15 a Charge no longer carries `refunds` unless it is expanded, so an
/// event rendered in a later version usually lists none; Stripe points receivers to
/// `refund.created` for the refund itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeCharge {
    /// `ch_…`.
    pub id: String,
    /// The PaymentIntent the charge was made by, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_intent: Option<Expandable>,
    /// The refunds of the charge, newest first, when the Charge carries them; the first page only
    /// (`has_more` says whether others exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refunds: Option<ListPage<StripeRefund>>,
}

/// The body of every Stripe error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: StripeError,
}

/// The detail of a Stripe error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeError {
    /// `api_error`, `card_error`, `idempotency_error` or `invalid_request_error`.
    #[serde(rename = "type")]
    pub error_type: String,
    /// Stripe's code, e.g. `card_declined`, `idempotency_key_in_use`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The issuer's reason for a card decline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// For humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The parameter at fault, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// The PaymentIntent the request made or touched, as it is after the error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_intent: Option<Box<PaymentIntent>>,
}

/// The error types Stripe documents.
pub mod error_types {
    /// A card was declined.
    pub const CARD: &str = "card_error";
    /// The idempotency key was used before with other parameters.
    pub const IDEMPOTENCY: &str = "idempotency_error";
    /// The request was refused as invalid.
    pub const INVALID_REQUEST: &str = "invalid_request_error";
}

/// One page of a list call, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListPage<T> {
    /// The objects.
    pub data: Vec<T>,
    /// Whether another page follows (`starting_after` the last object's id).
    pub has_more: bool,
}

/// One page of a search.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchPage<T> {
    /// The objects that matched when the search index was last updated.
    pub data: Vec<T>,
    /// Whether another page follows.
    pub has_more: bool,
    /// The cursor of the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page: Option<String>,
}

/// The event types oncepay acts on.
pub mod event_types {
    /// An intent took the money.
    pub const PAYMENT_INTENT_SUCCEEDED: &str = "payment_intent.succeeded";
    /// A confirmation of an intent failed.
    pub const PAYMENT_INTENT_PAYMENT_FAILED: &str = "payment_intent.payment_failed";
    /// An intent was cancelled.
    pub const PAYMENT_INTENT_CANCELED: &str = "payment_intent.canceled";
    /// A refund was created; its object is the Refund.
    pub const REFUND_CREATED: &str = "refund.created";
    /// A refund changed; its object is the Refund as it is now.
    pub const REFUND_UPDATED: &str = "refund.updated";
    /// A refund failed, possibly after it had succeeded; its object is the failed Refund.
    pub const REFUND_FAILED: &str = "refund.failed";
    /// A refund changed, on some payment methods only (`refund.updated` covers all); its object is
    /// the Refund.
    pub const CHARGE_REFUND_UPDATED: &str = "charge.refund.updated";
    /// A charge was refunded, in full or in part; its object is the Charge, not a Refund.
    pub const CHARGE_REFUNDED: &str = "charge.refunded";
}

/// One webhook delivery's body. Stripe delivers each event at least once and in any order, so
/// receivers deduplicate by [`Event::id`] and judge the object as it is in the event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// `evt_…`: the same on every delivery of one event.
    pub id: String,
    /// E.g. `payment_intent.succeeded`; any other type is someone else's business.
    #[serde(rename = "type")]
    pub event_type: String,
    /// When the event happened, Unix seconds.
    pub created: i64,
    /// The object the event is about.
    pub data: EventData,
    /// The API request that caused the event, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<EventRequest>,
    /// The connected account the event happened in (`acct_…`): set on every event a Connect
    /// endpoint receives, absent for the platform's own account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

/// The API request behind an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRequest {
    /// `req_…`, or null for an event Stripe caused itself.
    #[serde(default)]
    pub id: Option<String>,
    /// The `Idempotency-Key` the request carried: for oncepay's intents, the downstream key.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// The object of an event, kept as JSON until its type says what it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventData {
    /// The object as it was when the event happened.
    pub object: serde_json::Value,
}

impl Event {
    /// The PaymentIntent of a `payment_intent.*` event; `None` for any other event.
    pub fn payment_intent(&self) -> Option<Result<PaymentIntent, serde_json::Error>> {
        self.event_type
            .starts_with("payment_intent.")
            .then(|| serde_json::from_value::<PaymentIntent>(self.data.object.clone()))
    }

    /// The refunds an event reports: the Refund of a refund event (`refund.created`,
    /// `refund.updated`, `refund.failed`, `charge.refund.updated`), or the refunds a
    /// `charge.refunded` event's Charge lists (none when it lists none). A refund listed on a
    /// Charge that names no PaymentIntent refunds the Charge's own. `None` for any other event.
    pub fn refunds(&self) -> Option<Result<Vec<StripeRefund>, serde_json::Error>> {
        use event_types::{CHARGE_REFUND_UPDATED, CHARGE_REFUNDED, REFUND_CREATED, REFUND_FAILED, REFUND_UPDATED};

        let object = || self.data.object.clone();
        match self.event_type.as_str() {
            REFUND_CREATED | REFUND_UPDATED | REFUND_FAILED | CHARGE_REFUND_UPDATED => {
                Some(serde_json::from_value::<StripeRefund>(object()).map(|refund| vec![refund]))
            }
            CHARGE_REFUNDED => Some(serde_json::from_value::<StripeCharge>(object()).map(|charge| {
                let listed = charge.refunds.map(|page| page.data).unwrap_or_default();
                listed
                    .into_iter()
                    .map(|mut refund| {
                        refund.payment_intent = refund.payment_intent.or_else(|| charge.payment_intent.clone());
                        refund
                    })
                    .collect()
            })),
            _ => None,
        }
    }
}

/// Bodies shaped as Stripe documents them, for tests.
#[cfg(test)]
pub(crate) mod samples {
    use serde_json::{Value, json};

    /// A PaymentIntent in `status`, named after `payment_id` in its metadata, as the API returns it
    /// (with a few of the fields oncepay does not read).
    pub(crate) fn intent(id: &str, status: &str, payment_id: &str) -> Value {
        let succeeded = status == "succeeded";
        json!({
            "id": id,
            "object": "payment_intent",
            "amount": 1999,
            "amount_capturable": 0,
            "amount_details": {"tip": {}},
            "amount_received": if succeeded { 1999 } else { 0 },
            "application": null,
            "capture_method": "automatic",
            "client_secret": format!("{id}_secret_abc"),
            "confirmation_method": "automatic",
            "created": 1_763_800_000,
            "currency": "eur",
            "customer": null,
            "description": null,
            "last_payment_error": null,
            "latest_charge": if succeeded { json!("ch_3Mt") } else { Value::Null },
            "livemode": false,
            "metadata": {
                "oncepay_payment_id": payment_id,
                "oncepay_tenant_id": "0196a0c4-0000-7000-8000-000000000001"
            },
            "next_action": null,
            "payment_method": "pm_card_visa",
            "payment_method_types": ["card"],
            "status": status
        })
    }

    /// A declined confirmation: the intent back in `requires_payment_method`, with the reason.
    pub(crate) fn declined_intent(id: &str, payment_id: &str) -> Value {
        let mut intent = intent(id, "requires_payment_method", payment_id);
        intent["last_payment_error"] = json!({
            "type": "card_error",
            "code": "card_declined",
            "decline_code": "insufficient_funds",
            "message": "Your card has insufficient funds.",
            "doc_url": "https://stripe.com/docs/error-codes/card-declined"
        });
        intent
    }

    /// A Refund of `payment_intent` in `status`, made for oncepay's refund `refund_id`, as the API
    /// returns it (shaped after the Refund object's documented example).
    pub(crate) fn refund(id: &str, status: &str, refund_id: &str, payment_intent: &str) -> Value {
        json!({
            "id": id,
            "object": "refund",
            "amount": 500,
            "balance_transaction": "txn_1",
            "charge": "ch_3Mt",
            "created": 1_763_800_100,
            "currency": "eur",
            "destination_details": {"card": {"reference_status": "pending", "type": "refund"}, "type": "card"},
            "failure_reason": if status == "failed" { json!("expired_or_canceled_card") } else { Value::Null },
            "metadata": {
                "order": "A-17",
                "oncepay_payment_id": "0196a0c4-0000-7000-8000-0000000000aa",
                "oncepay_refund_id": refund_id,
                "oncepay_tenant_id": "0196a0c4-0000-7000-8000-000000000001"
            },
            "payment_intent": payment_intent,
            "reason": null,
            "receipt_number": null,
            "source_transfer_reversal": null,
            "status": status,
            "transfer_reversal": null
        })
    }

    /// A Stripe error body.
    pub(crate) fn error(error_type: &str, code: Option<&str>, message: &str) -> Value {
        json!({"error": {
            "type": error_type,
            "code": code,
            "message": message,
            "doc_url": code.map(|c| format!("https://stripe.com/docs/error-codes/{c}")),
            "request_log_url": "https://dashboard.stripe.com/test/logs/req_1"
        }})
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::samples::*;
    use super::*;

    const PAYMENT: &str = "0196a0c4-0000-7000-8000-0000000000aa";

    #[test]
    fn a_documented_intent_is_read_whatever_else_it_carries() {
        let mut body = intent("pi_1", "succeeded", PAYMENT);
        body["a_field_stripe_added_later"] = json!({"nested": [1, 2]});

        let intent: PaymentIntent = serde_json::from_value(body).unwrap();

        assert_eq!(intent.status, IntentStatus::Succeeded);
        assert_eq!(intent.amount_received, Some(1999));
        assert_eq!(intent.latest_charge.as_ref().map(Expandable::id), Some("ch_3Mt"));
        assert_eq!(intent.payment_id(), Some(PAYMENT.parse().unwrap()));
    }

    #[test]
    fn an_unknown_status_is_read_and_is_never_final() {
        let intent: PaymentIntent = serde_json::from_value(intent("pi_1", "requires_a_new_thing", PAYMENT)).unwrap();

        assert_eq!(intent.status, IntentStatus::Other);
        assert_eq!(intent.settled("k"), Settled::NotFinal(IntentStatus::Other));
    }

    #[test]
    fn each_status_settles_as_stripe_documents_it() {
        let cases = [
            ("succeeded", false, Some(ChargeStatus::Succeeded)),
            ("canceled", false, Some(ChargeStatus::Failed)),
            ("requires_payment_method", true, Some(ChargeStatus::Failed)),
            // Not confirmed yet, or a confirmation still under way: proves nothing.
            ("requires_payment_method", false, None),
            ("processing", false, None),
            ("requires_action", false, None),
            ("requires_confirmation", false, None),
            ("requires_capture", false, None),
        ];
        for (status, failed_before, expected) in cases {
            let body = if failed_before { declined_intent("pi_1", PAYMENT) } else { intent("pi_1", status, PAYMENT) };
            let intent: PaymentIntent = serde_json::from_value(body).unwrap();

            let settled = match intent.settled("oncepay-k") {
                Settled::Final(charge) => Some(charge.status),
                Settled::NotFinal(_) => None,
            };

            assert_eq!(settled, expected, "{status}, failed before: {failed_before}");
        }
    }

    #[test]
    fn a_succeeded_intent_becomes_the_charge_oncepay_books() {
        let intent: PaymentIntent = serde_json::from_value(intent("pi_1", "succeeded", PAYMENT)).unwrap();

        let Settled::Final(charge) = intent.settled_by_metadata() else { panic!("not final") };

        assert_eq!(charge.id, "pi_1");
        assert_eq!(charge.amount, 1999);
        assert_eq!(charge.currency, "EUR");
        assert_eq!(charge.created, 1_763_800_000);
        let payment: PaymentId = PAYMENT.parse().unwrap();
        assert_eq!(charge.idempotency_key, payment.downstream_key().as_str());
        assert_eq!(charge.failure_code, None);
    }

    #[test]
    fn a_declined_intent_keeps_the_issuers_reason() {
        let intent: PaymentIntent = serde_json::from_value(declined_intent("pi_1", PAYMENT)).unwrap();

        let Settled::Final(charge) = intent.settled("k") else { panic!("not final") };

        assert_eq!(charge.status, ChargeStatus::Failed);
        assert_eq!(charge.failure_code.as_deref(), Some("insufficient_funds"));
        assert_eq!(
            charge.failure_message.as_deref(),
            Some("Stripe declined the payment (code card_declined, decline code insufficient_funds)."),
            "Stripe's codes in oncepay's words"
        );
    }

    #[test]
    fn an_intent_naming_no_payment_gets_no_key() {
        let mut body = intent("pi_1", "succeeded", PAYMENT);
        body["metadata"] = serde_json::Value::Null;
        let intent: PaymentIntent = serde_json::from_value(body).unwrap();

        let Settled::Final(charge) = intent.settled_by_metadata() else { panic!("not final") };

        assert_eq!(charge.idempotency_key, "");
    }

    const REFUND: &str = "0196a0c4-0000-7000-8000-0000000000cc";

    #[test]
    fn each_refund_status_maps_to_where_oncepay_says_it_stands() {
        let cases = [
            (json!("succeeded"), RefundState::Succeeded),
            (json!("failed"), RefundState::Failed),
            (json!("canceled"), RefundState::Canceled),
            (json!("pending"), RefundState::Pending),
            (json!("requires_action"), RefundState::Pending),
            (json!("a_status_from_the_future"), RefundState::Pending),
            (Value::Null, RefundState::Pending),
        ];
        for (status, expected) in cases {
            let mut body = refund("re_1", "succeeded", REFUND, "pi_1");
            body["status"] = status.clone();
            let refund: StripeRefund = serde_json::from_value(body).unwrap();

            assert_eq!(refund.state(), expected, "{status}");
        }
    }

    #[test]
    fn a_documented_refund_becomes_the_refund_oncepay_books_of_its_payment_intent() {
        let body = refund("re_1", "failed", REFUND, "pi_1");
        let refund: StripeRefund = serde_json::from_value(body).unwrap();

        let booked = refund.to_refund("pi_1", Some("acct_A"));

        assert_eq!((booked.id.as_str(), booked.status), ("re_1", RefundState::Failed));
        assert_eq!((booked.charge.as_str(), booked.amount, booked.currency.as_str()), ("pi_1", 500, "EUR"));
        assert_eq!((booked.created, booked.idempotency_key.as_deref()), (1_763_800_100, None));
        assert_eq!(booked.failure_reason.as_deref(), Some("expired_or_canceled_card"));
        assert_eq!(booked.account.as_deref(), Some("acct_A"));
        assert_eq!(booked.metadata.get("order").map(String::as_str), Some("A-17"));
        assert_eq!(booked.refund_ref().map(|(_, refund)| refund), Some(REFUND.parse().unwrap()));
    }

    #[test]
    fn a_refund_refunds_its_payment_intent_else_its_bare_charge() {
        let refunding = |payment_intent: Value, charge: Value| {
            let mut body = refund("re_1", "succeeded", REFUND, "pi_1");
            body["payment_intent"] = payment_intent;
            body["charge"] = charge;
            serde_json::from_value::<StripeRefund>(body).unwrap().refunded().to_owned()
        };

        assert_eq!(refunding(json!("pi_1"), json!("ch_1")), "pi_1");
        assert_eq!(refunding(json!({"id": "pi_1", "object": "payment_intent"}), json!("ch_1")), "pi_1");
        assert_eq!(refunding(Value::Null, json!("ch_1")), "ch_1");
        assert_eq!(refunding(Value::Null, Value::Null), "");
    }

    #[test]
    fn a_refund_is_for_the_refund_its_metadata_names_of_the_intent_it_names() {
        const OTHER: &str = "0196a0c4-0000-7000-8000-0000000000dd";
        let refund_of = |refund_id: &str, payment_intent: Value| {
            let mut body = refund("re_1", "succeeded", refund_id, "pi_1");
            body["payment_intent"] = payment_intent;
            serde_json::from_value::<StripeRefund>(body).unwrap()
        };
        let ours: RefundId = REFUND.parse().unwrap();
        let cases = [
            ("ours", refund_of(REFUND, json!("pi_1")), true),
            ("ours, intent expanded", refund_of(REFUND, json!({"id": "pi_1", "object": "payment_intent"})), true),
            // A refund made by charge id names no intent (localstripe's, for one).
            ("ours, no intent", refund_of(REFUND, Value::Null), true),
            ("another refund", refund_of(OTHER, json!("pi_1")), false),
            ("another intent", refund_of(REFUND, json!("pi_2")), false),
            ("no refund named", refund_of("not-a-uuid", json!("pi_1")), false),
        ];
        for (name, refund, expected) in cases {
            assert_eq!(refund.is_for(ours, "pi_1"), expected, "{name}");
        }
    }

    #[test]
    fn an_event_yields_its_payment_intent_and_other_events_yield_nothing() {
        let event: Event = serde_json::from_value(json!({
            "id": "evt_1", "object": "event", "api_version": "2024-06-20", "created": 1_763_800_001,
            "type": "payment_intent.succeeded", "livemode": false, "pending_webhooks": 1,
            "request": {"id": "req_1", "idempotency_key": "oncepay-x"},
            "data": {"object": intent("pi_1", "succeeded", PAYMENT)}
        }))
        .unwrap();
        let other = Event { event_type: "customer.created".into(), ..event.clone() };

        assert_eq!(event.payment_intent().map(|r| r.map(|i| i.id)).transpose().unwrap(), Some("pi_1".to_owned()));
        assert!(other.payment_intent().is_none());
        assert_eq!(event.request.and_then(|r| r.idempotency_key).as_deref(), Some("oncepay-x"));
    }
}
