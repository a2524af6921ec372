//! One test per provider answer: each lands the payment in the right state, with the right retry
//! behaviour, against a real PostgreSQL and a wiremock provider.

use std::time::Duration;

use oncepay_domain::status::PaymentStatus;
use oncepay_service::backoff::Backoff;
use oncepay_worker::Counts;
use serde_json::json;
use sqlx::PgPool;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{self, Accepted, Charges, accept, config, drainer, tenant};

async fn one_payment(pool: &PgPool) -> Accepted {
    let tenant_id = tenant(pool).await;
    accept(pool, tenant_id, 1999).await
}

async fn answering(template: ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/v1/charges")).respond_with(template).mount(&server).await;
    server
}

/// The payment is `unknown`, queued for the reconciler with `reason`, out of the outbox, and a
/// second drain does not send it again.
async fn assert_unknown_and_never_resent(
    pool: &PgPool,
    accepted: Accepted,
    reason: &str,
    drain_again: impl AsyncFnOnce() -> Counts,
    requests_so_far: impl AsyncFnOnce() -> usize,
) {
    let payment = support::payment(pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Unknown);
    assert_eq!(payment.send_attempts, 1);
    let (queued_reason, evidence) = support::unknown_entry(pool, accepted).await.expect("queued for the reconciler");
    assert_eq!(queued_reason, reason);
    assert_eq!(evidence.as_array().map(Vec::len), Some(1), "{evidence}");
    assert_eq!(evidence[0]["reason"], reason);
    assert_eq!(evidence[0]["source"], "worker:w1");
    assert!(support::outbox_row(pool, accepted).await.is_none());
    assert!(support::ledger_entry(pool, accepted).await.is_none());
    assert!(support::stored_response(pool, accepted).await.is_none(), "unknown is not terminal");
    let last = support::events(pool, accepted).await.pop().unwrap();
    assert_eq!(
        (last.0, last.1, last.2.as_str()),
        (Some(PaymentStatus::Processing), PaymentStatus::Unknown, "worker:w1")
    );

    let again = drain_again().await;

    assert_eq!(again, Counts::default(), "an unknown payment is never claimed again by a worker");
    assert_eq!(requests_so_far().await, 1);
    assert_eq!(support::status(pool, accepted).await, PaymentStatus::Unknown);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_201_settles_succeeded_with_the_ledger_entry_and_the_stored_response(pool: PgPool) {
    let server = MockServer::start().await;
    let charges = Charges::new();
    charges.mount(&server).await;
    let accepted = one_payment(&pool).await;

    let counts = drainer(&pool, &server.uri(), config("w1")).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, succeeded: 1, ..Counts::default() });
    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Succeeded);
    assert_eq!(payment.send_attempts, 1);
    let charge_id = payment.provider_charge_id.clone().unwrap();
    assert_eq!(support::ledger_entry(&pool, accepted).await, Some((charge_id.clone(), 1999, "EUR".to_owned())));
    let (status, body) = support::stored_response(&pool, accepted).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["status"], "succeeded");
    assert_eq!(body["provider_charge_id"], charge_id.as_str());
    assert!(support::outbox_row(&pool, accepted).await.is_none());
    let events: Vec<_> = support::events(&pool, accepted).await.into_iter().map(|e| (e.0, e.1, e.2)).collect();
    assert_eq!(
        events,
        [
            (None, PaymentStatus::Pending, "api".to_owned()),
            (Some(PaymentStatus::Pending), PaymentStatus::Processing, "worker:w1".to_owned()),
            (Some(PaymentStatus::Processing), PaymentStatus::Succeeded, "worker:w1".to_owned()),
        ]
    );
    // The provider saw the payment under its derived key, with what the client asked for.
    let requests = support::requests_for(&server, accepted).await;
    assert_eq!(requests.len(), 1);
    let sent: serde_json::Value = requests[0].body_json().unwrap();
    assert_eq!(sent["amount"], 1999);
    assert_eq!(sent["currency"], "EUR");
    assert_eq!(sent["metadata"]["oncepay_payment_id"], accepted.payment_id.to_string());
    assert_eq!(sent["metadata"]["order"], "42");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_402_settles_failed_with_the_providers_code_and_no_ledger_entry(pool: PgPool) {
    let server = answering(ResponseTemplate::new(402).set_body_json(json!({
        "error": {"code": "card_declined", "message": "Your card was declined.", "charge": "ch_declined_1"}
    })))
    .await;
    let accepted = one_payment(&pool).await;

    let counts = drainer(&pool, &server.uri(), config("w1")).run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, failed: 1, ..Counts::default() });
    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Failed);
    assert_eq!(payment.failure_code.as_deref(), Some("card_declined"));
    assert_eq!(payment.failure_message.as_deref(), Some("Your card was declined."));
    assert_eq!(payment.provider_charge_id.as_deref(), Some("ch_declined_1"));
    assert!(support::ledger_entry(&pool, accepted).await.is_none());
    let (_, body) = support::stored_response(&pool, accepted).await.unwrap();
    assert_eq!(body["failure"], json!({"code": "card_declined", "message": "Your card was declined."}));
    assert!(support::outbox_row(&pool, accepted).await.is_none());
}

