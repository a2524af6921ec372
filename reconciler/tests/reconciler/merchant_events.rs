//! The operations API on a tenant's events to merchants: operators see a tenant's endpoints without
//! their secrets, stop and start one, and replay an event or an endpoint's dead-lettered
//! deliveries, each with its reason in the audit trail; a viewer only reads, and an operator of
//! another tenant finds nothing.

use oncepay_store::fixtures::tenant;
use oncepay_store::merchant_endpoints::{self, NewEndpoint};
use oncepay_webhook_signature::WebhookSecret;
use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{Ops, audit_of_actions, dead_lettered, reasoned};

async fn endpoint(pool: &PgPool, tenant_id: oncepay_domain::ids::TenantId) -> (Uuid, String) {
    let secret = WebhookSecret::generate();
    let new =
        NewEndpoint { url: "https://acme.example/hooks", description: "orders", event_types: &[], secret: &secret };
    let mut conn = pool.acquire().await.unwrap();
    (merchant_endpoints::create(&mut conn, tenant_id, &new).await.unwrap().endpoint_id, secret)
}

async fn deliveries(pool: &PgPool) -> Vec<(String, i32)> {
    sqlx::query_as("SELECT state, attempts FROM merchant_deliveries ORDER BY created_at").fetch_all(pool).await.unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn operators_see_stop_and_start_a_tenants_endpoint_with_a_reason_in_the_trail(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    tenant(&pool, "globex").await;
    let (id, secret) = endpoint(&pool, acme).await;
    let ana = ops.operator("ana", "operator", Some(&["acme"])).await;
    let vic = ops.operator("vic", "viewer", Some(&["acme"])).await;
    let gus = ops.operator("gus", "operator", Some(&["globex"])).await;
    let path = format!("/v1/tenants/acme/webhook-endpoints/{id}");

    let (listed, list) = ops.get(&vic, "/v1/tenants/acme/webhook-endpoints").await;
    let (by_a_viewer, _) =
        ops.call(&vic, Method::PATCH, &path, Some(json!({"enabled": false, "reason": "noisy"}))).await;
    let (elsewhere, _) = ops.call(&gus, Method::PATCH, &path, Some(json!({"enabled": false, "reason": "noisy"}))).await;
    let (no_reason, _) = ops.call(&ana, Method::PATCH, &path, Some(json!({"enabled": false, "reason": " "}))).await;
    let (stopped, after_stop) =
        ops.call(&ana, Method::PATCH, &path, Some(json!({"enabled": false, "reason": "it answers 500 to all"}))).await;
    let (started, after_start) =
        ops.call(&ana, Method::PATCH, &path, Some(json!({"enabled": true, "reason": "they fixed it"}))).await;

    assert_eq!(listed, StatusCode::OK, "{list}");
    assert_eq!(list["data"][0]["id"], id.to_string());
    assert_eq!(list["data"][0]["url"], "https://acme.example/hooks");
    assert!(!list.to_string().contains(&secret), "the secret is never shown: {list}");
    assert_eq!(
        (by_a_viewer, elsewhere, no_reason),
        (StatusCode::FORBIDDEN, StatusCode::NOT_FOUND, StatusCode::BAD_REQUEST)
    );
    assert_eq!(stopped, StatusCode::OK, "{after_stop}");
    assert_eq!(
        (after_stop["enabled"].clone(), after_stop["disabled_reason"].clone()),
        (json!(false), json!("merchant"))
    );
    assert_eq!(started, StatusCode::OK, "{after_start}");
    assert_eq!(after_start["enabled"], true);
    assert!(after_start.get("disabled_reason").is_none(), "{after_start}");
    let trail = audit_of_actions(&pool, &["webhook_endpoint.%"]).await;
    assert_eq!(
        trail,
        [
            reasoned("vic", "webhook_endpoint.disable", "refused", None),
            reasoned("gus", "webhook_endpoint.disable", "refused", None),
            reasoned("ana", "webhook_endpoint.disable", "refused", None),
            reasoned("ana", "webhook_endpoint.disable", "done", Some("it answers 500 to all")),
            reasoned("ana", "webhook_endpoint.enable", "done", Some("they fixed it")),
        ]
    );
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn an_operator_replays_an_event_and_an_endpoints_dead_letters_under_the_same_webhook_id(pool: PgPool) {
    let ops = Ops::start(&pool).await;
    let acme = tenant(&pool, "acme").await;
    let (id, _) = endpoint(&pool, acme).await;
    let ana = ops.operator("ana", "operator", Some(&["acme"])).await;
    let vic = ops.operator("vic", "viewer", Some(&["acme"])).await;
    // Dead-lettering a payment writes its event and queues it for the endpoint.
    dead_lettered(&pool, acme, "k-1", 60).await;
    let event_id: Uuid = sqlx::query_scalar("SELECT event_id FROM merchant_events").fetch_one(&pool).await.unwrap();
    sqlx::query("UPDATE merchant_deliveries SET state = 'dead_lettered', attempts = 10").execute(&pool).await.unwrap();
    let replay_event = format!("/v1/tenants/acme/events/{event_id}/replay");
    let replay_failed = format!("/v1/tenants/acme/webhook-endpoints/{id}/replay");

    let (by_a_viewer, _) = ops.call(&vic, Method::POST, &replay_event, Some(json!({"reason": "lost it"}))).await;
    let (unknown, _) = ops
        .call(
            &ana,
            Method::POST,
            &format!("/v1/tenants/acme/events/{}/replay", Uuid::nil()),
            Some(json!({"reason": "x"})),
        )
        .await;
    let (since_later, none) = ops
        .call(
            &ana,
            Method::POST,
            &replay_failed,
            Some(json!({"since": "2999-01-01T00:00:00Z", "reason": "their outage"})),
        )
        .await;
    let (since_earlier, one) = ops
        .call(
            &ana,
            Method::POST,
            &replay_failed,
            Some(json!({"since": "2000-01-01T00:00:00Z", "reason": "their outage"})),
        )
        .await;
    let after_failed = deliveries(&pool).await;
    sqlx::query("UPDATE merchant_deliveries SET state = 'delivered', attempts = 1").execute(&pool).await.unwrap();
    let (replayed, again) = ops.call(&ana, Method::POST, &replay_event, Some(json!({"reason": "they lost it"}))).await;

    assert_eq!((by_a_viewer, unknown), (StatusCode::FORBIDDEN, StatusCode::NOT_FOUND));
    assert_eq!((since_later, none), (StatusCode::ACCEPTED, json!({"deliveries": 0})));
    assert_eq!((since_earlier, one), (StatusCode::ACCEPTED, json!({"deliveries": 1})));
    assert_eq!(after_failed, [("pending".to_owned(), 0)], "the schedule starts again");
    assert_eq!((replayed, again), (StatusCode::ACCEPTED, json!({"deliveries": 1})));
    assert_eq!(deliveries(&pool).await, [("pending".to_owned(), 0)], "a delivered event is sent again too");
    let ids: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM merchant_deliveries").fetch_all(&pool).await.unwrap();
    assert_eq!(ids, [event_id], "a replay keeps the event, so its webhook-id");
    let actions: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM operator_audit WHERE outcome = 'done' AND action LIKE '%replay' ORDER BY audit_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(actions, ["webhook_endpoint.replay", "webhook_endpoint.replay", "event.replay"]);
}
