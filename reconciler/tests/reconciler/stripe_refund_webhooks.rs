//! Stripe's refund events at `POST /webhooks/stripe` over real HTTP (the server on port 0) against a
//! real PostgreSQL: `refund.created`, `refund.updated`, `refund.failed` and an expanded
//! `charge.refunded` settle an `unknown` refund by the same rules as the simulator's refund events,
//! once per event, only in the payment's own account, and never move a final refund.

use std::net::TcpListener;

use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::refund_status::RefundStatus;
use oncepay_provider::metadata_keys;
use oncepay_provider::stripe::signature::StripeWebhookSecret;
use oncepay_reconciler::http;
use oncepay_reconciler::webhooks::WebhookState;
use oncepay_store::fixtures::tenant;
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::support::{count_for_refund, refund_status, refunded, succeeded_payment, unknown_refund};

const SECRET: &str = "whsec_test_stripe_endpoint_secret_1";

/// The PaymentIntent the test payment was charged by: the Stripe adapter books it as the charge.
const INTENT: &str = "pi_3QwJ";

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

/// Delivers `body` signed with the endpoint's secret; returns the status and the JSON body.
async fn deliver(url: &str, body: &Value) -> (u16, Value) {
    let body = serde_json::to_vec(body).unwrap();
    let signature = StripeWebhookSecret::parse(SECRET).unwrap().sign(OffsetDateTime::now_utc().unix_timestamp(), &body);
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

/// A Refund `id` of [`INTENT`] in `status`, made for oncepay's refund, shaped as the Refund object
/// Stripe documents.
fn stripe_refund(tenant_id: TenantId, refund_id: RefundId, id: &str, status: &str, amount: i64) -> Value {
    json!({
        "id": id,
        "object": "refund",
        "amount": amount,
        "balance_transaction": "txn_1",
        "charge": "ch_3QwJ",
        "created": OffsetDateTime::now_utc().unix_timestamp(),
        "currency": "eur",
        "destination_details": {"card": {"reference_status": "pending", "type": "refund"}, "type": "card"},
        "failure_reason": if status == "failed" { json!("expired_or_canceled_card") } else { Value::Null },
        "metadata": {
            metadata_keys::TENANT_ID: tenant_id.to_string(),
            metadata_keys::REFUND_ID: refund_id.to_string(),
        },
        "payment_intent": INTENT,
        "reason": "requested_by_customer",
        "receipt_number": null,
        "source_transfer_reversal": null,
        "status": status,
        "transfer_reversal": null
    })
}

/// A Stripe event `id` of `event_type` about `object`, from the platform's own account.
fn event(id: &str, event_type: &str, object: Value) -> Value {
    json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": OffsetDateTime::now_utc().unix_timestamp(),
        "type": event_type,
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": "req_1", "idempotency_key": "oncepay-refund-x"},
        "data": {"object": object}
    })
}

/// `event`, as a Connect endpoint delivers it from `account`.
fn from_account(mut event: Value, account: &str) -> Value {
    event["account"] = json!(account);
    event
}

/// A `charge.refunded` event about the Charge of [`INTENT`], listing `refunds` when it is `Some`
/// (its `refunds` expanded), or without them, as Stripe sends it by default.
fn charge_refunded(id: &str, refunds: Option<Vec<Value>>) -> Value {
    let mut charge = json!({
        "id": "ch_3QwJ", "object": "charge", "amount": 1999, "amount_captured": 1999, "amount_refunded": 1000,
        "captured": true, "currency": "eur", "paid": true, "payment_intent": INTENT, "refunded": false,
        "status": "succeeded", "metadata": {}
    });
    if let Some(refunds) = refunds {
        charge["refunds"] = json!({
            "object": "list", "data": refunds, "has_more": false, "total_count": 3,
            "url": "/v1/charges/ch_3QwJ/refunds"
        });
    }
    event(id, "charge.refunded", charge)
}

/// A tenant's payment of 1999 cents, charged by [`INTENT`].
async fn payment(pool: &PgPool) -> (TenantId, PaymentId) {
    let tenant_id = tenant(pool, "acme").await;
    let payment_id = succeeded_payment(pool, tenant_id, "order-1", 1999).await;
    sqlx::query("UPDATE payments SET provider_charge_id = $2 WHERE payment_id = $1")
        .bind(payment_id.as_uuid())
        .bind(INTENT)
        .execute(pool)
        .await
        .unwrap();
    (tenant_id, payment_id)
}

