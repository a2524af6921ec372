//! `POST /webhooks/stripe` over real HTTP (the server on port 0) against a real PostgreSQL: Stripe's
//! signed PaymentIntent events settle `unknown` payments by the same rules as the simulator's webhooks,
//! once per event, and nothing else changes a payment.

use std::net::TcpListener;

use oncepay_domain::ids::{PaymentId, TenantId};
use oncepay_domain::status::PaymentStatus;
use oncepay_provider::stripe::signature::StripeWebhookSecret;
use oncepay_reconciler::http;
use oncepay_reconciler::webhooks::WebhookState;
use oncepay_store::fixtures::tenant;
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::support::{self, status, unknown_payment};

const SECRET: &str = "whsec_test_stripe_endpoint_secret_1";

/// The reconciler's HTTP server on a free port, with one Stripe endpoint secret.
fn start(pool: &PgPool) -> String {
    oncepay_service::tls::install_provider();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let webhook = WebhookState {
        pool: pool.clone(),
        secrets: Vec::new(),
        stripe_secrets: vec![StripeWebhookSecret::parse(SECRET).unwrap()],
        tolerance_secs: 300,
        max_body_bytes: 65_536,
    };
    tokio::spawn(http::server(listener, webhook, None, 1).unwrap());
    format!("http://127.0.0.1:{port}/webhooks/stripe")
}

/// A Stripe event of `event_type` about a PaymentIntent in `status` made for the payment.
fn event(id: &str, event_type: &str, status: &str, tenant_id: TenantId, payment_id: PaymentId, amount: i64) -> Vec<u8> {
    let succeeded = status == "succeeded";
    let failed = status == "requires_payment_method";
    serde_json::to_vec(&json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": OffsetDateTime::now_utc().unix_timestamp(),
        "type": event_type,
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null},
        "data": {"object": {
            "id": "pi_3QwJ", "object": "payment_intent", "amount": amount,
            "amount_received": if succeeded { amount } else { 0 },
            "created": OffsetDateTime::now_utc().unix_timestamp(), "currency": "eur", "status": status,
            "latest_charge": if succeeded { json!("ch_3QwJ") } else { Value::Null },
            "last_payment_error": if failed {
                json!({"type": "card_error", "code": "card_declined", "decline_code": "insufficient_funds",
                       "message": "Your card has insufficient funds."})
            } else { Value::Null },
            "payment_method": "pm_card_visa",
            "metadata": {"oncepay_payment_id": payment_id.to_string(), "oncepay_tenant_id": tenant_id.to_string()}
        }}
    }))
    .unwrap()
}

async fn deliver(url: &str, signature: &str, body: Vec<u8>) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(url)
        .header("stripe-signature", signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
}

fn signed(body: &[u8]) -> String {
    StripeWebhookSecret::parse(SECRET).unwrap().sign(OffsetDateTime::now_utc().unix_timestamp(), body)
}

