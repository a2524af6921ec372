//! The provider protocol's JSON, shared by oncepay's client and the simulator so the two cannot
//! drift apart.
//!
//! - `POST /v1/charges` (`Idempotency-Key` header, [`CreateCharge`] body) returns 201 [`Charge`];
//!   402 [`ErrorBody`] for a decline (with the declined charge's id); 409 while the same key is in
//!   flight; 422 when the key was used with other parameters.
//! - `GET /v1/charges/{id}` returns a [`Charge`]; `GET /v1/charges?idempotency_key=K` and
//!   `GET /v1/charges?created_gte=&created_lt=&starting_after=&limit=` return a [`ChargePage`].
//! - `POST /v1/refunds` (`Idempotency-Key` header, [`CreateRefund`] body) returns 201 [`Refund`];
//!   400 [`ErrorBody`] with code `no_such_charge`, `charge_not_refundable` or `amount_too_large`
//!   when the charge is unknown, not succeeded, or would be refunded beyond its amount (no refund is
//!   made); 402 for a failed refund (with the failed refund's id); 409 and 422 as for charges. One
//!   key store serves both: a key first used for a charge is refused (422) for a refund, and the
//!   reverse.
//! - `GET /v1/refunds/{id}` returns a [`Refund`]; `GET /v1/refunds?charge=&idempotency_key=` and
//!   `GET /v1/refunds?created_gte=&created_lt=&starting_after=&limit=` return a [`RefundPage`]
//!   (consistent: an empty page proves that there is none).
//! - Webhooks deliver [`WebhookEvent`]s for charges and [`RefundEvent`]s for refunds, signed as Standard
//!   Webhooks (`oncepay_webhook_signature`); [`ProviderEvent`] reads either.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};

use crate::metadata_keys;

/// The body of `POST /v1/charges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateCharge {
    /// Minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// The customer reference.
    pub customer: String,
    /// Free key/value pairs, echoed on the charge.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The payment method to charge, echoed on the charge. Left out when there is none, so a
    /// request without one reads as it did before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<String>,
}

/// Whether a charge took the money.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    /// The customer was charged.
    Succeeded,
    /// The charge was declined; no money moved.
    Failed,
}

/// A charge as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The provider's id, e.g. `ch_…`.
    pub id: String,
    /// Whether it took the money.
    pub status: ChargeStatus,
    /// Minor units actually charged (or attempted).
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// The customer reference.
    pub customer: String,
    /// The idempotency key it was created under.
    pub idempotency_key: String,
    /// Creation time, Unix seconds.
    pub created: i64,
    /// Echoed metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Decline code, when failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_code: Option<String>,
    /// Decline message, when failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    /// The payment method it charged (or tried to), as requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<String>,
    /// The provider account that holds it (a Stripe connected account); `None` for the account of
    /// oncepay's own credentials. The simulator's protocol has no accounts and never sends one. A
    /// charge settles only a payment charged to the same account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

impl Charge {
    /// The oncepay payment this charge was made for, read from its metadata.
    pub fn payment_ref(&self) -> Option<(TenantId, PaymentId)> {
        let tenant = self.metadata.get(metadata_keys::TENANT_ID)?.parse().ok()?;
        let payment = self.metadata.get(metadata_keys::PAYMENT_ID)?.parse().ok()?;
        Some((tenant, payment))
    }
}

/// A list of charges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargePage {
    /// The charges, oldest first (ties broken by id).
    pub data: Vec<Charge>,
    /// Whether another page follows.
    pub has_more: bool,
    /// Charges the provider has not finished (Stripe's intents still `processing` or waiting for
    /// the customer): no money yet, but they may still take some. The simulator's protocol has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unfinished: Vec<UnfinishedCharge>,
}

