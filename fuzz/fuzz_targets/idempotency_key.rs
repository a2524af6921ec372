//! The `Idempotency-Key` header, as raw bytes: whatever is accepted is 1 to 255 visible ASCII
//! characters and names itself in both its bare and its quoted spelling.

#![no_main]
use libfuzzer_sys::fuzz_target;
use oncepay_domain::idempotency_key::IdempotencyKey;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = IdempotencyKey::parse(data) {
        let text = key.as_str();
        assert!((1..=255).contains(&text.len()));
        assert!(text.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        let quoted = format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""));
        assert_eq!(IdempotencyKey::parse(quoted.as_bytes()).unwrap().as_str(), text);
        if !text.starts_with('"') {
            assert_eq!(IdempotencyKey::parse(text.as_bytes()).unwrap().as_str(), text);
        }
    }
});