async fn one_unknown_payment(pool: &PgPool) -> (TenantId, PaymentId) {
    let tenant_id = tenant(pool, "acme").await;
    (tenant_id, unknown_payment(pool, tenant_id, "order-1", 1999, 60).await)
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_succeeded_intent_settles_an_unknown_payment_once(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool).await;
    let body = event("evt_1", "payment_intent.succeeded", "succeeded", tenant_id, payment_id, 1999);

    let first = deliver(&url, &signed(&body), body.clone()).await;
    let again = deliver(&url, &signed(&body), body).await;

    assert_eq!(first, (200, json!({"outcome": "applied"})));
    assert_eq!(again, (200, json!({"outcome": "duplicate"})));
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded);
    assert_eq!(support::ledger_entry(&pool, payment_id).await, ("pi_3QwJ".into(), 1999));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_failed_intent_fails_an_unknown_payment_with_the_decline_code(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool).await;
    let body = event("evt_2", "payment_intent.payment_failed", "requires_payment_method", tenant_id, payment_id, 1999);

    let (code, _) = deliver(&url, &signed(&body), body).await;

    assert_eq!(code, 200);
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Failed);
    let failure: Option<String> =
        sqlx::query_scalar!("SELECT failure_code FROM payments WHERE payment_id = $1", payment_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(failure.as_deref(), Some("insufficient_funds"));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_intent_for_other_money_is_a_conflict_not_a_success(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool).await;
    let body = event("evt_3", "payment_intent.succeeded", "succeeded", tenant_id, payment_id, 2999);

    let (code, _) = deliver(&url, &signed(&body), body).await;

    assert_eq!(code, 200);
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::DeadLettered);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn unfinished_intents_and_other_events_are_acknowledged_and_change_nothing(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool).await;
    let processing = event("evt_4", "payment_intent.processing", "processing", tenant_id, payment_id, 1999);
    let mut other: Value = serde_json::from_slice(&processing).unwrap();
    other["id"] = json!("evt_5");
    other["type"] = json!("customer.created");
    other["data"]["object"] = json!({"id": "cus_1", "object": "customer"});
    let other = serde_json::to_vec(&other).unwrap();

    for body in [processing, other] {
        assert_eq!(deliver(&url, &signed(&body), body).await, (200, json!({"outcome": "ignored"})));
    }
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Unknown);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_signed_event_that_names_a_member_twice_is_400_after_its_signature_and_changes_nothing(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool).await;
    let genuine = event("evt_7", "payment_intent.succeeded", "succeeded", tenant_id, payment_id, 1999);
    let text = String::from_utf8(genuine.clone()).unwrap();
    let ours = format!(r#""oncepay_payment_id":"{payment_id}""#);
    let other = format!(r#""oncepay_payment_id":"{}""#, PaymentId::generate());
    let cases = [
        // A reader that keeps the first sees an intent for another payment.
        ("two payments", text.replace(&ours, &format!("{other},{ours}"))),
        (
            "two amounts received",
            text.replace(r#""amount_received":1999"#, r#""amount_received":1,"amount_received":1999"#),
        ),
        ("two event types", text.replace(r#""type":"#, r#""type":"customer.created","type":"#)),
    ];

    for (name, body) in cases {
        assert_ne!(body, text, "{name}");
        let forged = StripeWebhookSecret::parse("whsec_someone_elses_secret_000")
            .unwrap()
            .sign(OffsetDateTime::now_utc().unix_timestamp(), body.as_bytes());
        let (forged_code, _) = deliver(&url, &forged, body.clone().into_bytes()).await;
        let (code, problem) = deliver(&url, &signed(body.as_bytes()), body.into_bytes()).await;

        assert_eq!(forged_code, 401, "{name}: the signature is checked first");
        assert_eq!(code, 400, "{name}: {problem}");
        assert_eq!(problem["type"], "https://oncepay.dev/problems/invalid-webhook", "{name}");
        assert!(problem["detail"].as_str().unwrap().contains("more than once"), "{name}: {problem}");
    }
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Unknown);
    // The refused deliveries left no trace: the genuine event under the same id is applied.
    let (code, body) = deliver(&url, &signed(&genuine), genuine).await;
    assert_eq!((code, body), (200, json!({"outcome": "applied"})));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_event_whose_object_is_json_text_under_serde_jsons_private_name_is_400_and_changes_nothing(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool).await;
    let genuine = event("evt_8", "payment_intent.succeeded", "succeeded", tenant_id, payment_id, 1999);
    let mut disguised: Value = serde_json::from_slice(&genuine).unwrap();
    // serde_json reads an object whose member is named `$serde_json::private::RawValue` as the JSON
    // text it holds, leniently: a repeated member inside that text would be read last-wins.
    let ours = format!(r#""oncepay_payment_id":"{payment_id}""#);
    let other = format!(r#""oncepay_payment_id":"{}""#, PaymentId::generate());
    let inner = disguised["data"]["object"].to_string().replace(&ours, &format!("{other},{ours}"));
    disguised["data"]["object"] = json!({"$serde_json::private::RawValue": inner});
    let body = serde_json::to_vec(&disguised).unwrap();

    let (code, problem) = deliver(&url, &signed(&body), body).await;

    assert_eq!(code, 400, "{problem}");
    assert_eq!(problem["type"], "https://oncepay.dev/problems/invalid-webhook");
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Unknown);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_delivery_with_a_bad_signature_is_refused_and_changes_nothing(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = one_unknown_payment(&pool).await;
    let body = event("evt_6", "payment_intent.succeeded", "succeeded", tenant_id, payment_id, 1999);
    let forged = StripeWebhookSecret::parse("whsec_someone_elses_secret_000")
        .unwrap()
        .sign(OffsetDateTime::now_utc().unix_timestamp(), &body);

    let (code, problem) = deliver(&url, &forged, body).await;

    assert_eq!(code, 401, "{problem}");
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Unknown);
}

/// `event` as a Connect endpoint delivers it: from `account`, or from the platform's own account,
/// about an intent of its own.
fn from_account(event: Vec<u8>, account: Option<&str>) -> Vec<u8> {
    let mut event: Value = serde_json::from_slice(&event).unwrap();
    event["data"]["object"]["id"] = json!(format!("pi_of_{}", event["id"].as_str().unwrap()));
    if let Some(account) = account {
        event["account"] = json!(account);
    }
    serde_json::to_vec(&event).unwrap()
}

/// Charges the payment to connected account `account`, as connect mode does when it is accepted.
async fn in_account(pool: &PgPool, payment_id: PaymentId, account: &str) {
    sqlx::query!("UPDATE payments SET provider_account = $2 WHERE payment_id = $1", payment_id.as_uuid(), account)
        .execute(pool)
        .await
        .unwrap();
}

/// Every delivery recorded: (webhook id, outcome).
async fn deliveries(pool: &PgPool) -> Vec<(String, String)> {
    sqlx::query!("SELECT webhook_id, outcome FROM webhook_events ORDER BY received_at, webhook_id")
        .map(|row| (row.webhook_id, row.outcome))
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn dead_letter_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM dead_letters"#).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_connect_event_settles_only_a_payment_charged_in_its_account(pool: PgPool) {
    let url = start(&pool);
    let tenant_id = tenant(&pool, "acme").await;
    let mut payments = Vec::new();
    for key in ["order-1", "order-2", "order-3"] {
        let payment_id = unknown_payment(&pool, tenant_id, key, 1999, 60).await;
        in_account(&pool, payment_id, "acct_A").await;
        payments.push(payment_id);
    }
    let succeeded = |id: &str, payment_id, account| {
        from_account(event(id, "payment_intent.succeeded", "succeeded", tenant_id, payment_id, 1999), account)
    };

    let its_own = succeeded("evt_7", payments[0], Some("acct_A"));
    let another_merchants = succeeded("evt_8", payments[1], Some("acct_B"));
    let the_platforms = succeeded("evt_9", payments[2], None);
    let outcomes = [
        deliver(&url, &signed(&its_own), its_own).await,
        deliver(&url, &signed(&another_merchants), another_merchants).await,
        deliver(&url, &signed(&the_platforms), the_platforms).await,
    ];

    assert_eq!(
        outcomes.map(|(code, body)| (code, body["outcome"].clone())),
        [(200, json!("applied")), (200, json!("other_account")), (200, json!("other_account"))]
    );
    assert_eq!(status(&pool, tenant_id, payments[0]).await, PaymentStatus::Succeeded);
    for payment_id in &payments[1..] {
        assert_eq!(status(&pool, tenant_id, *payment_id).await, PaymentStatus::Unknown, "never moved");
    }
    let booked: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM ledger_entries"#).fetch_one(&pool).await.unwrap();
    assert_eq!(booked, 1);
    assert_eq!(dead_letter_count(&pool).await, 0, "another merchant dead-letters nothing");
    assert_eq!(deliveries(&pool).await, [("evt_7".to_owned(), "applied".to_owned())], "nothing else recorded");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_event_from_another_account_opens_no_conflict_on_a_final_payment(pool: PgPool) {
    let url = start(&pool);
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = support::succeeded_payment(&pool, tenant_id, "order-1", 1999).await;
    in_account(&pool, payment_id, "acct_A").await;
    let failed =
        event("evt_1", "payment_intent.payment_failed", "requires_payment_method", tenant_id, payment_id, 1999);
    let another_merchants = from_account(failed, Some("acct_B"));

    let (code, body) = deliver(&url, &signed(&another_merchants), another_merchants).await;

    assert_eq!((code, body), (200, json!({"outcome": "other_account"})));
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Succeeded);
    assert_eq!(dead_letter_count(&pool).await, 0, "another merchant's event is no conflict of this payment");
    assert!(deliveries(&pool).await.is_empty());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_event_from_another_account_adds_no_evidence_and_an_approval_waiting_still_goes_through(pool: PgPool) {
    let url = start(&pool);
    let ops = support::Ops::start(&pool).await;
    let tenant_id = tenant(&pool, "acme").await;
    let payment_id = support::dead_lettered(&pool, tenant_id, "order-1", 60).await;
    in_account(&pool, payment_id, "acct_A").await;
    let alice = ops.operator("alice", "operator", None).await;
    let bob = ops.operator("bob", "approver", None).await;
    let resolve = json!({"as": "failed", "reason": "the provider's dashboard shows no charge"});
    let (proposed, proposal) = ops.post(&alice, &format!("/v1/payments/{payment_id}/resolve"), resolve).await;
    let proposal_id = proposal["proposal"]["proposal_id"].as_str().unwrap_or_default().to_owned();
    let succeeded = event("evt_1", "payment_intent.succeeded", "succeeded", tenant_id, payment_id, 1999);
    let another_merchants = from_account(succeeded, Some("acct_B"));
    let evidence_before = evidence_count(&pool, payment_id).await;

    let (code, body) = deliver(&url, &signed(&another_merchants), another_merchants).await;
    let evidence_after = evidence_count(&pool, payment_id).await;
    let (approved, done) =
        ops.post(&bob, &format!("/v1/proposals/{proposal_id}/approve"), json!({"reason": "checked"})).await;

    assert_eq!(proposed, reqwest::StatusCode::ACCEPTED, "{proposal}");
    assert_eq!(approved, reqwest::StatusCode::OK, "{done}");
    assert_eq!((code, body), (200, json!({"outcome": "other_account"})));
    assert_eq!(status(&pool, tenant_id, payment_id).await, PaymentStatus::Failed);
    assert_eq!(evidence_after, evidence_before, "no evidence added to the dead letter");
    assert!(deliveries(&pool).await.is_empty());
}

/// How many pieces of evidence the payment's dead letter holds.
async fn evidence_count(pool: &PgPool, payment_id: PaymentId) -> i32 {
    sqlx::query_scalar!(
        r#"SELECT jsonb_array_length(evidence) AS "count!" FROM dead_letters WHERE payment_id = $1"#,
        payment_id.as_uuid()
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_charge_from_another_account_is_never_the_charge_on_record_of_a_payment(pool: PgPool) {
    let url = start(&pool);
    let ops = support::Ops::start(&pool).await;
    let tenant_id = tenant(&pool, "acme").await;
    // Being sent: a webhook about it is recorded, for its worker and the poller.
    let payment_id = support::accept(&pool, tenant_id, "order-1", 1999).await;
    in_account(&pool, payment_id, "acct_A").await;
    support::claim(&pool, tenant_id, payment_id, 60).await;
    let succeeded = event("evt_1", "payment_intent.succeeded", "succeeded", tenant_id, payment_id, 1999);
    let another_merchants = from_account(succeeded, Some("acct_B"));
    let (code, body) = deliver(&url, &signed(&another_merchants), another_merchants).await;
    // Its send ends uncertain, and the poller gives up on it.
    support::uncertain(&pool, tenant_id, payment_id).await;
    let mut tx = pool.begin().await.unwrap();
    let why = oncepay_reconciler::unknown::Why { actor: "reconciler:poller", reason: "lookups spent" };
    let evidence = oncepay_reconciler::unknown::evidence("poll", json!({"attempt": 30, "result": "HTTP 503"}));
    oncepay_reconciler::unknown::payments::exhaust(&mut tx, tenant_id, payment_id, why, evidence).await.unwrap();
    tx.commit().await.unwrap();
    let alice = ops.operator("alice", "operator", None).await;

    let resolve = json!({"as": "failed", "reason": "the provider's dashboard shows no charge"});
    let (proposed, proposal) = ops.post(&alice, &format!("/v1/payments/{payment_id}/resolve"), resolve).await;

    assert_eq!(proposed, reqwest::StatusCode::ACCEPTED, "another merchant's charge is not this payment's: {proposal}");
    assert_eq!((code, body), (200, json!({"outcome": "other_account"})));
    assert!(deliveries(&pool).await.is_empty());
}
