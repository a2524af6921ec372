//! Money: an amount in integer minor units and an ISO 4217 currency. Never a float.
//!
//! Both types can only be built through their parsers, so a value of either type is valid by
//! construction. The database repeats the rules as CHECK constraints. [`format_amount`] writes an
//! amount as people read it, the one way the console and the operator CLI print money.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A positive amount in the currency's minor units (cents for EUR, yen for JPY).
///
/// Read from PostgreSQL without re-checking the range: the `payments.amount` CHECK constraint
/// already guarantees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(transparent))]
pub struct Amount(i64);

/// Why a number is not an [`Amount`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be an integer number of minor units between {} and {}", Amount::MIN, Amount::MAX)]
pub struct AmountError;

impl Amount {
    /// The smallest amount oncepay will charge.
    pub const MIN: i64 = 1;
    /// The largest amount oncepay will charge: 10^12 minor units.
    pub const MAX: i64 = 1_000_000_000_000;

    /// Checks the range.
    pub fn new(minor_units: i64) -> Result<Self, AmountError> {
        if (Self::MIN..=Self::MAX).contains(&minor_units) { Ok(Self(minor_units)) } else { Err(AmountError) }
    }

    /// The amount in minor units.
    pub const fn minor_units(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Read from a JSON number; one out of range is refused by its name and value, as a currency is.
impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let minor_units = i64::deserialize(deserializer)?;
        Self::new(minor_units).map_err(|e| serde::de::Error::custom(format!("amount {minor_units} {e}")))
    }
}

/// An active ISO 4217 currency code, e.g. `EUR`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Currency([u8; 3]);

/// Why a string is not a [`Currency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CurrencyError {
    /// Not three upper-case ASCII letters.
    #[error("must be three upper-case letters (ISO 4217), e.g. \"EUR\"")]
    Malformed,
    /// Three letters, but not an active ISO 4217 code.
    #[error("is not an active ISO 4217 currency code")]
    Unknown,
}

/// Active ISO 4217 codes (list one, 2025 amendments), sorted for binary search. Fund and precious
/// metal codes (XAU, XDR ...) and the testing codes (XTS, XXX) are left out: nobody charges in them.
const ISO_4217: &[&str] = &[
    "AED", "AFN", "ALL", "AMD", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT", "BGN", "BHD", "BIF", "BMD",
    "BND", "BOB", "BOV", "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD", "CDF", "CHE", "CHF", "CHW", "CLF", "CLP",
    "CNY", "COP", "COU", "CRC", "CUP", "CVE", "CZK", "DJF", "DKK", "DOP", "DZD", "EGP", "ERN", "ETB", "EUR", "FJD",
    "FKP", "GBP", "GEL", "GHS", "GIP", "GMD", "GNF", "GTQ", "GYD", "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR",
    "IQD", "IRR", "ISK", "JMD", "JOD", "JPY", "KES", "KGS", "KHR", "KMF", "KPW", "KRW", "KWD", "KYD", "KZT", "LAK",
    "LBP", "LKR", "LRD", "LSL", "LYD", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR", "MVR", "MWK",
    "MXN", "MXV", "MYR", "MZN", "NAD", "NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB", "PEN", "PGK", "PHP", "PKR",
    "PLN", "PYG", "QAR", "RON", "RSD", "RUB", "RWF", "SAR", "SBD", "SCR", "SDG", "SEK", "SGD", "SHP", "SLE", "SOS",
    "SRD", "SSP", "STN", "SVC", "SYP", "SZL", "THB", "TJS", "TMT", "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH",
    "UGX", "USD", "USN", "UYI", "UYU", "UYW", "UZS", "VED", "VES", "VND", "VUV", "WST", "XAF", "XCD", "XCG", "XOF",
    "XPF", "YER", "ZAR", "ZMW", "ZWG",
];

