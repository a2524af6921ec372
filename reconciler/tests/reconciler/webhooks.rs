//! `POST /webhooks/provider` over real HTTP (the server on port 0) against a real PostgreSQL: every
//! kind of delivery gets the right answer and changes a payment at most once.

use std::net::TcpListener;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::status::PaymentStatus;
use oncepay_http::probes::ProbeState;
use oncepay_provider::wire::{EventType, WebhookEvent};
use oncepay_provider::{Charge, ChargeStatus};
use oncepay_reconciler::http;
use oncepay_reconciler::unknown::Why;
use oncepay_reconciler::unknown::payments as unknown;
use oncepay_reconciler::webhooks::WebhookState;
use oncepay_store::fixtures::{count, tenant};
use oncepay_webhook_signature::WebhookSecret;
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::support::{self, charge, count_for, status, unknown_payment};

fn secret(seed: u8) -> WebhookSecret {
    WebhookSecret::parse(&format!("whsec_{}", STANDARD.encode([seed; 32]))).unwrap()
}

/// The reconciler's HTTP server, on a free port, accepting deliveries signed with `secrets`.
fn start(pool: &PgPool, secrets: Vec<WebhookSecret>) -> String {
    oncepay_service::tls::install_provider();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let webhook = WebhookState {
        pool: pool.clone(),
        secrets,
        stripe_secrets: Vec::new(),
        tolerance_secs: 300,
        max_body_bytes: 65_536,
    };
    let ops = ProbeState { pool: pool.clone(), metrics: oncepay_service::metrics::install() };
    tokio::spawn(http::server(listener, webhook, Some(ops), 1).unwrap());
    format!("http://127.0.0.1:{port}/webhooks/provider")
}

fn event(charge: &Charge) -> Vec<u8> {
    let event_type = match charge.status {
        ChargeStatus::Succeeded => EventType::ChargeSucceeded,
        ChargeStatus::Failed => EventType::ChargeFailed,
    };
    serde_json::to_vec(&WebhookEvent { event_type, created: charge.created, data: charge.clone() }).unwrap()
}

#[derive(Clone)]
struct Delivery {
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
}

impl Delivery {
    fn signed(secret: &WebhookSecret, id: &str, body: Vec<u8>) -> Self {
        let now = OffsetDateTime::now_utc().unix_timestamp();
        Self { id: id.to_owned(), timestamp: now.to_string(), signature: secret.sign(id, now, &body), body }
    }
}

/// Delivers; returns the status and the JSON body.
async fn deliver(url: &str, delivery: &Delivery) -> (u16, Value, Option<String>) {
    let response = reqwest::Client::new()
        .post(url)
        .header("webhook-id", &delivery.id)
        .header("webhook-timestamp", &delivery.timestamp)
        .header("webhook-signature", &delivery.signature)
        .header("content-type", "application/json")
        .body(delivery.body.clone())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body, content_type)
}

/// The server of [`start`] accepting deliveries signed with one secret, and that secret.
struct Endpoint {
    url: String,
    key: WebhookSecret,
}

impl Endpoint {
    fn start(pool: &PgPool) -> Self {
        let key = secret(1);
        Self { url: start(pool, vec![key.clone()]), key }
    }

    async fn deliver(&self, delivery: &Delivery) -> (u16, Value, Option<String>) {
        deliver(&self.url, delivery).await
    }

    /// Delivers the event for `charge` under the delivery id `id`, signed with the endpoint's secret.
    async fn deliver_event(&self, id: &str, charge: &Charge) -> (u16, Value, Option<String>) {
        self.deliver(&Delivery::signed(&self.key, id, event(charge))).await
    }
}

/// A tenant and one payment of `amount` that the worker sent a minute ago and left `unknown`.
async fn one_unknown_payment(pool: &PgPool, amount: i64) -> (TenantId, PaymentId) {
    let tenant_id = tenant(pool, "acme").await;
    (tenant_id, unknown_payment(pool, tenant_id, "order-1", amount, 60).await)
}