/// A charge the provider has not finished: it may still take money, or never will.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnfinishedCharge {
    /// The provider's id, e.g. `pi_…`.
    pub id: String,
    /// Where it stands, in the provider's words (`processing`, `requires_action`).
    pub status: String,
    /// Minor units asked for.
    pub amount: i64,
    /// ISO 4217, as the provider reports it.
    pub currency: String,
    /// Creation time, Unix seconds.
    pub created: i64,
    /// Metadata, oncepay's own keys among them.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The provider account that holds it; `None` for oncepay's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

impl UnfinishedCharge {
    /// The oncepay payment it was made for, read from its metadata.
    pub fn payment_ref(&self) -> (Option<TenantId>, Option<PaymentId>) {
        let tenant = self.metadata.get(metadata_keys::TENANT_ID).and_then(|value| value.parse().ok());
        let payment = self.metadata.get(metadata_keys::PAYMENT_ID).and_then(|value| value.parse().ok());
        (tenant, payment)
    }
}

/// What the provider holds under one charge id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retrieved {
    /// A finished charge: succeeded or failed.
    Final(Charge),
    /// A charge the provider has not finished.
    Unfinished(UnfinishedCharge),
    /// Nothing under that id.
    Missing,
}

/// The body of `POST /v1/refunds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRefund {
    /// The charge to refund.
    pub charge: String,
    /// Minor units to give back.
    pub amount: i64,
    /// Why (`duplicate`, `fraudulent`, `requested_by_customer`), if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Free key/value pairs, echoed on the refund.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// Where a refund stands at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundState {
    /// Taken, not finished: it may still move the money, or fail.
    Pending,
    /// The money went back to the customer.
    Succeeded,
    /// The refund failed; no money moved.
    Failed,
    /// The refund was cancelled before it moved money.
    Canceled,
}

/// A refund as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// The provider's id, e.g. `re_…`.
    pub id: String,
    /// Where it stands.
    pub status: RefundState,
    /// The charge it refunds (the simulator's `ch_…`; for Stripe, the payment intent `pi_…` the
    /// payment was booked under).
    pub charge: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217, as the provider writes it.
    pub currency: String,
    /// The idempotency key it was created under, where the provider reports it (the simulator
    /// does; Stripe does not, and its refunds are matched by metadata instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Creation time, Unix seconds.
    pub created: i64,
    /// Echoed metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// The provider account that holds it; `None` for the account of oncepay's own credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

impl Refund {
    /// The oncepay refund it was made for, read from its metadata.
    pub fn refund_ref(&self) -> Option<(TenantId, RefundId)> {
        let tenant = self.metadata.get(metadata_keys::TENANT_ID)?.parse().ok()?;
        let refund = self.metadata.get(metadata_keys::REFUND_ID)?.parse().ok()?;
        Some((tenant, refund))
    }
}

/// A list of refunds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundPage {
    /// The refunds, oldest first (ties broken by id).
    pub data: Vec<Refund>,
    /// Whether another page follows.
    pub has_more: bool,
}

/// The body of every provider error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The detail of a provider error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A stable code, e.g. `card_declined`, `idempotency_key_in_use`.
    pub code: String,
    /// For humans.
    pub message: String,
    /// For a decline: the id of the (failed) charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<String>,
    /// For a failed refund: the id of the (failed) refund.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refund: Option<String>,
}

/// Webhook event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventType {
    /// A charge took the money.
    #[serde(rename = "charge.succeeded")]
    ChargeSucceeded,
    /// A charge was declined.
    #[serde(rename = "charge.failed")]
    ChargeFailed,
}

impl EventType {
    /// The type as the provider writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ChargeSucceeded => "charge.succeeded",
            Self::ChargeFailed => "charge.failed",
        }
    }
}

/// One webhook delivery's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookEvent {
    /// What happened.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// When it happened, Unix seconds.
    pub created: i64,
    /// The charge it happened to, as it is now.
    pub data: Charge,
}

