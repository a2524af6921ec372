//! The body of `POST /v1/payments`, as raw bytes: any JSON has one fingerprint however it is
//! written, and validation either names its errors or yields a request within every limit
//! (no U+0000 in a stored string).

#![no_main]
use libfuzzer_sys::fuzz_target;
use oncepay_domain::fingerprint::Fingerprint;
use oncepay_domain::payment_request::PaymentRequest;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let fingerprint = Fingerprint::of("POST", "/v1/payments", &json);
    // The same value, written anew, has the same fingerprint.
    let again: serde_json::Value = serde_json::from_slice(&serde_json::to_vec(&json).unwrap()).unwrap();
    assert_eq!(Fingerprint::of("POST", "/v1/payments", &again), fingerprint);
    match PaymentRequest::from_json(&json) {
        Ok(request) => {
            assert!((1..=1_000_000_000_000).contains(&request.amount.minor_units()));
            assert!((1..=255).contains(&request.customer_id.chars().count()));
            assert!(!request.customer_id.contains('\0'));
            assert!(request.description.iter().all(|d| d.chars().count() <= 1000 && !d.contains('\0')));
            assert!(request.metadata.len() <= 50);
            assert!(request.metadata.iter().all(|(k, v)| !k.is_empty()
                && k.chars().count() <= 40
                && v.chars().count() <= 500
                && !k.contains('\0')
                && !v.contains('\0')));
            assert!(request.payment_method.iter().all(|m| (1..=255).contains(&m.as_str().len())
                && m.as_str().bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')));
        }
        Err(errors) => assert!(!errors.is_empty()),
    }
});
