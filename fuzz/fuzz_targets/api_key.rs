//! A bearer token: only `opk_` followed by 75 base64url characters can parse.

#![no_main]
use libfuzzer_sys::fuzz_target;
use oncepay_domain::api_key;

fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else { return };
    if api_key::parse(token).is_some() {
        let encoded = token.strip_prefix(api_key::PREFIX).unwrap();
        assert_eq!(encoded.len(), 75);
        assert!(encoded.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    }
});