/// Refund webhook event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RefundEventType {
    /// A refund changed; its `status` says how it stands (the simulator sends it once a refund
    /// succeeded).
    #[serde(rename = "refund.updated")]
    RefundUpdated,
    /// A refund failed: it moved no money.
    #[serde(rename = "refund.failed")]
    RefundFailed,
}

impl RefundEventType {
    /// The type as the provider writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RefundUpdated => "refund.updated",
            Self::RefundFailed => "refund.failed",
        }
    }
}

/// One refund webhook delivery's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundEvent {
    /// What happened.
    #[serde(rename = "type")]
    pub event_type: RefundEventType,
    /// When it happened, Unix seconds.
    pub created: i64,
    /// The refund it happened to, as it is now.
    pub data: Refund,
}

/// Any webhook delivery's body, told apart by its `type`: a `refund.…` type is read as a
/// [`RefundEvent`], any other as a charge's [`WebhookEvent`], so an error says what is wrong with
/// the one kind the body claims to be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ProviderEvent {
    /// `charge.succeeded` or `charge.failed`.
    Charge(WebhookEvent),
    /// `refund.updated` or `refund.failed`.
    Refund(RefundEvent),
}

impl<'de> Deserialize<'de> for ProviderEvent {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;

        let value = serde_json::Value::deserialize(deserializer)?;
        let refund = value.get("type").and_then(serde_json::Value::as_str).is_some_and(|t| t.starts_with("refund."));
        if refund {
            RefundEvent::deserialize(value).map(Self::Refund).map_err(D::Error::custom)
        } else {
            WebhookEvent::deserialize(value).map(Self::Charge).map_err(D::Error::custom)
        }
    }
}

/// Generators of every message of the protocol, with any content a provider could send.
#[cfg(test)]
pub(crate) mod strategies {
    use proptest::prelude::*;

    use super::*;