async fn transitions_by(pool: &PgPool, payment_id: PaymentId, actor: &str) -> i64 {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM payment_events WHERE payment_id = $1 AND actor = $2"#,
        payment_id.as_uuid(),
        actor
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn ledger_amount(pool: &PgPool, payment_id: PaymentId) -> Option<i64> {
    sqlx::query_scalar!("SELECT amount FROM ledger_entries WHERE payment_id = $1", payment_id.as_uuid())
        .fetch_optional(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_signed_success_settles_an_unknown_payment_with_its_ledger_entry(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool, 1999).await;

    let (code, body, _) =
        hook.deliver_event("msg_1", &charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 1999)).await;

    assert_eq!((code, body), (200, json!({"outcome": "applied"})));
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded);
    assert_eq!(ledger_amount(&pool, payment_id).await, Some(1999));
    assert_eq!(count_for(&pool, "unknown_payments", payment_id).await, 0);
    assert_eq!(count_for(&pool, "webhook_events", payment_id).await, 1);
    assert_eq!(transitions_by(&pool, payment_id, "webhook").await, 1);
    let stored: Option<Value> =
        sqlx::query_scalar!("SELECT response_body FROM idempotency_keys WHERE payment_id = $1", payment_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored.unwrap()["status"], "succeeded");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_signed_decline_settles_an_unknown_payment_as_failed_with_the_providers_code(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool, 1999).await;

    let (code, body, _) =
        hook.deliver_event("msg_1", &charge(tenant_id, payment_id, "ch_1", ChargeStatus::Failed, 1999)).await;

    assert_eq!((code, body), (200, json!({"outcome": "applied"})));
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Failed);
    let failure: String = sqlx::query_scalar!(
        r#"SELECT failure_code AS "failure_code!" FROM payments WHERE payment_id = $1"#,
        payment_id.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(failure, "card_declined");
    assert_eq!(ledger_amount(&pool, payment_id).await, None);
    assert_eq!(count_for(&pool, "unknown_payments", payment_id).await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn every_delivery_that_does_not_verify_is_401_and_changes_nothing(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool, 1999).await;
    let body = event(&charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 1999));
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let good = Delivery::signed(&hook.key, "msg_1", body.clone());
    let at = |ts: i64| Delivery {
        id: "msg_1".into(),
        timestamp: ts.to_string(),
        signature: hook.key.sign("msg_1", ts, &body),
        body: body.clone(),
    };
    let mut tampered_body = body.clone();
    tampered_body[body.len() - 2] ^= 1;
    let cases = [
        ("tampered body", Delivery { body: tampered_body, ..good.clone() }),
        ("wrong secret", Delivery::signed(&secret(9), "msg_1", body.clone())),
        ("empty signature", Delivery { signature: String::new(), ..good.clone() }),
        (
            "truncated signature",
            Delivery { signature: good.signature[..good.signature.len() - 6].to_owned(), ..good.clone() },
        ),
        ("unknown scheme only", Delivery { signature: good.signature.replacen("v1,", "v1a,", 1), ..good.clone() }),
        ("signed for another id", Delivery { id: "msg_2".into(), ..good.clone() }),
        // Far outside the 300 s tolerance, so the seconds a loaded machine takes to run the cases
        // cannot carry them back inside it; the exact boundary is pinned by shared's unit tests.
        ("stale timestamp", at(now - 900)),
        ("future timestamp", at(now + 900)),
        ("timestamp not a number", Delivery { timestamp: "soon".into(), ..good.clone() }),
    ];

    for (name, delivery) in &cases {
        let (code, problem, content_type) = hook.deliver(delivery).await;
        assert_eq!(code, 401, "{name}");
        assert_eq!(content_type.as_deref(), Some("application/problem+json"), "{name}");
        assert_eq!(problem["type"], "https://oncepay.dev/problems/invalid-signature", "{name}");
    }

    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Unknown);
    assert_eq!(count(&pool, "webhook_events").await, 0);
    let (code, _, _) = hook.deliver(&good).await;
    assert_eq!(code, 200, "the genuine delivery still works afterwards");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn deliveries_signed_with_the_old_or_the_new_secret_are_accepted_during_a_rotation(pool: PgPool) {
    let (old, new) = (secret(1), secret(2));
    let url = start(&pool, vec![new.clone(), old.clone()]);
    let tenant_id = tenant(&pool, "acme").await;
    let by_old = unknown_payment(&pool, tenant_id, "order-1", 100, 60).await;
    let by_new = unknown_payment(&pool, tenant_id, "order-2", 200, 60).await;
    let by_both = unknown_payment(&pool, tenant_id, "order-3", 300, 60).await;
    let both_body = event(&charge(tenant_id, by_both, "ch_3", ChargeStatus::Succeeded, 300));
    let both = Delivery::signed(&secret(7), "msg_3", both_body.clone());
    let both = Delivery {
        signature: format!(
            "{} {}",
            secret(7).sign("msg_3", both.timestamp.parse().unwrap(), &both_body),
            old.sign("msg_3", both.timestamp.parse().unwrap(), &both_body)
        ),
        ..both
    };

    let (a, _, _) = deliver(
        &url,
        &Delivery::signed(&old, "msg_1", event(&charge(tenant_id, by_old, "ch_1", ChargeStatus::Succeeded, 100))),
    )
    .await;
    let (b, _, _) = deliver(
        &url,
        &Delivery::signed(&new, "msg_2", event(&charge(tenant_id, by_new, "ch_2", ChargeStatus::Succeeded, 200))),
    )
    .await;
    let (c, _, _) = deliver(&url, &both).await;

    assert_eq!((a, b, c), (200, 200, 200));
    for payment_id in [by_old, by_new, by_both] {
        assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded);
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn the_same_event_delivered_ten_times_at_once_changes_the_payment_once(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool, 1999).await;
    let body = event(&charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 1999));
    let deliveries: Vec<Delivery> = (0..10).map(|_| Delivery::signed(&hook.key, "msg_1", body.clone())).collect();

    let answers = futures::future::join_all(deliveries.iter().map(|d| hook.deliver(d))).await;

    let mut outcomes: Vec<(u16, String)> =
        answers.into_iter().map(|(code, body, _)| (code, body["outcome"].as_str().unwrap().to_owned())).collect();
    outcomes.sort();
    let mut expected = vec![(200, "applied".to_owned())];
    expected.extend(std::iter::repeat_n((200, "duplicate".to_owned()), 9));
    expected.sort();
    assert_eq!(outcomes, expected);
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded);
    assert_eq!(transitions_by(&pool, payment_id, "webhook").await, 1);
    assert_eq!(count(&pool, "ledger_entries").await, 1);
    assert_eq!(count(&pool, "webhook_events").await, 1);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn events_arriving_out_of_order_settle_each_payment_once_and_a_late_older_event_changes_nothing(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let tenant_id = tenant(&pool, "acme").await;
    let first = unknown_payment(&pool, tenant_id, "order-1", 100, 60).await;
    let second = unknown_payment(&pool, tenant_id, "order-2", 200, 60).await;
    let mut first_charge = charge(tenant_id, first, "ch_1", ChargeStatus::Succeeded, 100);
    first_charge.created -= 30;
    let second_charge = charge(tenant_id, second, "ch_2", ChargeStatus::Failed, 200);
    // The provider's first attempt at delivering the first event, signed earlier, arrives last.
    let mut stale_first = Delivery::signed(&hook.key, "msg_1_retry_of_older", event(&first_charge));
    let earlier = OffsetDateTime::now_utc().unix_timestamp() - 120;
    stale_first.timestamp = earlier.to_string();
    stale_first.signature = hook.key.sign(&stale_first.id, earlier, &stale_first.body);

    let (_, newer, _) = hook.deliver_event("msg_2", &second_charge).await;
    let (_, older, _) = hook.deliver_event("msg_1", &first_charge).await;
    let (code, late, _) = hook.deliver(&stale_first).await;

    assert_eq!(newer["outcome"], "applied");
    assert_eq!(older["outcome"], "applied");
    assert_eq!((code, late["outcome"].as_str()), (200, Some("already_terminal")));
    assert_eq!(status(&pool, tenant_id, first).await, PaymentStatus::Succeeded);
    assert_eq!(status(&pool, tenant_id, second).await, PaymentStatus::Failed);
    assert_eq!(transitions_by(&pool, first, "webhook").await, 1);
    assert_eq!(transitions_by(&pool, second, "webhook").await, 1);
    assert_eq!(count(&pool, "dead_letters").await, 0);
}

