//! References to things at the provider that a payment names: the payment method to charge (e.g.
//! Stripe's `pm_card_visa`), the provider's own customer that method belongs to (`cus_…`), and the
//! provider account a tenant is charged through (a Stripe connected account, `acct_…`). oncepay
//! never sees card details, only these references, which it stores and passes on unchanged.
//!
//! Every reference is 1 to 255 ASCII letters, digits and underscores, valid by construction; the
//! CHECK constraints on the columns that hold them repeat the rule.

use std::fmt;

use serde::Serialize;

/// Why a string is not a provider reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// No characters.
    #[error("must not be empty")]
    Empty,
    /// A character other than an ASCII letter, digit or underscore.
    #[error("must be ASCII letters, digits and underscores; character {position} is not")]
    Character {
        /// Zero-based position of the first offending character.
        position: usize,
    },
    /// More than [`MAX_LEN`] characters.
    #[error("must be at most {max} characters, got {len}", max = MAX_LEN)]
    TooLong {
        /// The length seen.
        len: usize,
    },
}

/// The longest reference accepted, in characters.
pub const MAX_LEN: usize = 255;

/// The rule as a regular expression, for the OpenAPI document (the CHECK constraints spell the same
/// rule).
pub const PATTERN: &str = "^[A-Za-z0-9_]{1,255}$";

/// Checks `text` against the rule.
fn check(text: &str) -> Result<(), ReferenceError> {
    if text.is_empty() {
        return Err(ReferenceError::Empty);
    }
    if let Some(position) = text.chars().position(|c| !(c.is_ascii_alphanumeric() || c == '_')) {
        return Err(ReferenceError::Character { position });
    }
    // All ASCII from here, so bytes and characters count the same.
    if text.len() > MAX_LEN {
        return Err(ReferenceError::TooLong { len: text.len() });
    }
    Ok(())
}

/// Declares a reference type: a string that follows the rule, read from PostgreSQL without
/// re-checking (the column's CHECK constraint already guarantees it).
macro_rules! reference {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(transparent))]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Parses a reference.
            pub fn parse(text: &str) -> Result<Self, ReferenceError> {
                check(text).map(|()| Self(text.to_owned()))
            }

            /// The reference, as given.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

reference! {
    /// The payment method the provider is to charge, as the merchant names it.
    ///
    /// No prefix is required. The API is provider-neutral and each provider spells its references
    /// its own way (Stripe's PaymentMethods are `pm_…`, but its PaymentIntents also take older
    /// `card_…` and `src_…` ids; other providers use bare tokens), so intake checks only what is safe
    /// to store and send to any of them; a reference the provider does not know is the provider's to
    /// refuse.
    PaymentMethod
}

reference! {
    /// The provider's own customer whose saved payment method is charged (Stripe's `cus_…`), as the
    /// merchant names it. Never the merchant's `customer_id`, which is the merchant's reference and
    /// is never read as the provider's.
    ProviderCustomer
}

reference! {
    /// The provider account a tenant's payments are charged to: with Stripe Connect, the tenant's
    /// connected account (`acct_…`), sent as `Stripe-Account` on every call made for its payments.
    /// Set by an operator, never by a client.
    ProviderAccount
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
        let cases: [(&str, ReferenceError); 8] = [
            ("", ReferenceError::Empty),
            ("pm card", ReferenceError::Character { position: 2 }),
            ("pm-card", ReferenceError::Character { position: 2 }),
            (" pm_card", ReferenceError::Character { position: 0 }),
            ("pm_card\n", ReferenceError::Character { position: 7 }),
            ("pm_cärd", ReferenceError::Character { position: 4 }),
            ("pm\0", ReferenceError::Character { position: 2 }),
            (&long, ReferenceError::TooLong { len: 256 }),
        ];
        for (text, error) in cases {
            assert_eq!(PaymentMethod::parse(text), Err(error), "{text:?}");
        }
    }

    #[test]
    fn every_kind_of_reference_follows_the_one_rule() {
        for text in ["cus_NffrFeUfNV2Hib", "acct_1032D82eZvKYlo2C", "x"] {
            assert_eq!(ProviderCustomer::parse(text).map(|c| c.to_string()), Ok(text.to_owned()));
            assert_eq!(ProviderAccount::parse(text).map(|a| a.to_string()), Ok(text.to_owned()));
        }
        for text in ["", "acct-1", "cus 1"] {
            assert!(ProviderCustomer::parse(text).is_err(), "{text:?}");
            assert!(ProviderAccount::parse(text).is_err(), "{text:?}");
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
            let allowed = (1..=MAX_LEN).contains(&text.chars().count())
                && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');

            match PaymentMethod::parse(&text) {
                Ok(method) => {
                    prop_assert!(allowed, "{:?} was accepted", text);
                    prop_assert_eq!(method.as_str(), text.as_str());
                }
                Err(ReferenceError::Empty) => prop_assert!(text.is_empty()),
                Err(ReferenceError::Character { position }) => {
                    prop_assert!(!allowed);
                    let c = text.chars().nth(position);
                    prop_assert!(c.is_some_and(|c| !(c.is_ascii_alphanumeric() || c == '_')), "{:?}", c);
                }
                Err(ReferenceError::TooLong { len }) => {
                    prop_assert!(!allowed);
                    prop_assert!(len > MAX_LEN && len == text.chars().count());
                }
            }
        }
    }
}