/// One payment sent to a provider that answers `template`: asserts it ends `unknown` with `reason`
/// and is never resent, and returns it with the first drain's counts.
async fn answered_into_unknown(pool: &PgPool, template: ResponseTemplate, reason: &str) -> (Accepted, Counts) {
    let server = answering(template).await;
    let accepted = one_payment(pool).await;
    let drainer = drainer(pool, &server.uri(), config("w1"));

    let counts = drainer.run_once().await.unwrap();

    assert_unknown_and_never_resent(
        pool,
        accepted,
        reason,
        async || drainer.run_once().await.unwrap(),
        async || server.received_requests().await.unwrap().len(),
    )
    .await;
    (accepted, counts)
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_409_key_in_flight_is_unknown_and_never_resent(pool: PgPool) {
    let (_, counts) = answered_into_unknown(&pool, ResponseTemplate::new(409), "key_in_flight").await;

    assert_eq!(counts, Counts { claimed: 1, unknown: 1, ..Counts::default() });
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_422_key_reused_is_unknown_and_never_resent(pool: PgPool) {
    answered_into_unknown(&pool, ResponseTemplate::new(422), "key_reused").await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_500_is_unknown_and_never_resent(pool: PgPool) {
    let (accepted, _) = answered_into_unknown(&pool, ResponseTemplate::new(500), "server_error").await;

    let (_, evidence) = support::unknown_entry(&pool, accepted).await.unwrap();
    assert!(evidence[0]["detail"].as_str().unwrap().contains("500"), "{evidence}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_answer_later_than_the_timeout_is_unknown_and_never_resent(pool: PgPool) {
    // The provider charges but answers only after the client's 1 s timeout.
    let server = MockServer::start().await;
    let charges = Charges::with_delay(Duration::from_secs(3));
    charges.mount(&server).await;
    let accepted = one_payment(&pool).await;
    let drainer = drainer(&pool, &server.uri(), config("w1"));

    drainer.run_once().await.unwrap();

    assert_unknown_and_never_resent(
        &pool,
        accepted,
        "timeout",
        async || drainer.run_once().await.unwrap(),
        async || charges.requests().values().sum::<u32>() as usize,
    )
    .await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_connection_reset_after_the_request_was_read_is_unknown_and_never_resent(pool: PgPool) {
    // A provider that reads the whole request, then resets the connection without a word.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = connections.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            // Read up to the end of the JSON body, which closes with `}`.
            while !request.ends_with(b"}") {
                let read = socket.read(&mut buffer).await.unwrap();
                if read == 0 {
                    break;
                }
                request.extend_from_slice(&buffer[..read]);
            }
            // Linger zero: closing sends a reset, not an orderly end of stream.
            socket.set_zero_linger().unwrap();
            drop(socket);
        }
    });
    let accepted = one_payment(&pool).await;
    let drainer = drainer(&pool, &url, config("w1"));

    drainer.run_once().await.unwrap();

    assert_unknown_and_never_resent(
        &pool,
        accepted,
        "connection_lost",
        async || drainer.run_once().await.unwrap(),
        async || connections.load(std::sync::atomic::Ordering::SeqCst),
    )
    .await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refused_connection_puts_the_payment_back_to_pending_with_backoff_and_a_counted_attempt(pool: PgPool) {
    let accepted = one_payment(&pool).await;
    let queued_at = support::outbox_row(&pool, accepted).await.unwrap().available_at;
    let mut config = config("w1");
    config.backoff = Backoff { base: Duration::from_secs(60), max: Duration::from_secs(60) };
    let drainer = drainer(&pool, &support::refusing_url(), config);
    let before = support::db_now(&pool).await;

    let counts = drainer.run_once().await.unwrap();

    assert_eq!(counts, Counts { claimed: 1, retried: 1, ..Counts::default() });
    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Pending);
    assert_eq!(payment.send_attempts, 1);
    let row = support::outbox_row(&pool, accepted).await.unwrap();
    assert_eq!(row.attempts, 1);
    assert_eq!((row.locked_by, row.locked_until, row.fencing_token), (None, None, None), "the lease is released");
    assert!(row.available_at > queued_at, "available_at moved forward");
    assert!(row.available_at >= before, "{} < {before}", row.available_at);
    assert!(row.available_at <= support::db_now(&pool).await + Duration::from_secs(60), "within the backoff ceiling");
    let last = support::events(&pool, accepted).await.pop().unwrap();
    assert_eq!((last.0, last.1), (Some(PaymentStatus::Processing), PaymentStatus::Pending));
    assert!(last.3.starts_with("not sent (could not connect to the provider); attempt 1 of 3"), "{}", last.3);
    assert!(support::unknown_entry(&pool, accepted).await.is_none());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_provider_unreachable_for_every_attempt_fails_the_payment_saying_no_charge_was_made(pool: PgPool) {
    let accepted = one_payment(&pool).await;
    // Three attempts, no backoff: each retry is due at once.
    let drainer = drainer(&pool, &support::refusing_url(), config("w1"));

    let mut rounds = Vec::new();
    for _ in 0..3 {
        rounds.push(drainer.run_once().await.unwrap());
    }
    let after = drainer.run_once().await.unwrap();

    let retried = Counts { claimed: 1, retried: 1, ..Counts::default() };
    assert_eq!(rounds, [retried, retried, Counts { claimed: 1, failed: 1, ..Counts::default() }]);
    assert_eq!(after, Counts::default());
    let payment = support::payment(&pool, accepted).await;
    assert_eq!(payment.status, PaymentStatus::Failed);
    assert_eq!(payment.send_attempts, 3);
    assert_eq!(payment.failure_code.as_deref(), Some("provider_unreachable"));
    assert!(payment.failure_message.as_deref().unwrap().contains("no charge was made"), "{payment:?}");
    assert!(support::outbox_row(&pool, accepted).await.is_none());
    assert!(support::ledger_entry(&pool, accepted).await.is_none());
    let (_, body) = support::stored_response(&pool, accepted).await.unwrap();
    assert_eq!(body["failure"]["code"], "provider_unreachable");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_429_waits_at_least_the_providers_retry_after_before_the_next_claim(pool: PgPool) {
    let server = answering(ResponseTemplate::new(429).insert_header("Retry-After", "120")).await;
    let accepted = one_payment(&pool).await;
    let drainer = drainer(&pool, &server.uri(), config("w1"));
    let before = support::db_now(&pool).await;

    let first = drainer.run_once().await.unwrap();
    let second = drainer.run_once().await.unwrap();

    assert_eq!(first, Counts { claimed: 1, retried: 1, ..Counts::default() });
    assert_eq!(second, Counts::default(), "not claimable before the Retry-After has passed");
    let row = support::outbox_row(&pool, accepted).await.unwrap();
    assert!(row.available_at >= before + Duration::from_secs(120), "{} vs {before}", row.available_at);
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Pending);
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_recorded_payment_is_announced_to_long_polls_after_its_commit(pool: PgPool) {
    let server = MockServer::start().await;
    Charges::new().mount(&server).await;
    let accepted = one_payment(&pool).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await.unwrap();
    listener.listen(oncepay_store::notify::PAYMENT_CHANNEL).await.unwrap();

    drainer(&pool, &server.uri(), config("w1")).run_once().await.unwrap();

    // The recording no longer notifies in its transaction: this notification is the announcement.
    let notification = tokio::time::timeout(Duration::from_secs(10), listener.recv()).await.unwrap().unwrap();
    let named: Vec<_> = oncepay_store::notify::named_ids::<oncepay_domain::ids::PaymentId>(notification.payload())
        .map(Result::unwrap)
        .collect();
    assert_eq!(named, [accepted.payment_id]);
    assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Succeeded);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_201_for_a_charge_other_than_the_one_asked_for_is_never_booked(pool: PgPool) {
    type Change = fn(&mut serde_json::Value);
    let cases: [(&str, Change); 3] = [
        ("another amount", |charge| charge["amount"] = json!(1998)),
        ("another currency", |charge| charge["currency"] = json!("USD")),
        ("another payment's key", |charge| {
            charge["idempotency_key"] = json!(oncepay_domain::ids::PaymentId::generate().downstream_key().as_str());
        }),
    ];
    for (name, change) in cases {
        let accepted = one_payment(&pool).await;
        let mut charge = json!({
            "id": format!("ch_{}", &accepted.payment_id.to_string()[..8]), "status": "succeeded", "amount": 1999,
            "currency": "EUR", "customer": "cus_1", "created": 1_763_800_000,
            "idempotency_key": accepted.payment_id.downstream_key().as_str(),
        });
        change(&mut charge);
        let server = answering(ResponseTemplate::new(201).set_body_json(charge)).await;

        drainer(&pool, &server.uri(), config("w1")).run_once().await.unwrap();

        assert_eq!(support::status(&pool, accepted).await, PaymentStatus::Unknown, "{name}");
        assert!(support::ledger_entry(&pool, accepted).await.is_none(), "{name}");
        assert_eq!(support::unknown_entry(&pool, accepted).await.unwrap().0, "charge_mismatch", "{name}");
    }
}
