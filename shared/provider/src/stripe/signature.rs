//! Stripe webhook signatures: `Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`.
//!
//! The signed text is `"{t}.{body}"`, and the HMAC key is the endpoint secret exactly as written,
//! `whsec_` included, as bytes (not base64-decoded, unlike Standard Webhooks). A header may carry
//! several `v1` entries while a secret is rolled, and other schemes (`v0`) that are ignored.
//! Verification never panics, whatever the header holds, and bounds its work before hashing.

use std::fmt;

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

/// The header's name.
pub const HEADER: &str = "Stripe-Signature";

/// The most comma-separated entries a header may hold: a timestamp, a few `v1` signatures during a
/// secret roll, a `v0` in test mode.
pub const MAX_ENTRIES: usize = 8;

/// Stripe's own tolerance: five minutes either way.
pub const DEFAULT_TOLERANCE_SECS: i64 = 5 * 60;

/// The length of a hex HMAC-SHA256 tag.
const TAG_HEX_LEN: usize = 64;

/// A Stripe webhook endpoint secret, `whsec_…`.
#[derive(Clone)]
pub struct StripeWebhookSecret(SecretSlice<u8>);

impl fmt::Debug for StripeWebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StripeWebhookSecret(..)")
    }
}

/// A secret string that is not `whsec_` followed by at least 16 visible characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a Stripe webhook secret must be `whsec_` followed by at least 16 letters or digits, as the Dashboard shows it"
)]
pub struct BadStripeSecret;

impl StripeWebhookSecret {
    /// Parses the secret as the Dashboard or `stripe listen` shows it.
    pub fn parse(text: &str) -> Result<Self, BadStripeSecret> {
        let rest = text.strip_prefix("whsec_").ok_or(BadStripeSecret)?;
        if rest.len() < 16 || !rest.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(BadStripeSecret);
        }
        // The whole text is the key: Stripe signs with the secret as written.
        Ok(Self(text.as_bytes().to_vec().into()))
    }

    /// Signs a delivery: the whole `Stripe-Signature` value for one secret.
    pub fn sign(&self, timestamp: i64, body: &[u8]) -> String {
        format!("t={timestamp},v1={}", hex::encode(self.mac(timestamp, body).finalize().into_bytes()))
    }

    fn mac(&self, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.0.expose_secret())
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

/// Why a delivery was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The header is absent or empty.
    #[error("the Stripe-Signature header is missing")]
    Missing,
    /// No `t=`, more than one, or not an integer.
    #[error("the Stripe-Signature header has no single Unix timestamp")]
    BadTimestamp,
    /// The timestamp is too far from now, in either direction.
    #[error("the Stripe-Signature timestamp is outside the tolerance")]
    OutsideTolerance,
    /// The header holds more entries than Stripe sends.
    #[error("the Stripe-Signature header holds too many entries")]
    TooManyEntries,
    /// No `v1` signature matches any current secret.
    #[error("no signature matches")]
    NoMatch,
}