/// The active ISO 4217 codes whose minor unit is not a hundredth, with their number of decimal
/// places (list one, 2025 amendments), sorted for binary search. Every other code has two.
const EXPONENTS: &[(&str, u32)] = &[
    ("BHD", 3),
    ("BIF", 0),
    ("CLF", 4),
    ("CLP", 0),
    ("DJF", 0),
    ("GNF", 0),
    ("IQD", 3),
    ("ISK", 0),
    ("JOD", 3),
    ("JPY", 0),
    ("KMF", 0),
    ("KRW", 0),
    ("KWD", 3),
    ("LYD", 3),
    ("OMR", 3),
    ("PYG", 0),
    ("RWF", 0),
    ("TND", 3),
    ("UGX", 0),
    ("UYI", 0),
    ("UYW", 4),
    ("VND", 0),
    ("VUV", 0),
    ("XAF", 0),
    ("XOF", 0),
    ("XPF", 0),
];

/// An amount in minor units as people read it: `1999` `EUR` is "19.99 EUR", `1999` `JPY` is
/// "1999 JPY", `1999` `BHD` is "1.999 BHD", by each currency's ISO 4217 exponent. Never "1999 EUR",
/// which reads as a hundred times the money. Negative amounts (a difference) keep their sign. A code
/// that is not an active currency, which no stored payment has, is shown in minor units and says so.
pub fn format_amount(minor_units: i64, currency: &str) -> String {
    let Ok(parsed) = Currency::parse(currency) else {
        return format!("{minor_units} minor units of {currency:?}");
    };
    let sign = if minor_units < 0 { "-" } else { "" };
    let units = minor_units.unsigned_abs();
    let exponent = parsed.exponent();
    if exponent == 0 {
        return format!("{sign}{units} {currency}");
    }
    let scale = 10_u64.pow(exponent);
    let (whole, fraction) = (units / scale, units % scale);
    format!("{sign}{whole}.{fraction:0width$} {currency}", width = exponent as usize)
}

impl Currency {
    /// How many decimal places its minor unit has (ISO 4217): 2 for EUR, 0 for JPY, 3 for BHD.
    pub fn exponent(&self) -> u32 {
        EXPONENTS.binary_search_by(|(code, _)| (*code).cmp(self.as_str())).map_or(2, |at| EXPONENTS[at].1)
    }

    /// Parses a currency code: exactly three upper-case letters that name an active currency.
    pub fn parse(code: &str) -> Result<Self, CurrencyError> {
        let bytes: [u8; 3] = code.as_bytes().try_into().map_err(|_| CurrencyError::Malformed)?;
        if !bytes.iter().all(u8::is_ascii_uppercase) {
            return Err(CurrencyError::Malformed);
        }
        if ISO_4217.binary_search(&code).is_err() {
            return Err(CurrencyError::Unknown);
        }
        Ok(Self(bytes))
    }

    /// Every code [`Currency::parse`] accepts, sorted (e.g. for an API schema's `enum`).
    pub fn codes() -> &'static [&'static str] {
        ISO_4217
    }

    /// The code, e.g. `"EUR"`.
    pub fn as_str(&self) -> &str {
        // The bytes were checked to be ASCII upper-case letters when the value was built.
        std::str::from_utf8(&self.0).unwrap_or("???")
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Currency({})", self.as_str())
    }
}

impl Serialize for Currency {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Currency {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let code = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&code).map_err(|e| serde::de::Error::custom(format!("currency {code:?} {e}")))
    }
}

/// The column is text; decoding re-checks the code, as the CHECK constraint does.
#[cfg(feature = "sqlx")]
mod column {
    use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
    use sqlx::{Decode, Encode, Postgres, Type};

    use super::Currency;

    impl Type<Postgres> for Currency {
        fn type_info() -> PgTypeInfo {
            <&str as Type<Postgres>>::type_info()
        }

        fn compatible(ty: &PgTypeInfo) -> bool {
            <&str as Type<Postgres>>::compatible(ty)
        }
    }

