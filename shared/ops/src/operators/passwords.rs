//! Local passwords, for installations without an identity provider: hashed with argon2id (its
//! default cost, 19 MiB and two passes), never stored or logged in the clear.
//!
//! Every hash the operations API computes takes a permit of one process-wide [`Hashing`] first, so
//! at most its bound run at once, whoever asks; beyond it the request is refused at once, not
//! queued. Only the bootstrap of the first admin, a command of its own, hashes without one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context as _;
use argon2::password_hash::SaltString;
use argon2::{Argon2, PasswordHash, PasswordHasher, PasswordVerifier};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics;
use crate::operator_error::OperatorError;

/// How many password hashes may run at once in this process.
#[derive(Debug)]
pub struct Hashing {
    permits: Arc<Semaphore>,
    bound: usize,
    running: AtomicUsize,
    peak: AtomicUsize,
}

/// The right to compute password hashes, one at a time, until dropped.
pub struct Permit {
    _permit: OwnedSemaphorePermit,
    hashing: Arc<Hashing>,
}

impl Hashing {
    /// At most `bound` hashes at once (at least one).
    pub fn new(bound: usize) -> Arc<Self> {
        let bound = bound.max(1);
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(bound)),
            bound,
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        })
    }

    /// The bound.
    pub const fn bound(&self) -> usize {
        self.bound
    }

    /// The most hashes that ever ran at once in this process.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// A permit, or a refusal (`Busy`) when the bound is reached: the caller answers 503.
    pub fn try_start(self: &Arc<Self>) -> Result<Permit, OperatorError> {
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => Ok(Permit { _permit: permit, hashing: Arc::clone(self) }),
            Err(_) => {
                ::metrics::counter!(metrics::PASSWORD_CHECKS_REFUSED).increment(1);
                Err(OperatorError::Busy("too many passwords are being checked at once: try again in a second".into()))
            }
        }
    }
}

impl Permit {
    /// [`verify`], off the async threads, counted as one running hash.
    pub async fn verify(&self, stored: Option<String>, password: SecretString) -> Result<bool, OperatorError> {
        self.run(move || Ok(verify(stored.as_deref(), &password))).await
    }

    /// [`hash`], off the async threads, counted as one running hash.
    pub async fn hash(&self, password: SecretString) -> Result<String, OperatorError> {
        self.run(move || hash(&password)).await
    }

    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, OperatorError> + Send + 'static,
    ) -> Result<T, OperatorError> {
        let hashing = Arc::clone(&self.hashing);
        tokio::task::spawn_blocking(move || {
            // Counted where the memory is taken, on the blocking thread itself.
            let now = hashing.running.fetch_add(1, Ordering::SeqCst) + 1;
            hashing.peak.fetch_max(now, Ordering::SeqCst);
            ::metrics::gauge!(metrics::PASSWORD_HASHES_RUNNING).increment(1.0);
            let result = work();
            hashing.running.fetch_sub(1, Ordering::SeqCst);
            ::metrics::gauge!(metrics::PASSWORD_HASHES_RUNNING).decrement(1.0);
            result
        })
        .await
        .context("the password hashing panicked")?
    }
}

/// The shortest password accepted.
pub const MIN_LENGTH: usize = 12;

/// The PHC string of `password` (`$argon2id$v=19$…`), with a fresh random salt.
pub fn hash(password: &SecretString) -> Result<String, OperatorError> {
    check_length(password)?;
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    let salt =
        SaltString::encode_b64(&salt).map_err(|e| OperatorError::Failed(anyhow::anyhow!("cannot make a salt: {e}")))?;
    let hashed = Argon2::default()
        .hash_password(password.expose_secret().as_bytes(), &salt)
        .map_err(|e| OperatorError::Failed(anyhow::anyhow!("cannot hash the password: {e}")))?;
    Ok(hashed.to_string())
}

/// Checks that a new password may be used, before anything is hashed.
pub fn check_length(password: &SecretString) -> Result<(), OperatorError> {
    let length = password.expose_secret().chars().count();
    if !(MIN_LENGTH..=1024).contains(&length) {
        return Err(OperatorError::Invalid(format!("a password must have {MIN_LENGTH} to 1024 characters")));
    }
    Ok(())
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

    #[tokio::test]
    async fn a_permit_beyond_the_bound_is_refused_and_the_peak_is_kept() {
        let hashing = Hashing::new(2);
        let first = hashing.try_start().unwrap();
        let _second = hashing.try_start().unwrap();

        assert!(matches!(hashing.try_start(), Err(OperatorError::Busy(_))));
        assert!(!first.verify(None, SecretString::from("x".to_owned())).await.unwrap());
        assert_eq!(hashing.peak(), 1);
        drop(first);
        assert!(hashing.try_start().is_ok());
    }

    #[test]
    fn short_passwords_are_refused() {
        assert!(matches!(hash(&SecretString::from("too short".to_owned())), Err(OperatorError::Invalid(_))));
        assert_eq!(generate().expose_secret().len(), 24);
    }
}
