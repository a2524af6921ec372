//! What Stripe could never accept, checked before a payment is accepted, so a merchant hears about it
//! at once (a 400 naming the field) instead of through a failed payment later. Pure: no I/O.
//!
//! Only rules Stripe documents as fixed are checked: metadata (50 keys, keys of at most 40 characters
//! and without square brackets, values of at most 500), the eight-digit amount field, three-decimal
//! currencies ending in 0, currencies whose unit at Stripe is not their ISO 4217 minor unit, and the
//! minimum charge when the charge is in the account's settlement currency. A minimum in another
//! currency depends on the exchange rate of the day, so it is left to Stripe.
//!
//! A refund carries metadata under the same rules (with one more key of oncepay's), and a reason
//! only from the three that Stripe's Refunds API accepts.

use std::collections::BTreeMap;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};

use crate::{ChargeRequest, RefundRequest, metadata_keys};

/// The most metadata keys an object may carry.
pub const MAX_METADATA_KEYS: usize = 50;
/// The longest metadata key, in characters.
pub const MAX_KEY_CHARS: usize = 40;
/// The longest metadata value, in characters.
pub const MAX_VALUE_CHARS: usize = 500;

/// The reasons `POST /v1/refunds` accepts; it refuses any other.
pub const REFUND_REASONS: &[&str] = &["duplicate", "fraudulent", "requested_by_customer"];

/// The largest `amount` Stripe's eight-digit field holds.
const MAX_AMOUNT: i64 = 99_999_999;
/// IDR amounts may have twelve digits.
const MAX_AMOUNT_IDR: i64 = 999_999_999_999;

/// Currencies whose unit in Stripe's API is not ISO 4217's minor unit, so an oncepay amount (ISO minor
/// units) would be read as another sum. oncepay sends amounts unchanged and refuses these.
/// ISK: ISO has no minor unit; Stripe counts hundredths. MGA: ISO counts hundredths; Stripe none.
const UNIT_DIFFERS: &[&str] = &["ISK", "MGA"];

/// Three-decimal currencies: Stripe requires the last digit of the amount to be 0.
const THREE_DECIMAL: &[&str] = &["BHD", "JOD", "KWD", "OMR", "TND"];

/// Stripe's minimum charge per settlement currency, in minor units.
const MINIMUMS: &[(&str, i64)] = &[
    ("AED", 200),
    ("AUD", 50),
    ("BGN", 100),
    ("BRL", 50),
    ("CAD", 50),
    ("CHF", 50),
    ("CZK", 1_500),
    ("DKK", 250),
    ("EUR", 50),
    ("GBP", 30),
    ("HKD", 400),
    ("HUF", 17_500),
    ("INR", 50),
    ("JPY", 50),
    ("MXN", 1_000),
    ("MYR", 200),
    ("NOK", 300),
    ("NZD", 50),
    ("PLN", 200),
    ("RON", 200),
    ("SEK", 300),
    ("SGD", 50),
    ("THB", 1_000),
    ("USD", 50),
];

/// Why Stripe would refuse a payment; [`LimitError::field`] names the request field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// More metadata keys than Stripe stores, counting the ones oncepay adds.
    #[error("has {count} keys with the {ours} oncepay adds; Stripe stores at most {MAX_METADATA_KEYS}")]
    TooManyMetadataKeys {
        /// Keys that would be sent.
        count: usize,
        /// How many of them are oncepay's.
        ours: usize,
    },
    /// A key longer than Stripe allows.
    #[error("key {key:?} is longer than {MAX_KEY_CHARS} characters")]
    KeyTooLong {
        /// The key.
        key: String,
    },
    /// A key with a square bracket, which Stripe refuses in keys.
    #[error("key {key:?} contains a square bracket, which Stripe refuses in metadata keys")]
    KeyHasBracket {
        /// The key.
        key: String,
    },
    /// A value longer than Stripe allows.
    #[error("the value of {key:?} is longer than {MAX_VALUE_CHARS} characters")]
    ValueTooLong {
        /// The key of the value.
        key: String,
    },
    /// Below Stripe's minimum charge in the account's settlement currency.
    #[error("is below Stripe's minimum charge of {minimum} minor units of {currency}")]
    BelowMinimum {
        /// The minimum, in minor units.
        minimum: i64,
        /// The currency.
        currency: Currency,
    },
    /// More digits than Stripe's amount field holds.
    #[error("is more than Stripe accepts in {currency} ({maximum} minor units)")]
    AboveMaximum {
        /// The maximum, in minor units.
        maximum: i64,
        /// The currency.
        currency: Currency,
    },
    /// A three-decimal amount whose last digit is not 0.
    #[error("must end in 0: Stripe charges {currency} in steps of ten thousandths")]
    NotRoundToTen {
        /// The currency.
        currency: Currency,
    },
    /// A currency Stripe counts in another unit than ISO 4217.
    #[error(
        "{currency} is counted in another unit at Stripe than in ISO 4217, so oncepay cannot charge it through Stripe"
    )]
    UnitDiffers {
        /// The currency.
        currency: Currency,
    },
    /// A refund reason Stripe does not accept.
    #[error("must be one of duplicate, fraudulent or requested_by_customer, the reasons Stripe accepts")]
    UnknownReason,
}

