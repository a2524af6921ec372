//! Standard Webhooks signatures: `v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>`.
//!
//! One implementation for both directions: the provider's webhooks to oncepay (the simulator signs,
//! the reconciler verifies), and oncepay's deliveries as a merchant verifies them
//! (`oncepay_client::webhooks`). A sender signs each delivery with the headers `webhook-id`, `webhook-timestamp` (Unix seconds)
//! and `webhook-signature` (space-separated `version,signature` pairs, several during a secret
//! rotation). Secrets are written `whsec_<base64>`; the HMAC key is the decoded bytes.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

/// The most entries a `webhook-signature` header may hold: a sender signs with one secret, two
/// during a rotation.
pub const MAX_SIGNATURES: usize = 8;

/// The length of a base64 HMAC-SHA256 tag.
const TAG_BASE64_LEN: usize = 44;

/// The tolerance the contract sets: five minutes either way.
pub const DEFAULT_TOLERANCE_SECS: i64 = 5 * 60;

/// A webhook signing secret.
#[derive(Clone)]
pub struct WebhookSecret(SecretSlice<u8>);

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

/// A secret string that is not `whsec_<base64>` of at least 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a webhook secret must be `whsec_` followed by the base64 of at least 16 bytes")]
pub struct BadSecret;

impl WebhookSecret {
    /// Parses `whsec_<base64>`.
    pub fn parse(text: &str) -> Result<Self, BadSecret> {
        let encoded = text.strip_prefix("whsec_").ok_or(BadSecret)?;
        let key = STANDARD.decode(encoded).map_err(|_| BadSecret)?;
        if key.len() < 16 {
            return Err(BadSecret);
        }
        Ok(Self(key.into()))
    }

    /// A new random secret, as its `whsec_` text: for local runs and tests, which must never share
    /// a published one.
    pub fn generate() -> String {
        let mut key = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut key);
        format!("whsec_{}", STANDARD.encode(key))
    }

    /// Signs a delivery: the value of one `webhook-signature` entry, `v1,<base64>`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", STANDARD.encode(self.mac(id, timestamp, body).finalize().into_bytes()))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        // HMAC accepts keys of any length.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.0.expose_secret())
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

/// Why a delivery was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A required header is absent or empty.
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    /// `webhook-timestamp` is not an integer.
    #[error("the webhook-timestamp header is not a Unix time")]
    BadTimestamp,
    /// The timestamp is too far from now, in either direction.
    #[error("the webhook-timestamp is outside the tolerance")]
    OutsideTolerance,
    /// No `v1` signature matches any current secret.
    #[error("no signature matches")]
    NoMatch,
    /// The `webhook-signature` header holds more entries than any sender sends.
    #[error("the webhook-signature header holds too many signatures")]
    TooManySignatures,
}

/// The three signature headers of a delivery, as received.
#[derive(Debug, Clone, Copy)]
pub struct SignedHeaders<'a> {
    /// `webhook-id`.
    pub id: Option<&'a str>,
    /// `webhook-timestamp`.
    pub timestamp: Option<&'a str>,
    /// `webhook-signature`.
    pub signature: Option<&'a str>,
}

