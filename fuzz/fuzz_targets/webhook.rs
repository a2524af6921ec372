//! A webhook delivery: `id`, `timestamp`, `signature` and the body, one per line of the input. A
//! delivery passes only with a signature made with the secret, and no header makes `verify` panic.

#![no_main]
use base64::Engine;
use libfuzzer_sys::fuzz_target;
use oncepay_webhook_signature::{SignedHeaders, WebhookSecret, verify};

const NOW: i64 = 1_763_800_000;

fuzz_target!(|data: &[u8]| {
    // id \n timestamp \n signature \n body
    let mut parts = data.splitn(4, |b| *b == b'\n');
    let id = parts.next().and_then(|p| std::str::from_utf8(p).ok());
    let timestamp = parts.next().and_then(|p| std::str::from_utf8(p).ok());
    let signature = parts.next().and_then(|p| std::str::from_utf8(p).ok());
    let body = parts.next().unwrap_or_default();
    let secret =
        WebhookSecret::parse(&format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([9u8; 24])))
            .unwrap();
    let headers = SignedHeaders { id, timestamp, signature };
    if verify(std::slice::from_ref(&secret), headers, body, NOW, 300).is_ok() {
        // Only a signature made with the secret passes.
        let ts: i64 = timestamp.unwrap().trim().parse().unwrap();
        let good = secret.sign(id.unwrap(), ts, body);
        assert!(signature.unwrap().split(' ').any(|entry| entry == good), "a forged delivery passed");
    }
    let _ = WebhookSecret::parse(std::str::from_utf8(data).unwrap_or_default());
});