async fn open_conflicts(pool: &PgPool, payment_id: PaymentId) -> Vec<(String, i64)> {
    sqlx::query!(
        r#"SELECT kind, jsonb_array_length(evidence)::bigint AS "evidence!" FROM dead_letters
           WHERE payment_id = $1 AND resolved_at IS NULL"#,
        payment_id.as_uuid()
    )
    .map(|row| (row.kind, row.evidence))
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn evidence_contradicting_a_terminal_payment_opens_one_conflict_and_keeps_the_state(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let tenant_id = tenant(&pool, "acme").await;
    let declined = unknown_payment(&pool, tenant_id, "order-1", 100, 60).await;
    let charged = unknown_payment(&pool, tenant_id, "order-2", 200, 60).await;
    hook.deliver_event("d_1", &charge(tenant_id, declined, "ch_1", ChargeStatus::Failed, 100)).await;
    hook.deliver_event("c_1", &charge(tenant_id, charged, "ch_2", ChargeStatus::Succeeded, 200)).await;

    // A success after a recorded decline; then the same charge again under another delivery id.
    let (_, success_after_decline, _) =
        hook.deliver_event("d_2", &charge(tenant_id, declined, "ch_1", ChargeStatus::Succeeded, 100)).await;
    let (_, again, _) =
        hook.deliver_event("d_3", &charge(tenant_id, declined, "ch_1", ChargeStatus::Succeeded, 100)).await;
    // A decline after a recorded success, a second successful charge, another amount.
    let (_, decline_after_success, _) =
        hook.deliver_event("c_2", &charge(tenant_id, charged, "ch_2", ChargeStatus::Failed, 200)).await;
    let (_, second_charge, _) =
        hook.deliver_event("c_3", &charge(tenant_id, charged, "ch_9", ChargeStatus::Succeeded, 200)).await;
    let (_, other_amount, _) =
        hook.deliver_event("c_4", &charge(tenant_id, charged, "ch_2", ChargeStatus::Succeeded, 150)).await;
    // And one that agrees.
    let (_, agreeing, _) =
        hook.deliver_event("c_5", &charge(tenant_id, charged, "ch_2", ChargeStatus::Succeeded, 200)).await;

    for answer in [&success_after_decline, &again, &decline_after_success, &second_charge, &other_amount] {
        assert_eq!(answer["outcome"], "conflict");
    }
    assert_eq!(agreeing["outcome"], "already_terminal");
    assert_eq!(status(&pool, tenant_id, declined).await, PaymentStatus::Failed);
    assert_eq!(status(&pool, tenant_id, charged).await, PaymentStatus::Succeeded);
    assert_eq!(open_conflicts(&pool, declined).await, vec![("conflict".to_owned(), 2)]);
    assert_eq!(open_conflicts(&pool, charged).await, vec![("conflict".to_owned(), 3)]);
    assert_eq!(ledger_amount(&pool, charged).await, Some(200));
    assert_eq!(ledger_amount(&pool, declined).await, None);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_verified_body_that_is_not_a_consistent_charge_event_is_400(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool, 100).await;
    let mut mismatched: Value =
        serde_json::from_slice(&event(&charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 100))).unwrap();
    mismatched["type"] = json!("charge.failed");

    for (name, body) in [
        ("not json", b"{not json".to_vec()),
        ("not an event", br#"{"type":"charge.refunded","created":1,"data":{}}"#.to_vec()),
        ("type and status disagree", serde_json::to_vec(&mismatched).unwrap()),
    ] {
        let (code, problem, _) = hook.deliver(&Delivery::signed(&hook.key, "msg_1", body)).await;
        assert_eq!(code, 400, "{name}");
        assert_eq!(problem["type"], "https://oncepay.dev/problems/invalid-webhook", "{name}");
    }
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Unknown);
    assert_eq!(count(&pool, "webhook_events").await, 0);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_signed_body_that_names_a_member_twice_is_400_after_its_signature_and_changes_nothing(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool, 100).await;
    let genuine = event(&charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 100));
    let text = String::from_utf8(genuine.clone()).unwrap();
    let ours = format!(r#""{}":"{payment_id}""#, oncepay_provider::metadata_keys::PAYMENT_ID);
    let other = format!(r#""{}":"{}""#, oncepay_provider::metadata_keys::PAYMENT_ID, PaymentId::generate());
    let cases = [
        // A reader that keeps the first sees a charge for another payment.
        ("two payments", text.replace(&ours, &format!("{other},{ours}"))),
        ("a member nobody reads, twice", text.replacen('{', r#"{"livemode":false,"livemode":true,"#, 1)),
    ];

    for (name, body) in cases {
        assert_ne!(body, text, "{name}");
        let forged = Delivery::signed(&secret(9), "msg_1", body.clone().into_bytes());
        let (forged_code, _, _) = hook.deliver(&forged).await;
        let (code, problem, _) = hook.deliver(&Delivery::signed(&hook.key, "msg_1", body.into_bytes())).await;

        assert_eq!(forged_code, 401, "{name}: the signature is checked first");
        assert_eq!(code, 400, "{name}: {problem}");
        assert_eq!(problem["type"], "https://oncepay.dev/problems/invalid-webhook", "{name}");
        assert!(problem["detail"].as_str().unwrap().contains("more than once"), "{name}: {problem}");
    }
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Unknown);
    assert_eq!(count(&pool, "webhook_events").await, 0);
    // The refused deliveries left no trace: the genuine event under the same id is applied.
    let (code, body, _) = hook.deliver(&Delivery::signed(&hook.key, "msg_1", genuine)).await;
    assert_eq!((code, body), (200, json!({"outcome": "applied"})));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_payment_still_being_sent_is_only_recorded_and_a_dead_lettered_one_gains_evidence(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let tenant_id = tenant(&pool, "acme").await;
    let processing = support::accept(&pool, tenant_id, "order-1", 100).await;
    support::claim(&pool, tenant_id, processing, 5).await;
    let dead = unknown_payment(&pool, tenant_id, "order-2", 200, 60).await;
    let mut tx = pool.begin().await.unwrap();
    let why = Why { actor: "test", reason: "attempts spent" };
    unknown::exhaust(&mut tx, tenant_id, dead, why, json!({"source": "test"})).await.unwrap();
    tx.commit().await.unwrap();

    let (_, sending, _) =
        hook.deliver_event("msg_1", &charge(tenant_id, processing, "ch_1", ChargeStatus::Succeeded, 100)).await;
    let (_, dead_lettered, _) =
        hook.deliver_event("msg_2", &charge(tenant_id, dead, "ch_2", ChargeStatus::Succeeded, 200)).await;

    assert_eq!(sending["outcome"], "not_unknown");
    assert_eq!(status(&pool, tenant_id, processing).await, PaymentStatus::Processing);
    assert_eq!(count_for(&pool, "webhook_events", processing).await, 1);
    assert_eq!(dead_lettered["outcome"], "dead_lettered");
    assert_eq!(status(&pool, tenant_id, dead).await, PaymentStatus::DeadLettered);
    let evidence: Value =
        sqlx::query_scalar!("SELECT evidence FROM dead_letters WHERE payment_id = $1", dead.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    let last = evidence.as_array().unwrap().last().unwrap();
    assert_eq!((last["source"].as_str(), last["charge"]["id"].as_str()), (Some("webhook"), Some("ch_2")));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_charge_without_metadata_is_found_by_its_key_and_a_foreign_charge_is_acknowledged(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool, 100).await;
    let mut bare = charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 100);
    bare.metadata.clear();
    let mut foreign = charge(TenantId::generate(), PaymentId::generate(), "ch_x", ChargeStatus::Succeeded, 5);
    foreign.metadata.clear();
    foreign.idempotency_key = "somebody-elses-key".into();

    let (_, by_key, _) = hook.deliver_event("msg_1", &bare).await;
    let (code, not_ours, _) = hook.deliver_event("msg_2", &foreign).await;

    assert_eq!(by_key["outcome"], "applied");
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded);
    assert_eq!((code, not_ours["outcome"].as_str()), (200, Some("not_ours")));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn other_methods_and_paths_answer_problems(pool: PgPool) {
    let url = start(&pool, vec![secret(1)]);

    let get = reqwest::get(&url).await.unwrap();
    let elsewhere = reqwest::get(url.replace("/webhooks/provider", "/nothing")).await.unwrap();
    let health = reqwest::get(url.replace("/webhooks/provider", "/healthz")).await.unwrap();

    assert_eq!(get.status().as_u16(), 405);
    assert_eq!(get.headers()["allow"], "POST");
    assert_eq!(elsewhere.status().as_u16(), 404);
    assert_eq!(elsewhere.headers()["content-type"], "application/problem+json");
    assert_eq!(health.status().as_u16(), 200);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_signed_charge_other_than_the_one_asked_for_dead_letters_the_payment_for_an_operator(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let tenant_id = tenant(&pool, "acme").await;
    type Change = fn(&mut Charge);
    let cases: [(&str, Change); 3] = [
        ("another amount", |c| c.amount = 1500),
        ("another currency", |c| c.currency = "USD".into()),
        ("another payment's key", |c| c.idempotency_key = PaymentId::generate().downstream_key().to_string()),
    ];
    for (i, (name, change)) in cases.into_iter().enumerate() {
        let payment_id = unknown_payment(&pool, tenant_id, &format!("order-{i}"), 1999, 60).await;
        let mut other = charge(tenant_id, payment_id, &format!("ch_{i}"), ChargeStatus::Succeeded, 1999);
        change(&mut other);

        let (code, body, _) = hook.deliver_event(&format!("msg_{i}"), &other).await;

        assert_eq!((code, body), (200, json!({"outcome": "conflict"})), "{name}");
        assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::DeadLettered, "{name}");
        assert_eq!(ledger_amount(&pool, payment_id).await, None, "{name}");
        let kinds: Vec<String> = open_conflicts(&pool, payment_id).await.into_iter().map(|(kind, _)| kind).collect();
        assert_eq!(kinds, ["conflict"], "{name}");
    }
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_signed_charge_the_ledger_cannot_book_is_kept_as_evidence_and_counts_as_a_lookup(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool, 1999).await;
    let mut spoilt = charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 1999);
    spoilt.amount = -5;

    let first = hook.deliver_event("msg_1", &spoilt).await;
    let again = hook.deliver_event("msg_1", &spoilt).await;

    assert_eq!((first.0, first.1), (200, json!({"outcome": "unbookable"})));
    assert_eq!((again.0, again.1), (200, json!({"outcome": "duplicate"})));
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Unknown);
    let (attempts, evidence) = support::queue_entry(&pool, payment_id).await;
    assert_eq!(attempts, 1, "it counts toward dead-lettering");
    assert!(evidence.to_string().contains("cannot be booked"), "{evidence}");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_report_the_ledger_cannot_read_about_a_final_payment_is_no_conflict(pool: PgPool) {
    let hook = Endpoint::start(&pool);
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = unknown_payment(&pool, tenant_id, "order-1", 1999, 60).await;
    let settled = charge(tenant_id, payment_id, "ch_1", ChargeStatus::Succeeded, 1999);
    let mut misreported = settled.clone();
    misreported.currency = misreported.currency.to_lowercase();
    assert_eq!(hook.deliver_event("msg_1", &settled).await.1, json!({"outcome": "applied"}));

    let (code, body, _) = hook.deliver_event("msg_2", &misreported).await;

    assert_eq!((code, body), (200, json!({"outcome": "unbookable"})));
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded);
    assert!(open_conflicts(&pool, payment_id).await.is_empty(), "an unreadable report contradicts nothing");
}
