//! Random secrets for a local run: each run makes its own, so none is ever written down.

use base64::Engine;
use rand::RngCore;

/// A webhook signing secret in the provider's format: `whsec_` and base64 of 32 random bytes.
pub fn webhook_secret() -> String {
    format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(random_bytes(32)))
}

/// `bytes` random bytes as lower-case hex: a provider key or a password.
pub fn hex_token(bytes: usize) -> String {
    random_bytes(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; n];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}
