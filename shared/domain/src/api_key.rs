//! Tenant API keys: how they are made, what a token looks like, and how one is checked.
//!
//! A token is `opk_` followed by the unpadded base64url of 56 bytes: the tenant id (16), a random key
//! id (8) and a random secret (32). Only the SHA-256 of the secret is stored. A token is shown once,
//! when it is created, and never logged: its `Debug` form is redacted.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use uuid::Uuid;

use crate::ids::TenantId;

/// What every oncepay API key starts with, so a leaked one is recognisable by secret scanners.
pub const PREFIX: &str = "opk_";

const TENANT_LEN: usize = 16;
const KEY_ID_LEN: usize = 8;
const SECRET_LEN: usize = 32;
const RAW_LEN: usize = TENANT_LEN + KEY_ID_LEN + SECRET_LEN;

/// The public identifier of one API key of a tenant: 16 lower-case hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyId(String);

impl KeyId {
    /// Reads a key id typed by an operator: 16 lower-case hex digits.
    pub fn parse(text: &str) -> Option<Self> {
        let valid = text.len() == KEY_ID_LEN * 2 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        valid.then(|| Self(text.to_owned()))
    }

    /// The id as stored and shown to operators.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The SHA-256 of a key's secret part: what the database keeps.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretHash([u8; 32]);

impl SecretHash {
    /// The stored bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Compares with a stored hash in constant time.
    pub fn matches(&self, stored: &[u8]) -> bool {
        stored.len() == self.0.len() && bool::from(self.0.ct_eq(stored))
    }
}

impl fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretHash(..)")
    }
}

/// A token presented by a client, split into its parts. The tenant id and key id find the stored
/// record with a primary-key read; the secret's hash is then compared with the stored one in
/// constant time ([`SecretHash::matches`]).
pub struct PresentedKey {
    /// The tenant the token claims to belong to.
    pub tenant_id: TenantId,
    /// Which of the tenant's keys.
    pub key_id: KeyId,
    /// The hash of the presented secret, to compare with the stored one.
    pub secret_hash: SecretHash,
}

impl fmt::Debug for PresentedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PresentedKey")
            .field("tenant_id", &self.tenant_id)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// A freshly made key: the token to show once, and what to store.
pub struct NewKey {
    /// The whole token, for the operator to hand to the tenant. Shown once.
    pub token: SecretString,
    /// The key's public id.
    pub key_id: KeyId,
    /// The hash of its secret, for the database.
    pub secret_hash: SecretHash,
}

impl fmt::Debug for NewKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewKey").field("key_id", &self.key_id).finish_non_exhaustive()
    }
}

/// Makes a new random key for `tenant`.
pub fn generate(tenant: TenantId) -> NewKey {
    let mut raw = [0u8; RAW_LEN];
    raw[..TENANT_LEN].copy_from_slice(tenant.as_uuid().as_bytes());
    rand::rng().fill_bytes(&mut raw[TENANT_LEN..]);
    let key_id = KeyId(hex::encode(&raw[TENANT_LEN..TENANT_LEN + KEY_ID_LEN]));
    let secret_hash = hash_secret(&raw[TENANT_LEN + KEY_ID_LEN..]);
    let token = SecretString::from(format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(raw)));
    NewKey { token, key_id, secret_hash }
}

/// Splits a presented token; `None` if it cannot be one of ours (wrong prefix, length or alphabet).
pub fn parse(token: &str) -> Option<PresentedKey> {
    let encoded = token.strip_prefix(PREFIX)?;
    let raw: [u8; RAW_LEN] = URL_SAFE_NO_PAD.decode(encoded).ok()?.try_into().ok()?;
    let tenant = Uuid::from_slice(&raw[..TENANT_LEN]).ok()?;
    Some(PresentedKey {
        tenant_id: TenantId::from_uuid(tenant),
        key_id: KeyId(hex::encode(&raw[TENANT_LEN..TENANT_LEN + KEY_ID_LEN])),
        secret_hash: hash_secret(&raw[TENANT_LEN + KEY_ID_LEN..]),
    })
}

/// The hash of a token's secret part, as stored.
pub(crate) fn hash_secret(secret: &[u8]) -> SecretHash {
    SecretHash(Sha256::digest(secret).into())
}