/// Verifies a delivery against every current secret; `now` is Unix seconds.
///
/// A delivery passes if any `v1` signature matches any secret, compared in constant time, and its
/// timestamp is within `tolerance_secs` of `now` in either direction. A forged delivery must cost us
/// no more than it costs its sender: a header of more than [`MAX_SIGNATURES`] entries is refused
/// before any hashing, and each secret's tag is computed once per delivery, not once per candidate.
pub fn verify(
    secrets: &[WebhookSecret],
    headers: SignedHeaders<'_>,
    body: &[u8],
    now: i64,
    tolerance_secs: i64,
) -> Result<(), VerifyError> {
    fn present<'a>(value: Option<&'a str>, name: &'static str) -> Result<&'a str, VerifyError> {
        value.filter(|v| !v.is_empty()).ok_or(VerifyError::MissingHeader(name))
    }
    let id = present(headers.id, "webhook-id")?;
    let timestamp_text = present(headers.timestamp, "webhook-timestamp")?;
    let signatures = present(headers.signature, "webhook-signature")?;

    let timestamp: i64 = timestamp_text.trim().parse().map_err(|_| VerifyError::BadTimestamp)?;
    // Widened: the timestamp is the sender's, and `now - i64::MIN` overflows an i64.
    if (i128::from(now) - i128::from(timestamp)).abs() > i128::from(tolerance_secs) {
        return Err(VerifyError::OutsideTolerance);
    }

    // Bounded before any hashing: a forged header of thousands of entries costs one scan. Only
    // entries that can be an HMAC-SHA256 tag are candidates.
    let entries: Vec<&str> = signatures.split(' ').filter(|entry| !entry.is_empty()).take(MAX_SIGNATURES + 1).collect();
    if entries.len() > MAX_SIGNATURES {
        return Err(VerifyError::TooManySignatures);
    }
    let candidates: Vec<[u8; 32]> = entries
        .iter()
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, signature)| *version == "v1" && signature.len() <= TAG_BASE64_LEN)
        .filter_map(|(_, signature)| STANDARD.decode(signature).ok()?.try_into().ok())
        .collect();
    if candidates.is_empty() {
        return Err(VerifyError::NoMatch);
    }
    // Each secret's tag is computed once, whatever the number of candidates.
    for secret in secrets {
        let expected = secret.mac(id, timestamp, body).finalize().into_bytes();
        // Constant-time comparisons, and every candidate is compared.
        let matched = candidates.iter().fold(Choice::from(0), |found, candidate| found | expected.ct_eq(candidate));
        if bool::from(matched) {
            return Ok(());
        }
    }
    Err(VerifyError::NoMatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_763_800_000;
    const BODY: &[u8] = br#"{"type":"charge.succeeded"}"#;

    fn secret(seed: u8) -> WebhookSecret {
        WebhookSecret::parse(&format!("whsec_{}", STANDARD.encode([seed; 24]))).unwrap()
    }

    fn check(secrets: &[WebhookSecret], id: &str, ts: &str, sig: &str, body: &[u8]) -> Result<(), VerifyError> {
        let headers = SignedHeaders { id: Some(id), timestamp: Some(ts), signature: Some(sig) };
        verify(secrets, headers, body, NOW, DEFAULT_TOLERANCE_SECS)
    }

    struct Case {
        name: &'static str,
        secrets: Vec<WebhookSecret>,
        id: &'static str,
        timestamp: String,
        signature: String,
        body: &'static [u8],
        expected: Result<(), VerifyError>,
    }

    #[test]
    fn each_kind_of_delivery_gets_the_right_verdict() {
        let current = secret(1);
        let old = secret(2);
        let good = current.sign("msg_1", NOW, BODY);
        let now = NOW.to_string();
        let case = |name, secrets: &[&WebhookSecret], id, timestamp: &str, signature: &str, body, expected| Case {
            name,
            secrets: secrets.iter().map(|s| (*s).clone()).collect(),
            id,
            timestamp: timestamp.to_owned(),
            signature: signature.to_owned(),
            body,
            expected,
        };
        let cases = [
            case("valid", &[&current], "msg_1", &now, &good, BODY, Ok(())),
            case("tampered body", &[&current], "msg_1", &now, &good, b"{}", Err(VerifyError::NoMatch)),
            case("other id", &[&current], "msg_2", &now, &good, BODY, Err(VerifyError::NoMatch)),
            case("wrong secret", &[&old], "msg_1", &now, &good, BODY, Err(VerifyError::NoMatch)),
            case(
                "empty signature",
                &[&current],
                "msg_1",
                &now,
                "",
                BODY,
                Err(VerifyError::MissingHeader("webhook-signature")),
            ),
            case("truncated", &[&current], "msg_1", &now, &good[..good.len() - 4], BODY, Err(VerifyError::NoMatch)),
            case(
                "unknown scheme only",
                &[&current],
                "msg_1",
                &now,
                &good.replace("v1,", "v2,"),
                BODY,
                Err(VerifyError::NoMatch),
            ),
            case(
                "stale",
                &[&current],
                "msg_1",
                &(NOW - 301).to_string(),
                &current.sign("msg_1", NOW - 301, BODY),
                BODY,
                Err(VerifyError::OutsideTolerance),
            ),
            case(
                "future",
                &[&current],
                "msg_1",
                &(NOW + 301).to_string(),
                &current.sign("msg_1", NOW + 301, BODY),
                BODY,
                Err(VerifyError::OutsideTolerance),
            ),
            case(
                "edge of tolerance",
                &[&current],
                "msg_1",
                &(NOW - 300).to_string(),
                &current.sign("msg_1", NOW - 300, BODY),
                BODY,
                Ok(()),
            ),
            case("not a number", &[&current], "msg_1", "soon", &good, BODY, Err(VerifyError::BadTimestamp)),
            case(
                "the earliest time there is",
                &[&current],
                "msg_1",
                &i64::MIN.to_string(),
                &current.sign("msg_1", i64::MIN, BODY),
                BODY,
                Err(VerifyError::OutsideTolerance),
            ),
            case(
                "signed with the old secret, receiver holds both",
                &[&current, &old],
                "msg_1",
                &now,
                &old.sign("msg_1", NOW, BODY),
                BODY,
                Ok(()),
            ),
            case(
                "sender signs with both",
                &[&current],
                "msg_1",
                &now,
                &format!("{} {}", old.sign("msg_1", NOW, BODY), good),
                BODY,
                Ok(()),
            ),
        ];
        for c in cases {
            assert_eq!(check(&c.secrets, c.id, &c.timestamp, &c.signature, c.body), c.expected, "{}", c.name);
        }
    }

    #[test]
    fn a_header_with_more_signatures_than_any_sender_sends_is_refused_even_with_a_good_one() {
        let current = secret(1);
        let forged = vec![format!("v1,{}", STANDARD.encode([7u8; 32])); MAX_SIGNATURES].join(" ");
        let many_with_a_good_one = format!("{forged} {}", current.sign("msg_1", NOW, BODY));
        let as_many_as_allowed = format!(
            "{} {}",
            vec![format!("v1,{}", STANDARD.encode([7u8; 32])); MAX_SIGNATURES - 1].join(" "),
            current.sign("msg_1", NOW, BODY)
        );
        let now = NOW.to_string();

        let refused = check(std::slice::from_ref(&current), "msg_1", &now, &many_with_a_good_one, BODY);
        let accepted = check(&[current], "msg_1", &now, &as_many_as_allowed, BODY);

        assert_eq!(refused, Err(VerifyError::TooManySignatures));
        assert_eq!(accepted, Ok(()));
    }

    #[test]
    fn missing_headers_are_named() {
        let none = SignedHeaders { id: None, timestamp: None, signature: None };
        assert_eq!(verify(&[secret(1)], none, BODY, NOW, 300), Err(VerifyError::MissingHeader("webhook-id")));
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;
        use super::{BODY, NOW};

        const TOLERANCE: i64 = DEFAULT_TOLERANCE_SECS;

        fn any_secret() -> impl Strategy<Value = WebhookSecret> {
            proptest::collection::vec(any::<u8>(), 16..64)
                .prop_map(|key| WebhookSecret::parse(&format!("whsec_{}", STANDARD.encode(key))).unwrap())
        }

        fn headers<'a>(id: &'a str, timestamp: &'a str, signature: &'a str) -> SignedHeaders<'a> {
            SignedHeaders { id: Some(id), timestamp: Some(timestamp), signature: Some(signature) }
        }

        /// Entries a hostile or sloppy sender may put beside (or instead of) a real signature.
        fn junk_entry() -> impl Strategy<Value = String> {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..40).prop_map(|mac| format!("v1,{}", STANDARD.encode(mac))),
                "[ -~]{0,20}",
                Just(String::new()),
                Just("v1,".to_owned()),
                Just("v1".to_owned()),
                Just(",".to_owned()),
                Just("v1,!!!!".to_owned()),
            ]
        }

        /// A timestamp header as anyone may send it: any integer, signs, padding, or not a number.
        fn any_timestamp() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<i64>().prop_map(|t| t.to_string()),
                Just(i64::MIN.to_string()),
                Just(i64::MAX.to_string()),
                (NOW - 2 * TOLERANCE..NOW + 2 * TOLERANCE).prop_map(|t| format!(" +{t} ")),
                "[ -~]{0,25}",
            ]
        }

        proptest! {
            #[test]
            fn every_delivery_signed_with_a_current_secret_verifies_within_the_tolerance(
                secrets in proptest::collection::vec(any_secret(), 1..4),
                signer in any::<proptest::sample::Index>(),
                id in "[!-~]{1,64}",
                skew in -TOLERANCE..=TOLERANCE,
                body in proptest::collection::vec(any::<u8>(), 0..2048),
            ) {
                let timestamp = NOW + skew;
                let signature = signer.get(&secrets).sign(&id, timestamp, &body);

                prop_assert_eq!(
                    verify(&secrets, headers(&id, &timestamp.to_string(), &signature), &body, NOW, TOLERANCE),
                    Ok(())
                );
            }

            #[test]
            fn a_change_to_the_id_the_timestamp_or_the_body_breaks_the_signature(
                secret in any_secret(),
                id in "[!-~]{1,64}",
                skew in -TOLERANCE..TOLERANCE,
                body in proptest::collection::vec(any::<u8>(), 1..512),
                flip in any::<proptest::sample::Index>(),
                bit in 0u8..8,
                what in 0..4,
            ) {
                let signature = secret.sign(&id, NOW + skew, &body);
                let (mut id, mut timestamp, mut body) = (id, NOW + skew, body);
                match what {
                    0 => id.push('x'),
                    1 => timestamp += 1,
                    2 => { let at = flip.index(body.len()); body[at] ^= 1 << bit; }
                    _ => body.push(b' '),
                }

                prop_assert_eq!(
                    verify(&[secret], headers(&id, &timestamp.to_string(), &signature), &body, NOW, TOLERANCE),
                    Err(VerifyError::NoMatch)
                );
            }

            #[test]
            fn a_validly_signed_delivery_outside_the_tolerance_is_refused(
                secret in any_secret(),
                skew in prop_oneof![TOLERANCE + 1..=365 * 86_400, -365 * 86_400..=-TOLERANCE - 1],
            ) {
                let timestamp = NOW + skew;
                let signature = secret.sign("msg_1", timestamp, BODY);

                prop_assert_eq!(
                    verify(&[secret], headers("msg_1", &timestamp.to_string(), &signature), BODY, NOW, TOLERANCE),
                    Err(VerifyError::OutsideTolerance)
                );
            }

            #[test]
            fn a_real_signature_is_found_among_junk_and_junk_alone_never_verifies(
                secret in any_secret(),
                junk in proptest::collection::vec(junk_entry(), 0..6),
                at in any::<proptest::sample::Index>(),
            ) {
                let junk_only = junk.join(" ");
                let mut entries = junk;
                entries.insert(at.index(entries.len() + 1), secret.sign("msg_1", NOW, BODY));
                let with_real = entries.join(" ");
                let now = NOW.to_string();

                let secrets = [secret];
                prop_assert_eq!(verify(&secrets, headers("msg_1", &now, &with_real), BODY, NOW, TOLERANCE), Ok(()));
                prop_assert_ne!(verify(&secrets, headers("msg_1", &now, &junk_only), BODY, NOW, TOLERANCE), Ok(()));
            }

            /// Whatever arrives in the three headers, the verdict is a result, never a panic, and
            /// without a signature made with the secret it is never a pass.
            #[test]
            fn hostile_headers_are_refused_without_panicking(
                secret in any_secret(),
                id in proptest::option::of("[ -~]{0,40}"),
                timestamp in proptest::option::of(any_timestamp()),
                signature in proptest::option::of(proptest::collection::vec(junk_entry(), 0..4).prop_map(|e| e.join(" "))),
                body in proptest::collection::vec(any::<u8>(), 0..256),
            ) {
                let received = SignedHeaders { id: id.as_deref(), timestamp: timestamp.as_deref(), signature: signature.as_deref() };

                prop_assert_ne!(verify(&[secret], received, &body, NOW, TOLERANCE), Ok(()));
            }

            #[test]
            fn a_secret_is_read_only_from_whsec_and_base64_of_16_bytes_or_more(text in "(whsec_)?[A-Za-z0-9+/=_-]{0,60}") {
                let decoded = text.strip_prefix("whsec_").and_then(|encoded| STANDARD.decode(encoded).ok());

                prop_assert_eq!(WebhookSecret::parse(&text).is_ok(), decoded.is_some_and(|key| key.len() >= 16));
            }
        }
    }

    #[test]
    fn secrets_must_be_whsec_base64_of_16_bytes_or_more() {
        assert!(WebhookSecret::parse(&format!("whsec_{}", STANDARD.encode([7u8; 16]))).is_ok());
        for bad in
            ["", "whsec_", "whsec_!!!", &format!("whsec_{}", STANDARD.encode([7u8; 15])), "c2VjcmV0c2VjcmV0c2VjcmV0"]
        {
            assert!(WebhookSecret::parse(bad).is_err(), "{bad}");
        }
    }
}