/// Verifies a delivery against every current secret; `now` is Unix seconds.
///
/// Passes if any `v1` entry matches any secret (compared in constant time) and the timestamp is within
/// `tolerance_secs` of `now`. A header of more than [`MAX_ENTRIES`] entries is refused before any
/// hashing, and each secret's tag is computed once, whatever the number of candidates.
pub fn verify(
    secrets: &[StripeWebhookSecret],
    header: Option<&str>,
    body: &[u8],
    now: i64,
    tolerance_secs: i64,
) -> Result<(), SignatureError> {
    let header = header.filter(|h| !h.trim().is_empty()).ok_or(SignatureError::Missing)?;
    let entries: Vec<&str> = header.split(',').take(MAX_ENTRIES + 1).collect();
    if entries.len() > MAX_ENTRIES {
        return Err(SignatureError::TooManyEntries);
    }
    let pairs = entries.iter().filter_map(|entry| entry.trim().split_once('='));

    let mut timestamps = pairs.clone().filter(|(name, _)| *name == "t").map(|(_, value)| value);
    let timestamp: i64 = match (timestamps.next(), timestamps.next()) {
        (Some(text), None) => text.parse().map_err(|_| SignatureError::BadTimestamp)?,
        _ => return Err(SignatureError::BadTimestamp),
    };
    // Widened: the timestamp is the sender's, and `now - i64::MIN` overflows an i64.
    if (i128::from(now) - i128::from(timestamp)).abs() > i128::from(tolerance_secs) {
        return Err(SignatureError::OutsideTolerance);
    }

    let candidates: Vec<[u8; 32]> = pairs
        .filter(|(scheme, value)| *scheme == "v1" && value.len() == TAG_HEX_LEN)
        .filter_map(|(_, value)| hex::decode(value).ok()?.try_into().ok())
        .collect();
    if candidates.is_empty() {
        return Err(SignatureError::NoMatch);
    }
    for secret in secrets {
        let expected = secret.mac(timestamp, body).finalize().into_bytes();
        // Every candidate is compared, each in constant time.
        let matched = candidates.iter().fold(Choice::from(0), |found, candidate| found | expected.ct_eq(candidate));
        if bool::from(matched) {
            return Ok(());
        }
    }
    Err(SignatureError::NoMatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_763_800_000;
    const BODY: &[u8] = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;

    fn secret(seed: char) -> StripeWebhookSecret {
        StripeWebhookSecret::parse(&format!("whsec_{}", seed.to_string().repeat(32))).unwrap()
    }

    #[test]
    fn the_key_is_the_secret_as_written_not_its_base64_decoding() {
        // Computed independently: HMAC-SHA256(key = "whsec_test_secret_0123456789", "1700000000.{}").
        let secret = StripeWebhookSecret::parse("whsec_test_secret_0123456789").unwrap();

        let header = secret.sign(1_700_000_000, b"{}");

        assert_eq!(header, format!("t=1700000000,v1={}", expected_tag()));
    }

    /// The tag of the test above, from a second HMAC implementation (RFC 2104 over SHA-256 by hand).
    fn expected_tag() -> String {
        use sha2::Digest;
        let key = b"whsec_test_secret_0123456789";
        let mut block = [0u8; 64];
        block[..key.len()].copy_from_slice(key);
        let inner: Vec<u8> = block.iter().map(|b| b ^ 0x36).chain(b"1700000000.{}".iter().copied()).collect();
        let inner_hash = Sha256::digest(&inner);
        let outer: Vec<u8> = block.iter().map(|b| b ^ 0x5c).chain(inner_hash.iter().copied()).collect();
        hex::encode(Sha256::digest(&outer))
    }

    #[test]
    fn each_kind_of_delivery_gets_the_right_verdict() {
        let current = secret('a');
        let old = secret('b');
        let good = current.sign(NOW, BODY);
        let tag = good.split_once(",v1=").map(|(_, t)| t.to_owned()).unwrap();
        let old_tag = old.sign(NOW, BODY).split_once(",v1=").map(|(_, t)| t.to_owned()).unwrap();
        // Name, the receiver's secrets, the header, the body, the verdict.
        type Case<'a> = (&'a str, Vec<&'a StripeWebhookSecret>, String, &'a [u8], Result<(), SignatureError>);
        let cases: Vec<Case<'_>> = vec![
            ("valid", vec![&current], good.clone(), BODY, Ok(())),
            ("tampered body", vec![&current], good.clone(), b"{}", Err(SignatureError::NoMatch)),
            ("wrong secret", vec![&old], good.clone(), BODY, Err(SignatureError::NoMatch)),
            ("both secrets held", vec![&old, &current], good.clone(), BODY, Ok(())),
            ("signed with both", vec![&current], format!("t={NOW},v1={old_tag},v1={tag}"), BODY, Ok(())),
            ("with a v0 entry", vec![&current], format!("t={NOW},v1={tag},v0={}", "0".repeat(64)), BODY, Ok(())),
            ("v0 only", vec![&current], format!("t={NOW},v0={tag}"), BODY, Err(SignatureError::NoMatch)),
            ("spaces after commas", vec![&current], format!("t={NOW}, v1={tag}"), BODY, Ok(())),
            ("upper-case hex", vec![&current], format!("t={NOW},v1={}", tag.to_uppercase()), BODY, Ok(())),
            ("no timestamp", vec![&current], format!("v1={tag}"), BODY, Err(SignatureError::BadTimestamp)),
            (
                "two timestamps",
                vec![&current],
                format!("t={NOW},t={NOW},v1={tag}"),
                BODY,
                Err(SignatureError::BadTimestamp),
            ),
            ("not a number", vec![&current], format!("t=soon,v1={tag}"), BODY, Err(SignatureError::BadTimestamp)),
            (
                "stale",
                vec![&current],
                current.sign(NOW - DEFAULT_TOLERANCE_SECS - 1, BODY),
                BODY,
                Err(SignatureError::OutsideTolerance),
            ),
            (
                "from the future",
                vec![&current],
                current.sign(NOW + DEFAULT_TOLERANCE_SECS + 1, BODY),
                BODY,
                Err(SignatureError::OutsideTolerance),
            ),
            ("edge of tolerance", vec![&current], current.sign(NOW - DEFAULT_TOLERANCE_SECS, BODY), BODY, Ok(())),
            (
                "the earliest time",
                vec![&current],
                current.sign(i64::MIN, BODY),
                BODY,
                Err(SignatureError::OutsideTolerance),
            ),
            ("truncated tag", vec![&current], good[..good.len() - 2].to_owned(), BODY, Err(SignatureError::NoMatch)),
            ("blank", vec![&current], "  ".to_owned(), BODY, Err(SignatureError::Missing)),
        ];
        for (name, secrets, header, body, expected) in cases {
            let secrets: Vec<StripeWebhookSecret> = secrets.into_iter().cloned().collect();

            assert_eq!(verify(&secrets, Some(&header), body, NOW, DEFAULT_TOLERANCE_SECS), expected, "{name}");
        }
    }

    #[test]
    fn a_missing_header_is_named() {
        assert_eq!(verify(&[secret('a')], None, BODY, NOW, DEFAULT_TOLERANCE_SECS), Err(SignatureError::Missing));
    }

    #[test]
    fn a_header_with_more_entries_than_stripe_sends_is_refused_even_with_a_good_one() {
        let current = secret('a');
        let good = current.sign(NOW, BODY);
        let forged = format!(",v1={}", "7".repeat(64));
        let too_many = format!("{good}{}", forged.repeat(MAX_ENTRIES - 1));
        let as_many_as_allowed = format!("{good}{}", forged.repeat(MAX_ENTRIES - 2));

        let refused = verify(std::slice::from_ref(&current), Some(&too_many), BODY, NOW, DEFAULT_TOLERANCE_SECS);
        let accepted = verify(&[current], Some(&as_many_as_allowed), BODY, NOW, DEFAULT_TOLERANCE_SECS);

        assert_eq!(refused, Err(SignatureError::TooManyEntries));
        assert_eq!(accepted, Ok(()));
    }

    #[test]
    fn secrets_must_be_whsec_and_long_enough() {
        assert!(StripeWebhookSecret::parse("whsec_0123456789abcdef").is_ok());
        for bad in
            ["", "whsec_", "whsec_short", "0123456789abcdef0123", "whsec_0123456789 abcdef", "WHSEC_0123456789abcdef"]
        {
            assert!(StripeWebhookSecret::parse(bad).is_err(), "{bad:?}");
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;
        use super::{BODY, NOW};

        const TOLERANCE: i64 = DEFAULT_TOLERANCE_SECS;

        fn any_secret() -> impl Strategy<Value = StripeWebhookSecret> {
            "[A-Za-z0-9]{16,40}".prop_map(|rest| StripeWebhookSecret::parse(&format!("whsec_{rest}")).unwrap())
        }

        /// Entries a hostile or sloppy sender may put in the header.
        fn junk_entry() -> impl Strategy<Value = String> {
            prop_oneof![
                "[0-9a-f]{0,70}".prop_map(|tag| format!("v1={tag}")),
                "[ -~]{0,20}",
                any::<i64>().prop_map(|t| format!("t={t}")),
                Just(String::new()),
                Just("v1=".to_owned()),
                Just("t=".to_owned()),
                Just("=".to_owned()),
                Just(format!("v1={}", "z".repeat(64))),
            ]
        }

        proptest! {
            #[test]
            fn every_delivery_signed_with_a_current_secret_verifies_within_the_tolerance(
                secrets in proptest::collection::vec(any_secret(), 1..4),
                signer in any::<proptest::sample::Index>(),
                skew in -TOLERANCE..=TOLERANCE,
                body in proptest::collection::vec(any::<u8>(), 0..2048),
            ) {
                let header = signer.get(&secrets).sign(NOW + skew, &body);

                prop_assert_eq!(verify(&secrets, Some(&header), &body, NOW, TOLERANCE), Ok(()));
            }

            /// Changing one byte of the body, the timestamp or the signature breaks the delivery.
            #[test]
            fn a_one_byte_change_to_the_body_the_timestamp_or_the_signature_fails(
                secret in any_secret(),
                skew in -TOLERANCE..TOLERANCE,
                body in proptest::collection::vec(any::<u8>(), 1..512),
                at in any::<proptest::sample::Index>(),
                replacement in any::<u8>(),
                what in 0..3,
            ) {
                let timestamp = NOW + skew;
                let header = secret.sign(timestamp, &body);
                let (mut body, mut header) = (body, header.into_bytes());
                let signature_start = header.len() - 64;
                match what {
                    0 => {
                        let i = at.index(body.len());
                        body[i] = if body[i] == replacement { replacement.wrapping_add(1) } else { replacement };
                    }
                    1 => {
                        // One digit of the timestamp, to another digit: still a number, another time.
                        let i = 2 + at.index(signature_start - 2 - 4);
                        header[i] = if header[i] == b'9' { b'0' } else { header[i] + 1 };
                    }
                    _ => {
                        let i = signature_start + at.index(64);
                        header[i] = if header[i] == b'0' { b'1' } else { b'0' };
                    }
                }
                let header = String::from_utf8_lossy(&header).into_owned();

                prop_assert_ne!(verify(&[secret], Some(&header), &body, NOW, TOLERANCE), Ok(()));
            }

            #[test]
            fn a_real_signature_is_found_among_junk_and_junk_alone_never_verifies(
                secret in any_secret(),
                junk in proptest::collection::vec(junk_entry(), 0..5),
                at in any::<proptest::sample::Index>(),
            ) {
                let good = secret.sign(NOW, BODY);
                let tag = good.split_once(",v1=").map(|(_, t)| format!("v1={t}")).unwrap();
                let header = |entries: &[String]| {
                    std::iter::once(format!("t={NOW}")).chain(entries.iter().cloned()).collect::<Vec<_>>().join(",")
                };
                // Each junk entry stays one entry, and not a second timestamp, which is refused whatever
                // the signatures.
                let junk: Vec<String> = junk
                    .into_iter()
                    .map(|e| e.replace(',', ";"))
                    .filter(|e| !e.trim_start().starts_with("t="))
                    .collect();
                let junk_only = header(&junk);
                let mut entries = junk;
                entries.insert(at.index(entries.len() + 1), tag);
                let with_real = header(&entries);

                let secrets = [secret];
                prop_assert_eq!(verify(&secrets, Some(&with_real), BODY, NOW, TOLERANCE), Ok(()));
                prop_assert_ne!(verify(&secrets, Some(&junk_only), BODY, NOW, TOLERANCE), Ok(()));
            }

            /// Whatever arrives in the header, the verdict is a result, never a panic, and without a
            /// signature made with the secret it is never a pass.
            #[test]
            fn junk_headers_are_refused_without_panicking(
                secret in any_secret(),
                header in proptest::option::of(prop_oneof![
                    proptest::collection::vec(junk_entry(), 0..12).prop_map(|e| e.join(",")),
                    any::<String>(),
                ]),
                body in proptest::collection::vec(any::<u8>(), 0..256),
            ) {
                prop_assert_ne!(verify(&[secret], header.as_deref(), &body, NOW, TOLERANCE), Ok(()));
            }
        }
    }
}
