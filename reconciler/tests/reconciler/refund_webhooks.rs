//! Signed `refund.updated` / `refund.failed` events at `POST /webhooks/provider`, against a real
//! PostgreSQL: they settle an `unknown` refund as a lookup would, at most once per `webhook-id`,
//! and only record what they say about a refund that is not `unknown`.

use std::net::TcpListener;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::refund_status::RefundStatus;
use oncepay_http::probes::ProbeState;
use oncepay_provider::wire::{RefundEvent, RefundEventType};
use oncepay_provider::{Refund, RefundState, metadata_keys};
use oncepay_reconciler::http;
use oncepay_reconciler::refund_webhooks as webhooks;
use oncepay_reconciler::webhooks::WebhookState;
use oncepay_store::fixtures::tenant;
use oncepay_webhook_signature::WebhookSecret;
use serde_json::{Value, json};
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::support::{
    claim_refunds, count_for_refund, refund, refund_status, refunded, succeeded_payment, unknown_refund,
};

/// The reconciler's HTTP server on a free port, accepting deliveries signed with the returned secret.
fn start(pool: &PgPool) -> (String, WebhookSecret) {
    oncepay_service::tls::install_provider();
    let secret = WebhookSecret::parse(&format!("whsec_{}", STANDARD.encode([7; 32]))).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let webhook = WebhookState {
        pool: pool.clone(),
        secrets: vec![secret.clone()],
        stripe_secrets: Vec::new(),
        tolerance_secs: 300,
        max_body_bytes: 65_536,
    };
    let ops = ProbeState { pool: pool.clone(), metrics: oncepay_service::metrics::install() };
    tokio::spawn(http::server(listener, webhook, Some(ops), 1).unwrap());
    (format!("http://127.0.0.1:{port}/webhooks/provider"), secret)
}

