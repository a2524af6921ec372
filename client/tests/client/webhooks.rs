//! `verify_webhook` against the reference implementation (the `standardwebhooks` crate, 1.0.1) and
//! against the test vectors the README publishes.

use oncepay_client::webhooks::{VerifyError, WebhookSecret, verify_webhook, verify_webhook_at};
use reqwest::header::{HeaderMap, HeaderValue};
use standardwebhooks::Webhook;
use time::OffsetDateTime;

const README: &str = include_str!("../../README.md");

/// A delivery's headers.
fn headers(id: &str, timestamp: i64, signature: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("webhook-id", HeaderValue::from_str(id).unwrap());
    headers.insert("webhook-timestamp", HeaderValue::from_str(&timestamp.to_string()).unwrap());
    headers.insert("webhook-signature", HeaderValue::from_str(signature).unwrap());
    headers
}

/// A test vector: secret, id, timestamp, body, signature.
type Vector = (&'static str, &'static str, i64, &'static [u8], &'static str);

const VECTORS: [Vector; 2] = [
    (
        "whsec_b25jZXBheSdzIHB1Ymxpc2hlZCB0ZXN0IHNlY3JldCE=",
        "msg_2mYoXpGvH4tS5kRwQ9bE1cLzJ7a",
        1_795_910_400,
        br#"{"hello":"oncepay"}"#,
        "v1,ravuZJ5VObgK9y9J821Ueji0st1AT7dZ1oCya3dTI+s=",
    ),
    (
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1_614_265_330,
        br#"{"test": 2432232314}"#,
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    ),
];

#[test]
fn the_readmes_test_vectors_verify_here_and_in_the_reference() {
    for (secret, id, timestamp, body, signature) in VECTORS {
        for published in [secret, id, &timestamp.to_string(), std::str::from_utf8(body).unwrap(), signature] {
            assert!(README.contains(&format!("`{published}`")), "the README does not show {published}");
        }
        let secrets = [WebhookSecret::parse(secret).unwrap()];
        let at = OffsetDateTime::from_unix_timestamp(timestamp).unwrap();

        assert_eq!(verify_webhook_at(&secrets, &headers(id, timestamp, signature), body, at), Ok(()));
        assert_eq!(Webhook::new(secret).unwrap().sign(id, timestamp, body).unwrap(), signature);
    }
}

#[test]
fn a_delivery_the_reference_signs_now_verifies_and_a_changed_one_does_not() {
    let secret = WebhookSecret::generate();
    let (id, now, body) = ("msg_1", OffsetDateTime::now_utc().unix_timestamp(), br#"{"id":"pay_1"}"#);
    let signature = Webhook::new(&secret).unwrap().sign(id, now, body).unwrap();
    let secrets = [WebhookSecret::parse(&secret).unwrap()];

    assert_eq!(verify_webhook(&secrets, &headers(id, now, &signature), body), Ok(()));
    let changed = br#"{"id":"pay_2"}"#;
    assert_eq!(verify_webhook(&secrets, &headers(id, now, &signature), changed), Err(VerifyError::NoMatch));
    assert_eq!(verify_webhook(&secrets, &headers("msg_2", now, &signature), body), Err(VerifyError::NoMatch));
    let old = now - 10 * 60;
    let signed_then = Webhook::new(&secret).unwrap().sign(id, old, body).unwrap();
    assert_eq!(verify_webhook(&secrets, &headers(id, old, &signed_then), body), Err(VerifyError::OutsideTolerance));
}

#[test]
fn during_a_rotation_either_secret_verifies_and_the_reference_takes_both_signatures() {
    let (old, new) = (WebhookSecret::generate(), WebhookSecret::generate());
    let (id, now, body) = ("msg_1", OffsetDateTime::now_utc().unix_timestamp(), b"{}".as_slice());
    let both = [&old, &new].map(|secret| WebhookSecret::parse(secret).unwrap().sign(id, now, body)).join(" ");
    let headers = headers(id, now, &both);

    // The merchant knows only the new secret, only the old one, or both: each passes.
    for known in [vec![&new], vec![&old], vec![&old, &new]] {
        let secrets: Vec<WebhookSecret> = known.iter().map(|secret| WebhookSecret::parse(secret).unwrap()).collect();
        assert_eq!(verify_webhook(&secrets, &headers, body), Ok(()));
    }
    for secret in [&old, &new] {
        assert!(Webhook::new(secret).unwrap().verify(body, &headers).is_ok(), "the reference refused ours");
    }
    let stranger = [WebhookSecret::parse(&WebhookSecret::generate()).unwrap()];
    assert_eq!(verify_webhook(&stranger, &headers, body), Err(VerifyError::NoMatch));
}

#[test]
fn a_delivery_without_its_headers_or_with_an_empty_signature_is_refused() {
    let secret = WebhookSecret::generate();
    let secrets = [WebhookSecret::parse(&secret).unwrap()];
    let now = OffsetDateTime::now_utc().unix_timestamp();

    assert_eq!(verify_webhook(&secrets, &HeaderMap::new(), b"{}"), Err(VerifyError::MissingHeader("webhook-id")));
    assert_eq!(verify_webhook(&secrets, &headers("msg_1", now, "v1,"), b"{}"), Err(VerifyError::NoMatch));
    assert_eq!(verify_webhook(&secrets, &headers("msg_1", now, "v1"), b"{}"), Err(VerifyError::NoMatch));
}
