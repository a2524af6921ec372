//! Verifying a delivery from oncepay on the merchant's side: a Standard Webhooks request
//! (`webhook-id`, `webhook-timestamp`, `webhook-signature`), signed with the endpoint's `whsec_`
//! secret. The signatures are `oncepay_webhook_signature`'s, the same code that checks the
//! provider's webhooks inside oncepay.

use reqwest::header::HeaderMap;
use time::OffsetDateTime;

pub use oncepay_webhook_signature::{BadSecret, DEFAULT_TOLERANCE_SECS, VerifyError, WebhookSecret};
use oncepay_webhook_signature::{SignedHeaders, verify};

/// Verifies a delivery's headers and its body, exactly as received (before any JSON parsing),
/// against the endpoint's secrets (two while one is being rotated), now.
///
/// Passes if any `v1` signature matches any of `secrets` and `webhook-timestamp` is within five
/// minutes of this machine's clock, either way. Whatever fails, do not act on the body: answer 400,
/// and oncepay delivers it again later.
///
/// # Errors
///
/// Which check failed ([`VerifyError`]).
pub fn verify_webhook(secrets: &[WebhookSecret], headers: &HeaderMap, body: &[u8]) -> Result<(), VerifyError> {
    verify_webhook_at(secrets, headers, body, OffsetDateTime::now_utc())
}

/// [`verify_webhook`] as of `now`: for tests and for checking a verifier against test vectors.
///
/// # Errors
///
/// Which check failed ([`VerifyError`]).
pub fn verify_webhook_at(
    secrets: &[WebhookSecret],
    headers: &HeaderMap,
    body: &[u8],
    now: OffsetDateTime,
) -> Result<(), VerifyError> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let signed = SignedHeaders {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
    };
    verify(secrets, signed, body, now.unix_timestamp(), DEFAULT_TOLERANCE_SECS)
}
