//! Operators' personal tokens, for the reconciler's operations API: how one is made, what it looks
//! like, and how a presented one is split for checking.
//!
//! A token is `oot_` followed by the unpadded base64url of 48 bytes: the token id (16, a UUID) and a
//! random secret (32). As with API keys ([`crate::api_key`]), only the SHA-256 of the secret is
//! stored, a token is shown once, and its `Debug` form is redacted.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use uuid::Uuid;

use crate::api_key::{SecretHash, hash_secret};

/// What every operator token starts with, so a leaked one is recognisable by secret scanners.
pub const PREFIX: &str = "oot_";

const ID_LEN: usize = 16;
const SECRET_LEN: usize = 32;
const RAW_LEN: usize = ID_LEN + SECRET_LEN;

/// A token presented with a request: its id, to find the stored record by primary key, and the hash
/// of its secret, to compare with the stored one in constant time ([`SecretHash::matches`]).
pub struct PresentedToken {
    /// Which token.
    pub token_id: Uuid,
    /// The hash of the presented secret.
    pub secret_hash: SecretHash,
}

impl fmt::Debug for PresentedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PresentedToken").field("token_id", &self.token_id).finish_non_exhaustive()
    }
}

/// A freshly made token: the whole token to show once, and what to store.
pub struct NewToken {
    /// The token, for the operator. Shown once.
    pub token: SecretString,
    /// Its id.
    pub token_id: Uuid,
    /// The hash of its secret, for the database.
    pub secret_hash: SecretHash,
}

impl NewToken {
    /// Exposes the token for the one moment it is shown.
    pub fn reveal(&self) -> &str {
        self.token.expose_secret()
    }
}

impl fmt::Debug for NewToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewToken").field("token_id", &self.token_id).finish_non_exhaustive()
    }
}

/// Makes a new random token.
pub fn generate() -> NewToken {
    let token_id = Uuid::new_v4();
    let mut raw = [0u8; RAW_LEN];
    raw[..ID_LEN].copy_from_slice(token_id.as_bytes());
    rand::rng().fill_bytes(&mut raw[ID_LEN..]);
    let secret_hash = hash_secret(&raw[ID_LEN..]);
    let token = SecretString::from(format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(raw)));
    NewToken { token, token_id, secret_hash }
}

/// Splits a presented token; `None` if it cannot be one of ours (wrong prefix, length or alphabet).
pub fn parse(token: &str) -> Option<PresentedToken> {
    let encoded = token.strip_prefix(PREFIX)?;
    let raw: [u8; RAW_LEN] = URL_SAFE_NO_PAD.decode(encoded).ok()?.try_into().ok()?;
    let token_id = Uuid::from_slice(&raw[..ID_LEN]).ok()?;
    Some(PresentedToken { token_id, secret_hash: hash_secret(&raw[ID_LEN..]) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_token_parses_back_to_its_id_and_secret() {
        let new = generate();

        let presented = parse(new.reveal()).unwrap();

        assert_eq!(presented.token_id, new.token_id);
        assert!(presented.secret_hash.matches(new.secret_hash.as_bytes()));
        assert!(new.reveal().starts_with(PREFIX));
        assert_ne!(generate().reveal(), new.reveal());
    }

    #[test]
    fn a_changed_secret_does_not_match_and_malformed_tokens_are_not_tokens() {
        let new = generate();
        let token = new.reveal().to_owned();
        let mut tampered = token.clone().into_bytes();
        let last = tampered.len() - 2;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        let presented = parse(&String::from_utf8(tampered).unwrap()).unwrap();
        assert!(!presented.secret_hash.matches(new.secret_hash.as_bytes()));

        for bad in [String::new(), PREFIX.into(), token.replace(PREFIX, "opk_"), token[..token.len() - 1].into()] {
            assert!(parse(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn debug_output_never_shows_the_secret() {
        let new = generate();
        let token = new.reveal().to_owned();
        let presented = parse(&token).unwrap();
        for shown in [format!("{new:?}"), format!("{presented:?}")] {
            assert!(!shown.contains(&token[PREFIX.len()..]), "{shown}");
        }
    }
}