impl LimitError {
    /// The request field at fault, for a problem response: `metadata`, `amount` or `currency`.
    pub const fn field(&self) -> &'static str {
        match self {
            Self::TooManyMetadataKeys { .. }
            | Self::KeyTooLong { .. }
            | Self::KeyHasBracket { .. }
            | Self::ValueTooLong { .. } => "metadata",
            Self::BelowMinimum { .. } | Self::AboveMaximum { .. } | Self::NotRoundToTen { .. } => "amount",
            Self::UnitDiffers { .. } => "currency",
            Self::UnknownReason => "reason",
        }
    }
}

/// Checks a payment as intake sees it, before it has an id: the merchant's metadata is checked
/// together with the keys oncepay will add. `settlement` is the account's settlement currency, if
/// configured.
pub fn check_payment(
    amount: Amount,
    currency: Currency,
    merchant_metadata: &BTreeMap<String, String>,
    settlement: Option<Currency>,
) -> Result<(), LimitError> {
    // Stand-in ids: oncepay's keys, and the length of their values, are the same for every id.
    let request = ChargeRequest::for_payment(
        TenantId::generate(),
        PaymentId::generate(),
        amount,
        currency,
        String::new(),
        merchant_metadata,
    );
    check_request(&request, settlement)
}

/// Checks a charge request as the Stripe adapter would send it.
pub fn check_request(request: &ChargeRequest, settlement: Option<Currency>) -> Result<(), LimitError> {
    check_currency(request.amount, request.currency, settlement)?;
    check_metadata(&request.metadata)
}

/// Checks a refund as intake sees it, before it has an id: the merchant's metadata is checked
/// together with the keys oncepay will add, and the reason, if given. The amount and currency are
/// not checked: they are within the payment's, which passed, and Stripe sets no minimum refund.
pub fn check_refund(merchant_metadata: &BTreeMap<String, String>, reason: Option<&str>) -> Result<(), LimitError> {
    check_reason(reason)?;
    // Stand-in ids, as for a payment: oncepay's keys, and the length of their values, are the same
    // for every id.
    check_metadata(&RefundRequest::metadata(
        TenantId::generate(),
        PaymentId::generate(),
        RefundId::generate(),
        merchant_metadata,
    ))
}

/// Checks a refund request as the Stripe adapter would send it.
pub fn check_refund_request(request: &RefundRequest) -> Result<(), LimitError> {
    check_reason(request.reason.as_deref())?;
    check_metadata(&request.metadata)
}

fn check_reason(reason: Option<&str>) -> Result<(), LimitError> {
    match reason {
        Some(reason) if !REFUND_REASONS.contains(&reason) => Err(LimitError::UnknownReason),
        _ => Ok(()),
    }
}

fn check_currency(amount: Amount, currency: Currency, settlement: Option<Currency>) -> Result<(), LimitError> {
    let code = currency.as_str();
    if UNIT_DIFFERS.contains(&code) {
        return Err(LimitError::UnitDiffers { currency });
    }
    let maximum = if code == "IDR" { MAX_AMOUNT_IDR } else { MAX_AMOUNT };
    if amount.minor_units() > maximum {
        return Err(LimitError::AboveMaximum { maximum, currency });
    }
    if THREE_DECIMAL.contains(&code) && amount.minor_units() % 10 != 0 {
        return Err(LimitError::NotRoundToTen { currency });
    }
    if settlement == Some(currency)
        && let Some(&(_, minimum)) = MINIMUMS.iter().find(|(c, _)| *c == code)
        && amount.minor_units() < minimum
    {
        return Err(LimitError::BelowMinimum { minimum, currency });
    }
    Ok(())
}

fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), LimitError> {
    if metadata.len() > MAX_METADATA_KEYS {
        let ours = [metadata_keys::TENANT_ID, metadata_keys::PAYMENT_ID, metadata_keys::REFUND_ID]
            .iter()
            .filter(|k| metadata.contains_key(**k))
            .count();
        return Err(LimitError::TooManyMetadataKeys { count: metadata.len(), ours });
    }
    for (key, value) in metadata {
        if key.chars().count() > MAX_KEY_CHARS {
            return Err(LimitError::KeyTooLong { key: key.clone() });
        }
        if key.contains(['[', ']']) {
            return Err(LimitError::KeyHasBracket { key: key.clone() });
        }
        if value.chars().count() > MAX_VALUE_CHARS {
            return Err(LimitError::ValueTooLong { key: key.clone() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn money(amount: i64, currency: &str) -> (Amount, Currency) {
        (Amount::new(amount).unwrap(), Currency::parse(currency).unwrap())
    }

    fn merchant(count: usize) -> BTreeMap<String, String> {
        (0..count).map(|i| (format!("k{i}"), "v".to_owned())).collect()
    }

    fn check(amount: i64, currency: &str, metadata: &BTreeMap<String, String>, settlement: Option<&str>) -> String {
        let (amount, currency) = money(amount, currency);
        let settlement = settlement.map(|s| Currency::parse(s).unwrap());
        match check_payment(amount, currency, metadata, settlement) {
            Ok(()) => "ok".to_owned(),
            Err(error) => format!("{}: {error}", error.field()),
        }
    }

    #[test]
    fn each_rule_names_its_field() {
        let none = BTreeMap::new();
        let long_key: BTreeMap<String, String> = [("k".repeat(41), "v".to_owned())].into();
        let longest_key: BTreeMap<String, String> = [("k".repeat(40), "v".to_owned())].into();
        let bracket: BTreeMap<String, String> = [("items[0]".to_owned(), "v".to_owned())].into();
        let long_value: BTreeMap<String, String> = [("k".to_owned(), "é".repeat(501))].into();
        let longest_value: BTreeMap<String, String> = [("k".to_owned(), "é".repeat(500))].into();
        // Name, amount, currency, metadata, settlement currency, expected.
        type Case<'a> = (&'a str, i64, &'a str, &'a BTreeMap<String, String>, Option<&'a str>, &'a str);
        let cases: Vec<Case<'_>> = vec![
            ("plain", 1999, "EUR", &none, Some("EUR"), "ok"),
            ("at the minimum", 50, "EUR", &none, Some("EUR"), "ok"),
            (
                "below the minimum",
                49,
                "EUR",
                &none,
                Some("EUR"),
                "amount: is below Stripe's minimum charge of 50 minor units of EUR",
            ),
            (
                "GBP minimum",
                29,
                "GBP",
                &none,
                Some("GBP"),
                "amount: is below Stripe's minimum charge of 30 minor units of GBP",
            ),
            (
                "zero-decimal JPY minimum",
                49,
                "JPY",
                &none,
                Some("JPY"),
                "amount: is below Stripe's minimum charge of 50 minor units of JPY",
            ),
            ("zero-decimal JPY", 50, "JPY", &none, Some("JPY"), "ok"),
            ("settled in another currency", 1, "EUR", &none, Some("USD"), "ok"),
            ("no settlement currency known", 1, "EUR", &none, None, "ok"),
            ("eight digits", 99_999_999, "USD", &none, None, "ok"),
            (
                "nine digits",
                100_000_000,
                "USD",
                &none,
                None,
                "amount: is more than Stripe accepts in USD (99999999 minor units)",
            ),
            ("IDR twelve digits", 999_999_999_999, "IDR", &none, None, "ok"),
            ("three-decimal ending in 0", 5_120, "KWD", &none, None, "ok"),
            (
                "three-decimal not ending in 0",
                5_124,
                "KWD",
                &none,
                None,
                "amount: must end in 0: Stripe charges KWD in steps of ten thousandths",
            ),
            (
                "ISK",
                500,
                "ISK",
                &none,
                None,
                "currency: ISK is counted in another unit at Stripe than in ISO 4217, so oncepay cannot charge it through Stripe",
            ),
            (
                "MGA",
                500,
                "MGA",
                &none,
                None,
                "currency: MGA is counted in another unit at Stripe than in ISO 4217, so oncepay cannot charge it through Stripe",
            ),
            ("longest key", 1999, "EUR", &longest_key, None, "ok"),
            (
                "key too long",
                1999,
                "EUR",
                &long_key,
                None,
                "metadata: key \"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\" is longer than 40 characters",
            ),
            (
                "bracket in key",
                1999,
                "EUR",
                &bracket,
                None,
                "metadata: key \"items[0]\" contains a square bracket, which Stripe refuses in metadata keys",
            ),
            ("longest value, in characters not bytes", 1999, "EUR", &longest_value, None, "ok"),
            (
                "value too long",
                1999,
                "EUR",
                &long_value,
                None,
                "metadata: the value of \"k\" is longer than 500 characters",
            ),
        ];
        for (name, amount, currency, metadata, settlement, expected) in cases {
            assert_eq!(check(amount, currency, metadata, settlement), expected, "{name}");
        }
    }

    #[test]
    fn oncepays_own_keys_count_against_stripes_fifty() {
        let most = merchant(MAX_METADATA_KEYS - 2);
        let one_more = merchant(MAX_METADATA_KEYS - 1);

        assert_eq!(check(1999, "EUR", &most, None), "ok");
        assert_eq!(
            check(1999, "EUR", &one_more, None),
            "metadata: has 51 keys with the 2 oncepay adds; Stripe stores at most 50"
        );
    }

    #[test]
    fn a_merchant_key_that_oncepay_overwrites_is_counted_once() {
        let mut metadata = merchant(MAX_METADATA_KEYS - 2);
        metadata.insert(metadata_keys::PAYMENT_ID.to_owned(), "mine".to_owned());

        assert_eq!(check(1999, "EUR", &metadata, None), "ok");
    }

    #[test]
    fn a_built_request_is_checked_as_sent() {
        let (amount, currency) = money(1999, "EUR");
        let request = ChargeRequest::for_payment(
            TenantId::generate(),
            PaymentId::generate(),
            amount,
            currency,
            "cus_1".into(),
            &merchant(MAX_METADATA_KEYS - 1),
        );

        assert!(matches!(check_request(&request, None), Err(LimitError::TooManyMetadataKeys { count: 51, ours: 2 })));
    }

    fn check_a_refund(metadata: &BTreeMap<String, String>, reason: Option<&str>) -> String {
        match check_refund(metadata, reason) {
            Ok(()) => "ok".to_owned(),
            Err(error) => format!("{}: {error}", error.field()),
        }
    }

    #[test]
    fn a_refund_is_checked_for_stripes_reasons_and_its_metadata_with_oncepays_three_keys() {
        let bracket: BTreeMap<String, String> = [("items[0]".to_owned(), "v".to_owned())].into();
        let unknown =
            "reason: must be one of duplicate, fraudulent or requested_by_customer, the reasons Stripe accepts";
        // Name, merchant metadata, reason, expected.
        type Case<'a> = (&'a str, BTreeMap<String, String>, Option<&'a str>, &'a str);
        let cases: Vec<Case<'_>> = vec![
            ("no reason", merchant(0), None, "ok"),
            ("duplicate", merchant(0), Some("duplicate"), "ok"),
            ("fraudulent", merchant(0), Some("fraudulent"), "ok"),
            ("requested by the customer", merchant(0), Some("requested_by_customer"), "ok"),
            ("a reason of Stripe's own making", merchant(0), Some("expired_uncaptured_charge"), unknown),
            ("a reason in other words", merchant(0), Some("Requested_By_Customer"), unknown),
            ("the most merchant keys", merchant(MAX_METADATA_KEYS - 3), None, "ok"),
            (
                "one merchant key too many",
                merchant(MAX_METADATA_KEYS - 2),
                None,
                "metadata: has 51 keys with the 3 oncepay adds; Stripe stores at most 50",
            ),
            (
                "a bracket in a key",
                bracket,
                None,
                "metadata: key \"items[0]\" contains a square bracket, which Stripe refuses in metadata keys",
            ),
        ];
        for (name, metadata, reason, expected) in cases {
            assert_eq!(check_a_refund(&metadata, reason), expected, "{name}");
        }
    }
}