/// The recorded deliveries: (webhook id, event type, outcome), oldest first.
async fn deliveries(pool: &PgPool) -> Vec<(String, String, String)> {
    sqlx::query!("SELECT webhook_id, event_type, outcome FROM webhook_events ORDER BY received_at, webhook_id")
        .map(|row| (row.webhook_id, row.event_type, row.outcome))
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn provider_refund_id(pool: &PgPool, refund_id: RefundId) -> Option<String> {
    sqlx::query_scalar!("SELECT provider_refund_id FROM refunds WHERE refund_id = $1", refund_id.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_update_settles_an_unknown_refund_once_and_a_redelivery_is_ignored(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = payment(&pool).await;
    let refund_id = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;
    let body = event("evt_1", "refund.updated", stripe_refund(tenant_id, refund_id, "re_1", "succeeded", 500));

    let first = deliver(&url, &body).await;
    let again = deliver(&url, &body).await;

    assert_eq!(first, (200, json!({"outcome": "applied"})));
    assert_eq!(again, (200, json!({"outcome": "duplicate"})));
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Succeeded);
    assert_eq!(provider_refund_id(&pool, refund_id).await.as_deref(), Some("re_1"));
    assert_eq!(count_for_refund(&pool, "refund_ledger_entries", refund_id).await, 1);
    assert_eq!(refunded(&pool, payment_id).await, (500, 500), "the payment's refunded amount is raised once");
    assert_eq!(deliveries(&pool).await, [("evt_1".into(), "refund.updated".into(), "applied".into())]);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_failure_fails_an_unknown_refund_and_gives_its_reservation_back(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = payment(&pool).await;
    let refund_id = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;
    let body = event("evt_1", "refund.failed", stripe_refund(tenant_id, refund_id, "re_1", "failed", 500));

    let delivered = deliver(&url, &body).await;

    assert_eq!(delivered, (200, json!({"outcome": "applied"})));
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Failed);
    assert_eq!(refunded(&pool, payment_id).await, (0, 0));
    assert_eq!(count_for_refund(&pool, "refund_ledger_entries", refund_id).await, 0);
    assert_eq!(provider_refund_id(&pool, refund_id).await.as_deref(), Some("re_1"));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_that_fails_after_it_succeeded_keeps_its_status_and_is_a_conflict_for_an_operator(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = payment(&pool).await;
    let refund_id = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;
    let succeeded = event("evt_1", "refund.updated", stripe_refund(tenant_id, refund_id, "re_1", "succeeded", 500));
    let failed_later = event("evt_2", "refund.failed", stripe_refund(tenant_id, refund_id, "re_1", "failed", 500));

    let first = deliver(&url, &succeeded).await;
    let later = deliver(&url, &failed_later).await;

    assert_eq!(first, (200, json!({"outcome": "applied"})));
    assert_eq!(later, (200, json!({"outcome": "conflict"})));
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Succeeded, "a final refund never moves");
    assert_eq!(count_for_refund(&pool, "refund_ledger_entries", refund_id).await, 1);
    assert_eq!(refunded(&pool, payment_id).await, (500, 500));
    assert_eq!(
        deliveries(&pool).await,
        [
            ("evt_1".into(), "refund.updated".into(), "applied".into()),
            ("evt_2".into(), "refund.failed".into(), "conflict".into()),
        ]
    );
    let entry = sqlx::query!(
        r#"SELECT kind, reason, jsonb_array_length(evidence) AS "evidence!", resolved_at IS NULL AS "open!"
           FROM refund_dead_letters WHERE refund_id = $1"#,
        refund_id.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((entry.kind.as_str(), entry.evidence, entry.open), ("conflict", 1, true), "{}", entry.reason);
    assert!(entry.reason.contains("re_1 failed"), "{}", entry.reason);
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_connect_refund_event_settles_only_a_refund_made_in_its_account(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = payment(&pool).await;
    sqlx::query!("UPDATE payments SET provider_account = 'acct_A' WHERE payment_id = $1", payment_id.as_uuid())
        .execute(&pool)
        .await
        .unwrap();
    let mut refunds = Vec::new();
    for key in ["refund-1", "refund-2", "refund-3"] {
        refunds.push(unknown_refund(&pool, tenant_id, payment_id, key, 500, 60).await);
    }
    let succeeded = |id: &str, refund_id, re: &str| {
        event(id, "refund.updated", stripe_refund(tenant_id, refund_id, re, "succeeded", 500))
    };

    let its_own = from_account(succeeded("evt_1", refunds[0], "re_1"), "acct_A");
    let another_merchants = from_account(succeeded("evt_2", refunds[1], "re_2"), "acct_B");
    let the_platforms = succeeded("evt_3", refunds[2], "re_3");
    // Another merchant's account says the refund made in acct_A failed.
    let contradiction = from_account(
        event("evt_4", "refund.failed", stripe_refund(tenant_id, refunds[0], "re_1", "failed", 500)),
        "acct_B",
    );
    let outcomes = [
        deliver(&url, &its_own).await,
        deliver(&url, &another_merchants).await,
        deliver(&url, &the_platforms).await,
        deliver(&url, &contradiction).await,
    ];

    assert_eq!(
        outcomes.map(|(code, body)| (code, body["outcome"].clone())),
        [
            (200, json!("applied")),
            (200, json!("other_account")),
            (200, json!("other_account")),
            (200, json!("other_account"))
        ]
    );
    assert_eq!(refund_status(&pool, refunds[0]).await, RefundStatus::Succeeded);
    for refund_id in &refunds[1..] {
        assert_eq!(refund_status(&pool, *refund_id).await, RefundStatus::Unknown, "never moved");
        assert_eq!(count_for_refund(&pool, "refund_ledger_entries", *refund_id).await, 0);
    }
    assert_eq!(refunded(&pool, payment_id).await.1, 500, "only the refund in the payment's account is booked");
    assert_eq!(
        deliveries(&pool).await,
        [("evt_1".into(), "refund.updated".into(), "applied".into())],
        "nothing of another account is recorded, not even as a conflict"
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_charge_refunded_event_settles_each_refund_it_lists_once(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = payment(&pool).await;
    let refunded_one = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;
    let failed_one = unknown_refund(&pool, tenant_id, payment_id, "refund-2", 500, 60).await;
    // Listed on the Charge without its own `payment_intent`: it refunds the Charge's.
    let mut failed = stripe_refund(tenant_id, failed_one, "re_2", "failed", 500);
    failed["payment_intent"] = Value::Null;
    // A refund someone made in Stripe's dashboard: it names no refund of oncepay's.
    let mut someone_elses = stripe_refund(tenant_id, RefundId::generate(), "re_3", "succeeded", 200);
    someone_elses["metadata"] = json!({});
    let listed = vec![someone_elses, failed, stripe_refund(tenant_id, refunded_one, "re_1", "succeeded", 500)];
    let body = charge_refunded("evt_1", Some(listed));

    let (code, first) = deliver(&url, &body).await;
    let (_, again) = deliver(&url, &body).await;

    assert_eq!(code, 200, "{first}");
    assert_eq!(
        first,
        json!({"outcome": "applied", "refunds": [
            {"refund": "re_3", "outcome": "not_ours"},
            {"refund": "re_2", "outcome": "applied"},
            {"refund": "re_1", "outcome": "applied"},
        ]})
    );
    assert_eq!(again["outcome"], "duplicate", "{again}");
    assert_eq!(refund_status(&pool, refunded_one).await, RefundStatus::Succeeded);
    assert_eq!(refund_status(&pool, failed_one).await, RefundStatus::Failed);
    assert_eq!(refunded(&pool, payment_id).await, (500, 500));
    assert_eq!(
        deliveries(&pool).await,
        [
            ("evt_1/re_2".into(), "charge.refunded".into(), "applied".into()),
            ("evt_1/re_1".into(), "charge.refunded".into(), "applied".into()),
        ]
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_charge_refunded_event_that_lists_no_refunds_is_acknowledged_and_changes_nothing(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = payment(&pool).await;
    let refund_id = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;
    let mut null_list = charge_refunded("evt_3", None);
    null_list["data"]["object"]["refunds"] = Value::Null;
    let bodies = [charge_refunded("evt_1", None), charge_refunded("evt_2", Some(Vec::new())), null_list];

    for body in bodies {
        assert_eq!(deliver(&url, &body).await, (200, json!({"outcome": "ignored"})), "{body}");
    }

    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Unknown, "never guessed from amounts");
    assert!(deliveries(&pool).await.is_empty());
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn unfinished_refunds_refunds_of_no_intent_and_contradicting_events_change_nothing(pool: PgPool) {
    let url = start(&pool);
    let (tenant_id, payment_id) = payment(&pool).await;
    let refund_id = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;
    let pending = event("evt_1", "refund.created", stripe_refund(tenant_id, refund_id, "re_1", "pending", 500));
    let mut of_no_intent = stripe_refund(tenant_id, refund_id, "re_1", "succeeded", 500);
    of_no_intent["payment_intent"] = Value::Null;
    let of_no_intent = event("evt_2", "refund.updated", of_no_intent);
    let not_failed = event("evt_3", "refund.failed", stripe_refund(tenant_id, refund_id, "re_1", "succeeded", 500));
    let not_a_refund = event("evt_4", "refund.updated", json!({"id": "re_1", "object": "refund"}));

    let outcomes = [
        deliver(&url, &pending).await,
        deliver(&url, &of_no_intent).await,
        deliver(&url, &not_failed).await,
        deliver(&url, &not_a_refund).await,
    ];

    assert_eq!(
        outcomes.map(|(code, body)| (code, body["outcome"].clone(), body["type"].clone())),
        [
            (200, json!("unfinished"), Value::Null),
            (200, json!("ignored"), Value::Null),
            (400, Value::Null, json!("https://oncepay.dev/problems/invalid-webhook")),
            (400, Value::Null, json!("https://oncepay.dev/problems/invalid-webhook")),
        ]
    );
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Unknown);
    assert_eq!(deliveries(&pool).await, [("evt_1".into(), "refund.created".into(), "unfinished".into())]);
}