    fn metadata() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map(any::<String>(), any::<String>(), 0..4)
    }

    pub(crate) fn charge() -> impl Strategy<Value = Charge> {
        (
            (any::<String>(), prop_oneof![Just(ChargeStatus::Succeeded), Just(ChargeStatus::Failed)], any::<i64>()),
            (any::<String>(), any::<String>(), any::<String>(), any::<i64>()),
            (
                metadata(),
                proptest::option::of(any::<String>()),
                proptest::option::of(any::<String>()),
                proptest::option::of(any::<String>()),
                proptest::option::of(any::<String>()),
            ),
        )
            .prop_map(
                |(
                    (id, status, amount),
                    (currency, customer, idempotency_key, created),
                    (metadata, failure_code, failure_message, payment_method, account),
                )| Charge {
                    id,
                    status,
                    amount,
                    currency,
                    customer,
                    idempotency_key,
                    created,
                    metadata,
                    failure_code,
                    failure_message,
                    payment_method,
                    account,
                },
            )
    }

    pub(crate) fn error_body() -> impl Strategy<Value = ErrorBody> {
        (any::<String>(), any::<String>(), proptest::option::of(any::<String>()), proptest::option::of(any::<String>()))
            .prop_map(|(code, message, charge, refund)| ErrorBody {
                error: ErrorDetail { code, message, charge, refund },
            })
    }

    pub(crate) fn refund_state() -> impl Strategy<Value = RefundState> {
        prop_oneof![
            Just(RefundState::Pending),
            Just(RefundState::Succeeded),
            Just(RefundState::Failed),
            Just(RefundState::Canceled),
        ]
    }

    pub(crate) fn refund() -> impl Strategy<Value = Refund> {
        (
            (any::<String>(), refund_state(), any::<String>(), any::<i64>(), any::<String>()),
            (proptest::option::of(any::<String>()), any::<i64>(), metadata()),
            (proptest::option::of(any::<String>()), proptest::option::of(any::<String>())),
        )
            .prop_map(
                |(
                    (id, status, charge, amount, currency),
                    (idempotency_key, created, metadata),
                    (failure_reason, account),
                )| Refund {
                    id,
                    status,
                    charge,
                    amount,
                    currency,
                    idempotency_key,
                    created,
                    metadata,
                    failure_reason,
                    account,
                },
            )
    }

    pub(crate) fn create_refund() -> impl Strategy<Value = CreateRefund> {
        (any::<String>(), any::<i64>(), proptest::option::of(any::<String>()), metadata())
            .prop_map(|(charge, amount, reason, metadata)| CreateRefund { charge, amount, reason, metadata })
    }

    pub(crate) fn refund_event() -> impl Strategy<Value = RefundEvent> {
        (prop_oneof![Just(RefundEventType::RefundUpdated), Just(RefundEventType::RefundFailed)], any::<i64>(), refund())
            .prop_map(|(event_type, created, data)| RefundEvent { event_type, created, data })
    }

    pub(crate) fn create_charge() -> impl Strategy<Value = CreateCharge> {
        (any::<i64>(), any::<String>(), any::<String>(), metadata(), proptest::option::of(any::<String>())).prop_map(
            |(amount, currency, customer, metadata, payment_method)| CreateCharge {
                amount,
                currency,
                customer,
                metadata,
                payment_method,
            },
        )
    }

    pub(crate) fn webhook_event() -> impl Strategy<Value = WebhookEvent> {
        (prop_oneof![Just(EventType::ChargeSucceeded), Just(EventType::ChargeFailed)], any::<i64>(), charge())
            .prop_map(|(event_type, created, data)| WebhookEvent { event_type, created, data })
    }

    /// `body` written as JSON text with one member, of any object in it, written a second time (with
    /// any string as its second value): a body that readers disagree on.
    pub(crate) fn with_a_repeated_member(
        body: impl Strategy<Value = serde_json::Value>,
    ) -> impl Strategy<Value = Vec<u8>> {
        use proptest::sample::Index;

        (body, any::<Index>(), any::<Index>(), any::<String>()).prop_filter_map(
            "a body with an object that has a member",
            |(mut body, object, member, again)| {
                let mut objects = Vec::new();
                pointers_to_objects(&body, String::new(), &mut objects);
                if objects.is_empty() {
                    return None;
                }
                let serde_json::Value::Object(members) = body.pointer_mut(object.get(&objects).as_str())? else {
                    return None;
                };
                let name = member.get(&members.keys().cloned().collect::<Vec<_>>()).clone();
                // A stand-in, replaced by the name in the text.
                let stand_in = "\u{10ffff}\u{10ffff}repeated";
                members.insert(stand_in.to_owned(), serde_json::Value::String(again));
                let text = serde_json::to_string(&body).ok()?;
                let quoted = serde_json::to_string(stand_in).ok()?;
                let name = serde_json::to_string(&name).ok()?;
                (text.matches(&quoted).count() == 1).then(|| text.replacen(&quoted, &name, 1).into_bytes())
            },
        )
    }

    /// The JSON Pointers of every object in `value` that has a member.
    fn pointers_to_objects(value: &serde_json::Value, at: String, found: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(members) if !members.is_empty() => {
                for (name, member) in members {
                    let name = name.replace('~', "~0").replace('/', "~1");
                    pointers_to_objects(member, format!("{at}/{name}"), found);
                }
                found.push(at);
            }
            serde_json::Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    pointers_to_objects(item, format!("{at}/{index}"), found);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde::de::DeserializeOwned;

    use oncepay_domain::money::{Amount, Currency};

    use super::strategies::*;
    use super::*;
    use crate::ChargeRequest;

    fn round_trips<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(message: &T) -> Result<(), String> {
        let text = serde_json::to_vec(message).map_err(|e| e.to_string())?;
        let back: T = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
        if &back == message { Ok(()) } else { Err(format!("{back:?} != {message:?}")) }
    }

    proptest! {
        /// The simulator writes these and oncepay reads them (and the reverse for a charge
        /// request): whatever the contents, what one side writes the other reads back unchanged.
        #[test]
        fn every_message_reads_back_as_written(
            charge in charge(),
            page in (proptest::collection::vec(charge(), 0..4), any::<bool>())
                .prop_map(|(data, has_more)| ChargePage { data, has_more, unfinished: Vec::new() }),
            error in error_body(),
            request in create_charge(),
            event in webhook_event(),
        ) {
            prop_assert_eq!(round_trips(&charge), Ok(()));
            prop_assert_eq!(round_trips(&page), Ok(()));
            prop_assert_eq!(round_trips(&error), Ok(()));
            prop_assert_eq!(round_trips(&request), Ok(()));
            prop_assert_eq!(round_trips(&event), Ok(()));
        }

        /// The same for the refund protocol's messages.
        #[test]
        fn every_refund_message_reads_back_as_written(
            refund in refund(),
            page in (proptest::collection::vec(refund(), 0..4), any::<bool>())
                .prop_map(|(data, has_more)| RefundPage { data, has_more }),
            request in create_refund(),
            event in refund_event(),
        ) {
            prop_assert_eq!(round_trips(&refund), Ok(()));
            prop_assert_eq!(round_trips(&page), Ok(()));
            prop_assert_eq!(round_trips(&request), Ok(()));
            prop_assert_eq!(round_trips(&event), Ok(()));
        }

        /// A receiver that reads any event gets each kind back as the kind it is, never the other.
        #[test]
        fn any_event_reads_as_its_own_kind(charge_event in webhook_event(), refund_event in refund_event()) {
            let charge_text = serde_json::to_vec(&charge_event).unwrap();
            let refund_text = serde_json::to_vec(&refund_event).unwrap();

            prop_assert_eq!(serde_json::from_slice::<ProviderEvent>(&charge_text).ok(), Some(ProviderEvent::Charge(charge_event)));
            prop_assert_eq!(serde_json::from_slice::<ProviderEvent>(&refund_text).ok(), Some(ProviderEvent::Refund(refund_event)));
            prop_assert!(serde_json::from_slice::<WebhookEvent>(&refund_text).is_err(), "a refund event is no charge event");
        }

        /// Whatever the merchant puts in its metadata, oncepay's own keys on the charge name the
        /// payment it was made for: a merchant cannot make a charge settle another tenant's payment.
        #[test]
        fn a_charge_names_its_own_payment_whatever_the_merchant_metadata_says(
            merchant in proptest::collection::btree_map(
                prop_oneof![
                    Just(crate::metadata_keys::TENANT_ID.to_owned()),
                    Just(crate::metadata_keys::PAYMENT_ID.to_owned()),
                    "[a-z_]{1,20}",
                ],
                prop_oneof![Just(TenantId::generate().to_string()), Just(PaymentId::generate().to_string()), any::<String>()],
                0..4,
            ),
            charge in charge(),
        ) {
            let (tenant_id, payment_id) = (TenantId::generate(), PaymentId::generate());
            let amount = Amount::new(100).unwrap();
            let currency = Currency::parse("EUR").unwrap();
            let request = ChargeRequest::for_payment(tenant_id, payment_id, amount, currency, "c".into(), &merchant);

            let made = Charge { metadata: request.metadata, ..charge };

            prop_assert_eq!(made.payment_ref(), Some((tenant_id, payment_id)));
        }

        /// A charge names a payment of ours only through both of oncepay's keys, each a valid id.
        #[test]
        fn a_charge_without_both_ids_names_no_payment(
            mut charge in charge(),
            tenant in proptest::option::of(prop_oneof![Just(TenantId::generate().to_string()), any::<String>()]),
            payment in proptest::option::of(prop_oneof![Just(PaymentId::generate().to_string()), any::<String>()]),
        ) {
            use crate::metadata_keys::{PAYMENT_ID, TENANT_ID};
            charge.metadata.remove(TENANT_ID);
            charge.metadata.remove(PAYMENT_ID);
            if let Some(tenant) = &tenant { charge.metadata.insert(TENANT_ID.into(), tenant.clone()); }
            if let Some(payment) = &payment { charge.metadata.insert(PAYMENT_ID.into(), payment.clone()); }

            let expected = match (tenant.map(|t| t.parse::<TenantId>()), payment.map(|p| p.parse::<PaymentId>())) {
                (Some(Ok(tenant)), Some(Ok(payment))) => Some((tenant, payment)),
                _ => None,
            };
            prop_assert_eq!(charge.payment_ref(), expected);
        }
    }

    #[test]
    fn a_charge_request_names_its_payment_method_only_when_it_has_one() {
        let without = CreateCharge {
            amount: 1,
            currency: "EUR".into(),
            customer: "c".into(),
            metadata: BTreeMap::new(),
            payment_method: None,
        };
        let with = CreateCharge { payment_method: Some("pm_card_visa".into()), ..without.clone() };

        assert_eq!(
            serde_json::to_string(&without).unwrap(),
            r#"{"amount":1,"currency":"EUR","customer":"c","metadata":{}}"#
        );
        assert_eq!(serde_json::to_value(&with).unwrap()["payment_method"], "pm_card_visa");
        let read: CreateCharge = serde_json::from_str(r#"{"amount":1,"currency":"EUR","customer":"c"}"#).unwrap();
        assert_eq!(read, without);
    }

    #[test]
    fn an_error_names_a_refund_only_when_it_has_one() {
        let decline = ErrorDetail { code: "card_declined".into(), message: "No".into(), charge: None, refund: None };
        let failed = ErrorDetail { refund: Some("re_1".into()), ..decline.clone() };

        assert_eq!(serde_json::to_string(&decline).unwrap(), r#"{"code":"card_declined","message":"No"}"#);
        assert_eq!(serde_json::to_value(&failed).unwrap()["refund"], "re_1");
    }

    #[test]
    fn an_event_is_read_as_the_kind_its_type_names_and_nothing_else() {
        let charge = r#"{"id":"ch_1","status":"succeeded","amount":1,"currency":"EUR","customer":"c",
                         "idempotency_key":"k","created":1}"#;
        let refund = r#"{"id":"re_1","status":"succeeded","charge":"ch_1","amount":1,"currency":"EUR","created":1}"#;
        let event = |kind: &str, data: &str| format!(r#"{{"type":"{kind}","created":1,"data":{data}}}"#);
        let read = |text: String| serde_json::from_str::<ProviderEvent>(&text);

        assert!(matches!(read(event("refund.updated", refund)), Ok(ProviderEvent::Refund(_))));
        assert!(matches!(read(event("refund.failed", refund)), Ok(ProviderEvent::Refund(_))));
        assert!(matches!(read(event("charge.succeeded", charge)), Ok(ProviderEvent::Charge(_))));
        let mislabelled = read(event("refund.failed", charge)).unwrap_err().to_string();
        assert!(mislabelled.contains("missing field `charge`"), "the error is the refund's: {mislabelled}");
        assert!(read(event("charge.failed", refund)).is_err());
        assert!(read(event("refund.created", refund)).is_err());
    }

    #[test]
    fn a_refund_request_with_an_unknown_field_is_refused() {
        let body = r#"{"charge":"ch_1","amount":1,"metadata":{},"currency":"EUR"}"#;

        assert!(serde_json::from_str::<CreateRefund>(body).is_err());
    }

    #[test]
    fn a_charge_request_with_an_unknown_field_is_refused() {
        let body = r#"{"amount":1,"currency":"EUR","customer":"c","metadata":{},"capture":false}"#;

        assert!(serde_json::from_str::<CreateCharge>(body).is_err());
    }
}
