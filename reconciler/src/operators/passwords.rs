//! Local passwords, for installations without an identity provider: hashed with argon2id (its
//! default cost, 19 MiB and two passes), never stored or logged in the clear.

use argon2::password_hash::SaltString;
use argon2::{Argon2, PasswordHash, PasswordHasher, PasswordVerifier};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};

use crate::operator_error::OperatorError;

/// The shortest password accepted.
pub const MIN_LENGTH: usize = 12;

/// The PHC string of `password` (`$argon2id$v=19$…`), with a fresh random salt.
pub fn hash(password: &SecretString) -> Result<String, OperatorError> {
    let length = password.expose_secret().chars().count();
    if !(MIN_LENGTH..=1024).contains(&length) {
        return Err(OperatorError::Invalid(format!("a password must have {MIN_LENGTH} to 1024 characters")));
    }
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    let salt =
        SaltString::encode_b64(&salt).map_err(|e| OperatorError::Failed(anyhow::anyhow!("cannot make a salt: {e}")))?;
    let hashed = Argon2::default()
        .hash_password(password.expose_secret().as_bytes(), &salt)
        .map_err(|e| OperatorError::Failed(anyhow::anyhow!("cannot hash the password: {e}")))?;
    Ok(hashed.to_string())
}

/// Whether `password` is the one `stored` was made from. With no stored hash (an unknown name, or
/// an operator without a local password) it still spends the time of one check, so the answer's
/// timing does not tell which names exist.
pub fn verify(stored: Option<&str>, password: &SecretString) -> bool {
    let parsed = stored.and_then(|stored| PasswordHash::new(stored).ok());
    match parsed {
        Some(parsed) => Argon2::default().verify_password(password.expose_secret().as_bytes(), &parsed).is_ok(),
        None => {
            let _ = hash(&SecretString::from("a password nobody has".to_owned()));
            false
        }
    }
}

/// A random password for a new account, shown once: 24 characters of base64url.
pub fn generate() -> SecretString {
    use base64::Engine;
    let mut raw = [0u8; 18];
    rand::rng().fill_bytes(&mut raw);
    SecretString::from(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_verifies_its_password_only_and_is_argon2id() {
        let password = SecretString::from("correct horse battery staple".to_owned());
        let stored = hash(&password).unwrap();

        assert!(stored.starts_with("$argon2id$"), "{stored}");
        assert!(verify(Some(&stored), &password));
        assert!(!verify(Some(&stored), &SecretString::from("correct horse battery stapler".to_owned())));
        assert!(!verify(None, &password));
        assert!(!verify(Some("not a hash"), &password));
        assert_ne!(hash(&password).unwrap(), stored, "a fresh salt each time");
    }

    #[test]
    fn short_passwords_are_refused() {
        assert!(matches!(hash(&SecretString::from("too short".to_owned())), Err(OperatorError::Invalid(_))));
        assert_eq!(generate().expose_secret().len(), 24);
    }
}
