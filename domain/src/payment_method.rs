//! A reference to the customer's payment method at the provider, e.g. Stripe's `pm_card_visa`: what
//! the provider is asked to charge. oncepay never sees card details, only this reference, which it
//! stores and passes on unchanged.
//!
//! A value is 1 to 255 ASCII letters, digits and underscores, valid by construction; the
//! `payments.payment_method` CHECK constraint repeats the rule.

use std::fmt;

use serde::Serialize;

/// A provider's payment-method reference.
///
/// No prefix is required. The API is provider-neutral and each provider spells its references its
/// own way (Stripe's PaymentMethods are `pm_…`, but its PaymentIntents also take older `card_…` and
/// `src_…` ids; other providers use bare tokens), so intake checks only what is safe to store and
/// send to any of them; a reference the provider does not know is the provider's to refuse.
///
/// Read from PostgreSQL without re-checking: the CHECK constraint already guarantees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(transparent))]
#[serde(transparent)]
pub struct PaymentMethod(String);

/// Why a string is not a [`PaymentMethod`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PaymentMethodError {
    /// No characters.
    #[error("must not be empty")]
    Empty,
    /// A character other than an ASCII letter, digit or underscore.
    #[error("must be ASCII letters, digits and underscores, e.g. \"pm_card_visa\"; character {position} is not")]
    Character {
        /// Zero-based position of the first offending character.
        position: usize,
    },
    /// More than [`PaymentMethod::MAX_LEN`] characters.
    #[error("must be at most {max} characters, got {len}", max = PaymentMethod::MAX_LEN)]
    TooLong {
        /// The length seen.
        len: usize,
    },
}

impl PaymentMethod {
    /// The longest reference accepted, in characters.
    pub const MAX_LEN: usize = 255;

    /// The rule as a regular expression, for the OpenAPI document (the CHECK constraint spells the
    /// same rule).
    pub const PATTERN: &'static str = "^[A-Za-z0-9_]{1,255}$";

    /// Parses a reference.
    pub fn parse(text: &str) -> Result<Self, PaymentMethodError> {
        if text.is_empty() {
            return Err(PaymentMethodError::Empty);
        }
        if let Some(position) = text.chars().position(|c| !(c.is_ascii_alphanumeric() || c == '_')) {
            return Err(PaymentMethodError::Character { position });
        }
        // All ASCII from here, so bytes and characters count the same.
        if text.len() > Self::MAX_LEN {
            return Err(PaymentMethodError::TooLong { len: text.len() });
        }
        Ok(Self(text.to_owned()))
    }

    /// The reference, as the client sent it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PaymentMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn provider_references_of_any_shape_parse_as_given() {
        for reference in [
            "pm_card_visa",
            "pm_card_chargeDeclined",
            "pm_1Q0PsIJvEtkwdCNYQ2Bz3kLm",
            "card_1MvoiELkdIwHu7ixOeFGbN9D",
            "src_1",
            "8415695361842651",
            "_",
            &"p".repeat(255),
        ] {
            assert_eq!(PaymentMethod::parse(reference).map(|m| m.as_str().to_owned()), Ok(reference.to_owned()));
        }
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        let long = "p".repeat(256);
        let cases: [(&str, PaymentMethodError); 8] = [
            ("", PaymentMethodError::Empty),
            ("pm card", PaymentMethodError::Character { position: 2 }),
            ("pm-card", PaymentMethodError::Character { position: 2 }),
            (" pm_card", PaymentMethodError::Character { position: 0 }),
            ("pm_card\n", PaymentMethodError::Character { position: 7 }),
            ("pm_cärd", PaymentMethodError::Character { position: 4 }),
            ("pm\0", PaymentMethodError::Character { position: 2 }),
            (&long, PaymentMethodError::TooLong { len: 256 }),
        ];
        for (text, error) in cases {
            assert_eq!(PaymentMethod::parse(text), Err(error), "{text:?}");
        }
    }

    proptest! {
        /// Whatever a client sends, what is accepted is exactly what the CHECK constraint and the
        /// OpenAPI pattern allow, unchanged; what is refused is refused for a reason that holds.
        #[test]
        fn a_reference_is_accepted_exactly_when_the_rule_allows_it(
            text in prop_oneof![
                "[A-Za-z0-9_]{0,300}",
                "[A-Za-z0-9_]{0,20}[^A-Za-z0-9_][A-Za-z0-9_]{0,20}",
                any::<String>(),
            ],
        ) {
            let allowed = (1..=PaymentMethod::MAX_LEN).contains(&text.chars().count())
                && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');

            match PaymentMethod::parse(&text) {
                Ok(method) => {
                    prop_assert!(allowed, "{:?} was accepted", text);
                    prop_assert_eq!(method.as_str(), text.as_str());
                }
                Err(PaymentMethodError::Empty) => prop_assert!(text.is_empty()),
                Err(PaymentMethodError::Character { position }) => {
                    prop_assert!(!allowed);
                    let c = text.chars().nth(position);
                    prop_assert!(c.is_some_and(|c| !(c.is_ascii_alphanumeric() || c == '_')), "{:?}", c);
                }
                Err(PaymentMethodError::TooLong { len }) => {
                    prop_assert!(!allowed);
                    prop_assert!(len > PaymentMethod::MAX_LEN && len == text.chars().count());
                }
            }
        }
    }
}