/// Exposes a new key's token for the one moment it is shown.
pub fn reveal(key: &NewKey) -> &str {
    key.token.expose_secret()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_id_is_sixteen_lower_case_hex_digits() {
        let key = generate(TenantId::generate());
        assert_eq!(KeyId::parse(key.key_id.as_str()), Some(key.key_id));
        for bad in ["", "0123456789abcde", "0123456789abcdef0", "0123456789ABCDEF", "0123456789abcdeg"] {
            assert_eq!(KeyId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_generated_token_parses_back_to_its_tenant_id_and_secret() {
        let tenant = TenantId::generate();
        let key = generate(tenant);

        let presented = parse(reveal(&key)).unwrap();

        assert_eq!(presented.tenant_id, tenant);
        assert_eq!(presented.key_id, key.key_id);
        assert!(presented.secret_hash.matches(key.secret_hash.as_bytes()));
    }

    #[test]
    fn a_token_with_any_changed_secret_character_does_not_match() {
        let key = generate(TenantId::generate());
        let token = reveal(&key).to_owned();
        // The last characters encode the secret.
        let mut tampered = token.clone().into_bytes();
        let last = tampered.len() - 2;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();

        let presented = parse(&tampered).unwrap();

        assert!(!presented.secret_hash.matches(key.secret_hash.as_bytes()));
    }

    #[test]
    fn tokens_carry_at_least_32_random_bytes_and_are_distinct() {
        let tenant = TenantId::generate();
        let a = generate(tenant);
        let b = generate(tenant);

        assert_ne!(reveal(&a), reveal(&b));
        assert_ne!(a.key_id, b.key_id);
        assert!(reveal(&a).starts_with(PREFIX));
        assert_eq!(reveal(&a).len(), PREFIX.len() + 75);
    }

    #[test]
    fn malformed_tokens_are_not_keys() {
        let good = reveal(&generate(TenantId::generate())).to_owned();
        for bad in [
            String::new(),
            "opk_".into(),
            good.replace("opk_", "sk_"),
            good[..good.len() - 1].into(),
            format!("{good}A"),
            good.replace(&good[10..11], "!"),
        ] {
            assert!(parse(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn debug_output_never_shows_secrets() {
        let key = generate(TenantId::generate());
        let token = reveal(&key).to_owned();
        let presented = parse(&token).unwrap();

        for shown in [format!("{key:?}"), format!("{presented:?}"), format!("{:?}", key.secret_hash)] {
            assert!(!shown.contains(&token[PREFIX.len()..]), "{shown}");
            assert!(!shown.contains(&hex::encode(key.secret_hash.as_bytes())), "{shown}");
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        const URL_SAFE: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

        proptest! {
            /// Every 56 bytes make exactly one token, and the token gives back each part.
            #[test]
            fn a_token_names_its_tenant_key_id_and_secret(raw in proptest::collection::vec(any::<u8>(), RAW_LEN)) {
                let token = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(&raw));

                let presented = parse(&token);

                prop_assert!(presented.is_some());
                let presented = presented.unwrap();
                prop_assert_eq!(presented.tenant_id.as_uuid().as_bytes().to_vec(), raw[..TENANT_LEN].to_vec());
                prop_assert_eq!(presented.key_id.as_str(), hex::encode(&raw[TENANT_LEN..TENANT_LEN + KEY_ID_LEN]));
                prop_assert!(presented.secret_hash.matches(hash_secret(&raw[TENANT_LEN + KEY_ID_LEN..]).as_bytes()));
            }

            /// A token has one spelling: changing any one character, even to another base64url
            /// character that decodes to the same bytes but for padding bits, never presents the
            /// same key. (A second spelling would let a leaked key slip past a deny list by its text.)
            #[test]
            fn changing_any_character_of_a_token_never_presents_the_same_key(
                at in any::<proptest::sample::Index>(),
                replacement in prop_oneof![
                    4 => proptest::sample::select(URL_SAFE.chars().collect::<Vec<_>>()),
                    1 => any::<char>(),
                ],
            ) {
                let tenant = TenantId::generate();
                let key = generate(tenant);
                let token: Vec<char> = reveal(&key).chars().collect();
                let position = at.index(token.len());
                prop_assume!(token[position] != replacement);
                let mut tampered = token;
                tampered[position] = replacement;
                let tampered: String = tampered.into_iter().collect();

                let same_key = parse(&tampered).is_some_and(|presented| {
                    presented.tenant_id == tenant
                        && presented.key_id == key.key_id
                        && presented.secret_hash.matches(key.secret_hash.as_bytes())
                });

                prop_assert!(!same_key, "{} presents the same key", position);
            }

            /// The last character carries two padding bits: a decoder that ignored them would
            /// accept four spellings of every token.
            #[test]
            fn the_last_character_has_one_spelling(replacement in proptest::sample::select(URL_SAFE.chars().collect::<Vec<_>>())) {
                let key = generate(TenantId::generate());
                let token = reveal(&key);
                let last = token.chars().last().unwrap_or_default();
                prop_assume!(last != replacement);

                let respelled = format!("{}{replacement}", &token[..token.len() - 1]);

                let same_secret = parse(&respelled).is_some_and(|p| p.secret_hash.matches(key.secret_hash.as_bytes()));
                prop_assert!(!same_secret, "{} and {} present the same key", last, replacement);
            }

            /// Whatever is sent as a bearer token, only `opk_` and 75 base64url characters can be
            /// one, and parsing it never panics.
            #[test]
            fn only_well_formed_tokens_parse(
                token in prop_oneof![
                    "(opk_)?[A-Za-z0-9_-]{70,80}",
                    "opk_[A-Za-z0-9_+/=-]{74,76}",
                    any::<String>(),
                ],
            ) {
                if parse(&token).is_some() {
                    let encoded = token.strip_prefix(PREFIX);
                    prop_assert!(encoded.is_some_and(|e| e.len() == 75 && e.chars().all(|c| URL_SAFE.contains(c))), "{}", token);
                }
            }
        }
    }

    #[test]
    fn hashes_of_another_length_never_match() {
        let key = generate(TenantId::generate());
        assert!(!key.secret_hash.matches(&key.secret_hash.as_bytes()[..31]));
        assert!(!key.secret_hash.matches(&[]));
    }
}
