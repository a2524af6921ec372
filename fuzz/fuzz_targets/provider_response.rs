//! What the provider responds to `POST /v1/charges` (the first two bytes pick the status): a body
//! that names a member twice is uncertain whatever the status; otherwise only 401, 403 and 429 are
//! "not sent" (a resend), every 5xx is uncertain, and "charged" needs a 2xx showing exactly that
//! succeeded charge.

#![no_main]
use libfuzzer_sys::fuzz_target;
use oncepay_domain::strict_json::{self, StrictJsonError};
use oncepay_provider::{SendOutcome, UncertainReason};

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let status = 100 + u16::from_le_bytes([data[0], data[1]]) % 900;
    let body = &data[2..];
    let outcome = SendOutcome::from_response(status, None, body);
    if matches!(
        strict_json::parse(body),
        Err(StrictJsonError::RepeatedMember { .. } | StrictJsonError::ReservedMember { .. })
    ) {
        assert_eq!(outcome, SendOutcome::Uncertain(UncertainReason::UnreadableResponse));
        return;
    }
    match outcome {
        SendOutcome::NotSent { .. } => assert!([401, 403, 429].contains(&status)),
        SendOutcome::Charged(charge) => {
            assert!(status == 200 || status == 201);
            assert_eq!(serde_json::from_slice::<oncepay_provider::Charge>(body).unwrap(), charge);
        }
        SendOutcome::Uncertain(UncertainReason::ServerError(s)) => assert_eq!(s, status),
        _ => assert!(!(500..=599).contains(&status)),
    }
});