/// Delivers `body` as `webhook-id: id`, signed now; returns the status and the JSON body.
async fn deliver(url: &str, secret: &WebhookSecret, id: &str, body: Vec<u8>) -> (u16, Value) {
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let response = reqwest::Client::new()
        .post(url)
        .header("webhook-id", id)
        .header("webhook-timestamp", now.to_string())
        .header("webhook-signature", secret.sign(id, now, &body))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The provider's refund `id` of `ch_order-1` under the refund's key, naming it in its metadata as
/// oncepay's refunds do.
fn reported(tenant_id: TenantId, refund_id: RefundId, id: &str, status: RefundState, amount: i64) -> Refund {
    Refund {
        metadata: [
            (metadata_keys::TENANT_ID.to_owned(), tenant_id.to_string()),
            (metadata_keys::REFUND_ID.to_owned(), refund_id.to_string()),
        ]
        .into(),
        ..oncepay_provider::fixtures::refund(refund_id, id, "ch_order-1", status, amount)
    }
}

/// The event the simulator sends for `refund`: `refund.failed` for a failed one, else
/// `refund.updated`.
fn event(refund: Refund) -> RefundEvent {
    let event_type = match refund.status {
        RefundState::Failed => RefundEventType::RefundFailed,
        _ => RefundEventType::RefundUpdated,
    };
    RefundEvent { event_type, created: refund.created, data: refund }
}

/// A tenant's payment of 1999 cents, charged as `ch_order-1`.
async fn payment(pool: &PgPool) -> (TenantId, PaymentId) {
    let tenant_id = tenant(pool, "acme").await;
    (tenant_id, succeeded_payment(pool, tenant_id, "order-1", 1999).await)
}

async fn changes_by(pool: &PgPool, refund_id: RefundId, actor: &str) -> i64 {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM refund_events WHERE refund_id = $1 AND actor = $2"#,
        refund_id.as_uuid(),
        actor
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The recorded deliveries: (webhook id, event type, outcome), oldest first.
async fn deliveries(pool: &PgPool) -> Vec<(String, String, String)> {
    sqlx::query!("SELECT webhook_id, event_type, outcome FROM webhook_events ORDER BY received_at, webhook_id")
        .map(|row| (row.webhook_id, row.event_type, row.outcome))
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_signed_refund_update_settles_an_unknown_refund_once_and_a_redelivery_is_ignored(pool: PgPool) {
    let (url, secret) = start(&pool);
    let (tenant_id, payment_id) = payment(&pool).await;
    let refund_id = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;
    let body = serde_json::to_vec(&event(reported(tenant_id, refund_id, "re_1", RefundState::Succeeded, 500))).unwrap();

    let first = deliver(&url, &secret, "msg_1", body.clone()).await;
    let again = deliver(&url, &secret, "msg_1", body).await;

    assert_eq!(first, (200, json!({"outcome": "applied"})));
    assert_eq!(again, (200, json!({"outcome": "duplicate"})));
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Succeeded);
    assert_eq!(changes_by(&pool, refund_id, "webhook").await, 1);
    assert_eq!(count_for_refund(&pool, "refund_ledger_entries", refund_id).await, 1);
    assert_eq!(refunded(&pool, payment_id).await, (500, 500));
    assert_eq!(deliveries(&pool).await, [("msg_1".into(), "refund.updated".into(), "applied".into())]);
    let charges: i64 =
        sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM webhook_events WHERE charge IS NOT NULL"#)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(charges, 0, "a refund is never recorded as a reported charge");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_signed_refund_failure_fails_an_unknown_refund_and_gives_its_reservation_back(pool: PgPool) {
    let (url, secret) = start(&pool);
    let (tenant_id, payment_id) = payment(&pool).await;
    let refund_id = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;
    let body = serde_json::to_vec(&event(reported(tenant_id, refund_id, "re_1", RefundState::Failed, 500))).unwrap();

    let delivered = deliver(&url, &secret, "msg_1", body).await;

    assert_eq!(delivered, (200, json!({"outcome": "applied"})));
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Failed);
    assert_eq!(refunded(&pool, payment_id).await, (0, 0));
    let provider_refund: Option<String> =
        sqlx::query_scalar!("SELECT provider_refund_id FROM refunds WHERE refund_id = $1", refund_id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(provider_refund.as_deref(), Some("re_1"));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_event_for_another_amount_dead_letters_the_unknown_refund_with_the_event(pool: PgPool) {
    let (tenant_id, payment_id) = payment(&pool).await;
    let refund_id = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;

    let handled =
        webhooks::apply(&pool, "msg_1", &event(reported(tenant_id, refund_id, "re_1", RefundState::Succeeded, 450)))
            .await
            .unwrap();

    assert_eq!(handled.label(), "conflict");
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::DeadLettered);
    assert_eq!(count_for_refund(&pool, "refund_ledger_entries", refund_id).await, 0);
    let detail: Value = sqlx::query_scalar!(
        r#"SELECT detail AS "detail!" FROM refund_events WHERE refund_id = $1 AND to_status = 'dead_lettered'"#,
        refund_id.as_uuid()
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((detail["webhook_id"].as_str(), detail["refund"]["amount"].as_i64()), (Some("msg_1"), Some(450)));
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn refund_events_about_refunds_that_are_not_unknown_are_only_recorded(pool: PgPool) {
    let (tenant_id, payment_id) = payment(&pool).await;
    // Settled by the first event below; then a late `pending` update and a contradicting failure.
    let settled = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;
    let processing = refund(&pool, tenant_id, payment_id, "refund-2", 500).await;
    claim_refunds(&pool, tenant_id, 60).await;
    let events = [
        ("msg_1", reported(tenant_id, settled, "re_1", RefundState::Succeeded, 500), "applied"),
        ("msg_2", reported(tenant_id, settled, "re_1", RefundState::Pending, 500), "already_terminal"),
        ("msg_3", reported(tenant_id, settled, "re_1", RefundState::Failed, 500), "conflict"),
        ("msg_4", reported(tenant_id, processing, "re_2", RefundState::Succeeded, 500), "not_unknown"),
        (
            "msg_5",
            Refund { metadata: Default::default(), ..reported(tenant_id, settled, "re_9", RefundState::Succeeded, 1) },
            "not_ours",
        ),
    ];

    let mut labels = Vec::new();
    for (id, refund, _) in &events {
        labels.push(webhooks::apply(&pool, id, &event(refund.clone())).await.unwrap().label());
    }

    assert_eq!(labels, events.iter().map(|(_, _, label)| *label).collect::<Vec<_>>());
    assert_eq!(refund_status(&pool, settled).await, RefundStatus::Succeeded, "a final refund never moves");
    assert_eq!(refund_status(&pool, processing).await, RefundStatus::Processing, "left to its worker");
    assert_eq!(changes_by(&pool, settled, "webhook").await, 1);
    assert_eq!(refunded(&pool, payment_id).await, (1000, 500));
    let outcomes: Vec<String> = deliveries(&pool).await.into_iter().map(|(_, _, outcome)| outcome).collect();
    assert_eq!(
        outcomes,
        ["applied", "already_terminal", "conflict", "not_unknown"],
        "a refund not ours is not recorded"
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_refund_failure_event_whose_refund_has_not_failed_is_400_and_changes_nothing(pool: PgPool) {
    let (url, secret) = start(&pool);
    let (tenant_id, payment_id) = payment(&pool).await;
    let refund_id = unknown_refund(&pool, tenant_id, payment_id, "refund-1", 500, 60).await;
    let mut body =
        serde_json::to_value(event(reported(tenant_id, refund_id, "re_1", RefundState::Succeeded, 500))).unwrap();
    body["type"] = json!("refund.failed");

    let (code, problem) = deliver(&url, &secret, "msg_1", serde_json::to_vec(&body).unwrap()).await;
    let (malformed, _) =
        deliver(&url, &secret, "msg_2", br#"{"type":"refund.updated","created":1,"data":{}}"#.to_vec()).await;

    assert_eq!((code, problem["type"].as_str()), (400, Some("https://oncepay.dev/problems/invalid-webhook")));
    assert_eq!(malformed, 400);
    assert_eq!(refund_status(&pool, refund_id).await, RefundStatus::Unknown);
    assert!(deliveries(&pool).await.is_empty());
}