    impl Encode<'_, Postgres> for Currency {
        fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
            <&str as Encode<Postgres>>::encode(self.as_str(), buf)
        }
    }

    impl<'r> Decode<'r, Postgres> for Currency {
        fn decode(value: PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
            let code = <&str as Decode<Postgres>>::decode(value)?;
            Ok(Self::parse(code)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_reads_back_from_json_only_when_valid() {
        let amount: Amount = serde_json::from_str("1999").unwrap();
        let currency: Currency = serde_json::from_str(r#""EUR""#).unwrap();
        assert_eq!((amount.minor_units(), currency.as_str()), (1999, "EUR"));
        assert_eq!(serde_json::to_string(&amount).unwrap(), "1999");
        let zero = serde_json::from_str::<Amount>("0").unwrap_err().to_string();
        assert!(zero.starts_with("amount 0 must be an integer number of minor units between 1 and"), "{zero}");
        assert!(serde_json::from_str::<Currency>(r#""EURO""#).is_err());
        assert!(serde_json::from_str::<Currency>(r#""XYZ""#).is_err());
    }

    #[test]
    fn the_currency_list_is_sorted_so_binary_search_works() {
        let mut sorted = ISO_4217.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, ISO_4217);
    }

    #[test]
    fn the_exponent_list_is_sorted_and_names_only_listed_currencies() {
        let codes: Vec<&str> = EXPONENTS.iter().map(|(code, _)| *code).collect();
        let mut sorted = codes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, codes);
        assert!(codes.iter().all(|code| Currency::parse(code).is_ok()), "{codes:?}");
    }

    #[test]
    fn amounts_are_written_by_the_currencys_exponent() {
        let cases = [
            (1999, "EUR", "19.99 EUR"),
            (1999, "JPY", "1999 JPY"),
            (1999, "BHD", "1.999 BHD"),
            (12_345, "CLF", "1.2345 CLF"),
            (5, "EUR", "0.05 EUR"),
            (100, "USD", "1.00 USD"),
            (-250, "EUR", "-2.50 EUR"),
            (Amount::MAX, "EUR", "10000000000.00 EUR"),
            (i64::MIN, "EUR", "-92233720368547758.08 EUR"),
            (1999, "XYZ", "1999 minor units of \"XYZ\""),
        ];
        for (minor_units, currency, written) in cases {
            assert_eq!(format_amount(minor_units, currency), written, "{minor_units} {currency}");
        }
    }

    #[test]
    fn every_listed_code_parses() {
        for code in Currency::codes() {
            assert_eq!(Currency::parse(code).map(|c| c.to_string()), Ok((*code).to_owned()));
        }
    }

    #[test]
    fn currencies_parse_by_the_iso_list() {
        let cases = [
            ("EUR", Ok(())),
            ("JPY", Ok(())),
            ("XCG", Ok(())),
            ("eur", Err(CurrencyError::Malformed)),
            ("EURO", Err(CurrencyError::Malformed)),
            ("EU", Err(CurrencyError::Malformed)),
            ("", Err(CurrencyError::Malformed)),
            ("E1R", Err(CurrencyError::Malformed)),
            ("ÉUR", Err(CurrencyError::Malformed)),
            ("ABC", Err(CurrencyError::Unknown)),
            ("XAU", Err(CurrencyError::Unknown)),
            ("HRK", Err(CurrencyError::Unknown)),
        ];
        for (code, expected) in cases {
            assert_eq!(Currency::parse(code).map(|c| assert_eq!(c.as_str(), code)), expected, "{code:?}");
        }
    }

    #[test]
    fn amounts_are_bounded() {
        let cases = [
            (0, false),
            (-1, false),
            (1, true),
            (1_000_000_000_000, true),
            (1_000_000_000_001, false),
            (i64::MAX, false),
        ];
        for (units, ok) in cases {
            assert_eq!(Amount::new(units).is_ok(), ok, "{units}");
        }
    }
}
