//! The merchant's webhook endpoints over HTTP (`/v1/webhook-endpoints`): made with a secret shown
//! once, read, changed, disabled, given a new secret and removed, each tenant only its own, and
//! refused with nothing written when the URL, an event type or another field is wrong.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use oncepay_webhook_signature::WebhookSecret;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

use crate::helpers::{Tenant, TestApp, assert_problem, create_tenant, header};

const ENDPOINTS: &str = "/v1/webhook-endpoints";

/// A request to `path` as `tenant`.
fn call(app: &TestApp, tenant: &Tenant, method: Method, path: &str) -> RequestBuilder {
    app.request(method, path).bearer_auth(&tenant.token)
}

/// `POST /v1/webhook-endpoints` with `body` as `tenant`.
async fn create(app: &TestApp, tenant: &Tenant, body: &Value) -> Response {
    call(app, tenant, Method::POST, ENDPOINTS).json(body).send().await.unwrap()
}

/// A new endpoint of `tenant` at `url`, as the 201 response's body.
async fn created(app: &TestApp, tenant: &Tenant, url: &str) -> Value {
    let response = create(app, tenant, &json!({"url": url})).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    response.json().await.unwrap()
}

/// The path of the endpoint `endpoint` (a response body) names.
fn path_of(endpoint: &Value) -> String {
    format!("{ENDPOINTS}/{}", endpoint["id"].as_str().unwrap())
}

/// How many endpoints the database holds, of every tenant.
async fn endpoint_rows(db: &PgPool) -> i64 {
    sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM merchant_endpoints"#).fetch_one(db).await.unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn webhook_endpoints_are_made_with_a_secret_shown_once_and_a_location(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let request = json!({
        "url": "https://merchant.example/oncepay/events",
        "description": "Orders",
        "event_types": ["payment.succeeded", "refund.succeeded"],
    });

    let response = create(&app, &app.tenant, &request).await;

    assert_eq!(response.status(), StatusCode::CREATED);
    let headers = response.headers().clone();
    let made: Value = response.json().await.unwrap();
    let id = made["id"].as_str().unwrap();
    assert_eq!(header(&headers, "location"), Some(format!("{ENDPOINTS}/{id}").as_str()));
    assert_eq!(header(&headers, "cache-control"), Some("no-store"));
    assert_eq!(made["url"], "https://merchant.example/oncepay/events");
    assert_eq!(made["description"], "Orders");
    assert_eq!(made["event_types"], json!(["payment.succeeded", "refund.succeeded"]));
    assert_eq!(made["enabled"], true);
    assert!(made.get("disabled_reason").is_none(), "{made}");
    let secret = made["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert!(WebhookSecret::parse(secret).is_ok());
    assert!(STANDARD.decode(&secret["whsec_".len()..]).unwrap().len() >= 24);

    let read = call(&app, &app.tenant, Method::GET, &format!("{ENDPOINTS}/{id}")).send().await.unwrap();

    assert_eq!(read.status(), StatusCode::OK);
    let mut shown: Value = read.json().await.unwrap();
    assert!(shown.get("secret").is_none(), "{shown}");
    shown["secret"] = made["secret"].clone();
    assert_eq!(shown, made);
    let stored = sqlx::query_scalar!(
        "SELECT secret FROM merchant_endpoints WHERE endpoint_id = $1",
        Uuid::parse_str(id).unwrap()
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(stored, secret);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn webhook_endpoints_are_listed_oldest_first_and_only_to_their_tenant(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let other = create_tenant(&app.db, "globex", None).await;
    let first = created(&app, &app.tenant, "https://merchant.example/first").await;
    let theirs = created(&app, &other, "https://globex.example/hooks").await;
    let second = created(&app, &app.tenant, "https://merchant.example/second").await;

    let list: Value = call(&app, &app.tenant, Method::GET, ENDPOINTS).send().await.unwrap().json().await.unwrap();

    let ids: Vec<&Value> = list["data"].as_array().unwrap().iter().map(|endpoint| &endpoint["id"]).collect();
    assert_eq!(ids, [&first["id"], &second["id"]]);
    assert!(list["data"].as_array().unwrap().iter().all(|endpoint| endpoint.get("secret").is_none()), "{list}");
    let theirs_path = path_of(&theirs);
    let requests = [
        call(&app, &app.tenant, Method::GET, &theirs_path),
        call(&app, &app.tenant, Method::PATCH, &theirs_path).json(&json!({"enabled": false})),
        call(&app, &app.tenant, Method::DELETE, &theirs_path),
        call(&app, &app.tenant, Method::POST, &format!("{theirs_path}/rotate-secret")),
        call(&app, &app.tenant, Method::GET, &format!("{ENDPOINTS}/not-a-uuid")),
        call(&app, &app.tenant, Method::GET, &format!("{ENDPOINTS}/{}", Uuid::now_v7())),
    ];
    for request in requests {
        assert_problem(request.send().await.unwrap(), StatusCode::NOT_FOUND, "not-found").await;
    }
    let untouched: Value = call(&app, &other, Method::GET, &theirs_path).send().await.unwrap().json().await.unwrap();
    assert_eq!(untouched["enabled"], true);
    assert_eq!(untouched["updated_at"], theirs["updated_at"]);
    let stored = sqlx::query_scalar!(
        "SELECT secret FROM merchant_endpoints WHERE endpoint_id = $1",
        Uuid::parse_str(theirs["id"].as_str().unwrap()).unwrap()
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(stored, theirs["secret"].as_str().unwrap(), "not rotated");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn webhook_endpoints_must_be_public_https_urls_unless_the_settings_allow_more(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options.clone()).await;

    for url in ["http://merchant.example/hooks", "https://127.0.0.1/", "https://169.254.169.254/latest", "hooks"] {
        let response = create(&app, &app.tenant, &json!({"url": url})).await;

        let (_, problem) = assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "invalid-request").await;
        assert_eq!(problem["errors"][0]["field"], "url", "{url}: {problem}");
    }
    assert_eq!(endpoint_rows(&app.db).await, 0);
    let lenient = app
        .spawn_beside(options, |settings| {
            settings.events.urls.allow_http = true;
            settings.events.urls.allow_private_addresses = true;
        })
        .await;
    let local = created(&lenient, &lenient.tenant, "http://127.0.0.1:8000/hooks").await;
    assert_eq!(local["url"], "http://127.0.0.1:8000/hooks");
    let moved = call(&app, &app.tenant, Method::PATCH, &path_of(&local))
        .json(&json!({"url": "https://10.0.0.7/hooks"}))
        .send()
        .await
        .unwrap();
    assert_problem(moved, StatusCode::UNPROCESSABLE_ENTITY, "invalid-request").await;
    lenient.stop().await;
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn webhook_endpoints_refuse_an_unknown_event_type_by_name_and_any_other_wrong_body(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let url = "https://merchant.example/hooks";

    let unknown = create(&app, &app.tenant, &json!({"url": url, "event_types": ["payment.charged"]})).await;

    let (_, problem) = assert_problem(unknown, StatusCode::UNPROCESSABLE_ENTITY, "invalid-request").await;
    assert_eq!(problem["errors"][0]["field"], "event_types[0]");
    assert!(problem["detail"].as_str().unwrap().contains("`payment.charged`"), "{problem}");
    let long = "d".repeat(1001);
    for body in [
        json!({"url": url, "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}),
        json!({"url": url, "description": long}),
        json!({"url": url, "enabled": false}),
        json!({"description": "no url"}),
    ] {
        let response = create(&app, &app.tenant, &body).await;

        assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "invalid-request").await;
    }
    let malformed =
        call(&app, &app.tenant, Method::POST, ENDPOINTS).header("content-type", "application/json").body("{").send();
    assert_problem(malformed.await.unwrap(), StatusCode::BAD_REQUEST, "invalid-request").await;
    let text = call(&app, &app.tenant, Method::POST, ENDPOINTS).header("content-type", "text/plain").body("{}").send();
    assert_problem(text.await.unwrap(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type").await;
    assert_eq!(endpoint_rows(&app.db).await, 0);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn webhook_endpoints_are_changed_disabled_by_the_merchant_and_enabled_again(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let endpoint = created(&app, &app.tenant, "https://merchant.example/hooks").await;
    let path = path_of(&endpoint);
    let patch = |body: Value| call(&app, &app.tenant, Method::PATCH, &path).json(&body).send();

    let changed: Value =
        patch(json!({"url": "https://merchant.example/v2", "description": "v2", "event_types": ["refund.failed"]}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let disabled = patch(json!({"enabled": false})).await.unwrap();

    assert_eq!(changed["url"], "https://merchant.example/v2");
    assert_eq!(changed["description"], "v2");
    assert_eq!(changed["event_types"], json!(["refund.failed"]));
    assert!(changed.get("secret").is_none(), "{changed}");
    assert_eq!(disabled.status(), StatusCode::OK);
    let disabled: Value = disabled.json().await.unwrap();
    assert_eq!(disabled["enabled"], false);
    assert_eq!(disabled["disabled_reason"], "merchant");
    assert_eq!(disabled["url"], "https://merchant.example/v2", "a change keeps what it leaves out");

    let refused = patch(json!({"event_types": ["payment.succeeded", "nope"], "enabled": true})).await.unwrap();
    let enabled: Value = patch(json!({"enabled": true})).await.unwrap().json().await.unwrap();

    assert_problem(refused, StatusCode::UNPROCESSABLE_ENTITY, "invalid-request").await;
    assert_eq!(enabled["enabled"], true);
    assert!(enabled.get("disabled_reason").is_none(), "{enabled}");
    assert_eq!(enabled["event_types"], json!(["refund.failed"]), "the refused change wrote nothing");
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn webhook_endpoints_get_a_new_secret_and_the_previous_one_keeps_signing_for_the_overlap(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let endpoint = created(&app, &app.tenant, "https://merchant.example/hooks").await;
    let old = endpoint["secret"].as_str().unwrap();

    let response =
        call(&app, &app.tenant, Method::POST, &format!("{}/rotate-secret", path_of(&endpoint))).send().await.unwrap();

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(response.headers(), "cache-control"), Some("no-store"));
    let rotated: Value = response.json().await.unwrap();
    let new = rotated["secret"].as_str().unwrap();
    assert_ne!(new, old);
    assert!(WebhookSecret::parse(new).is_ok());
    assert_eq!(rotated["id"], endpoint["id"]);
    let row = sqlx::query!(
        r#"SELECT secret, previous_secret,
                  EXTRACT(EPOCH FROM previous_secret_until - updated_at)::float8 AS "overlap_secs!"
           FROM merchant_endpoints WHERE endpoint_id = $1"#,
        Uuid::parse_str(endpoint["id"].as_str().unwrap()).unwrap()
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(row.secret, new);
    assert_eq!(row.previous_secret.as_deref(), Some(old));
    assert!((row.overlap_secs - 86_400.0).abs() < 1.0, "events.rotation_overlap_secs: {}", row.overlap_secs);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn webhook_endpoints_once_deleted_are_gone(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let endpoint = created(&app, &app.tenant, "https://merchant.example/hooks").await;
    let path = path_of(&endpoint);

    let deleted = call(&app, &app.tenant, Method::DELETE, &path).send().await.unwrap();

    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    for method in [Method::GET, Method::DELETE] {
        let response = call(&app, &app.tenant, method, &path).send().await.unwrap();

        assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    }
    let list: Value = call(&app, &app.tenant, Method::GET, ENDPOINTS).send().await.unwrap().json().await.unwrap();
    assert_eq!(list, json!({"data": []}));
    assert_eq!(endpoint_rows(&app.db).await, 0);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn webhook_endpoints_need_an_api_key_and_refuse_other_methods(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let one = format!("{ENDPOINTS}/{}", Uuid::now_v7());
    let rotate = format!("{one}/rotate-secret");

    let anonymous = app.request(Method::POST, ENDPOINTS).json(&json!({"url": "https://merchant.example/"})).send();
    assert_problem(anonymous.await.unwrap(), StatusCode::UNAUTHORIZED, "unauthorized").await;
    for (method, path, allow) in [
        (Method::PUT, ENDPOINTS, "GET, POST"),
        (Method::PUT, one.as_str(), "DELETE, GET, PATCH"),
        (Method::GET, rotate.as_str(), "POST"),
    ] {
        let response = call(&app, &app.tenant, method.clone(), path).send().await.unwrap();

        let (headers, _) = assert_problem(response, StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed").await;
        assert_eq!(header(&headers, "allow"), Some(allow), "{method} {path}");
    }
    assert_eq!(endpoint_rows(&app.db).await, 0);
    app.stop().await;
}

/// `POST /v1/webhook-endpoints` with `body` and `Idempotency-Key: key` as `tenant`.
async fn create_with_key(app: &TestApp, tenant: &Tenant, key: &str, body: &Value) -> Response {
    call(app, tenant, Method::POST, ENDPOINTS).header("Idempotency-Key", key).json(body).send().await.unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_create_sent_again_with_its_key_answers_the_endpoint_it_made(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let body = json!({"url": "https://merchant.example/oncepay/events", "event_types": ["payment.succeeded"]});

    let first = create_with_key(&app, &app.tenant, "endpoint-1", &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(header(first.headers(), "idempotent-replayed"), None);
    assert!(header(first.headers(), "idempotency-key-expires").is_some());
    let made: Value = first.json().await.unwrap();
    // The same request again, as a client does after a timeout: the same endpoint, its secret too.
    let again = create_with_key(&app, &app.tenant, "endpoint-1", &body).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(header(again.headers(), "idempotent-replayed"), Some("true"));
    assert_eq!(header(again.headers(), "location"), Some(path_of(&made).as_str()));
    let replayed: Value = again.json().await.unwrap();
    assert_eq!(replayed, made);
    assert_eq!(endpoint_rows(&app.db).await, 1);

    // The key with another body is refused, and nothing is written.
    let other = json!({"url": "https://merchant.example/other"});
    let reused = create_with_key(&app, &app.tenant, "endpoint-1", &other).await;
    let (headers, _) = assert_problem(reused, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    assert!(header(&headers, "idempotency-key-expires").is_some());
    assert_eq!(endpoint_rows(&app.db).await, 1);
    // A key is the tenant's own: another tenant's same key makes its own endpoint.
    let other_tenant = create_tenant(&app.db, "other", None).await;
    let theirs = create_with_key(&app, &other_tenant, "endpoint-1", &other).await;
    assert_eq!(theirs.status(), StatusCode::CREATED);
    assert_eq!(header(theirs.headers(), "idempotent-replayed"), None);
    // Without a key, every create makes an endpoint.
    created(&app, &app.tenant, "https://merchant.example/oncepay/events").await;
    created(&app, &app.tenant, "https://merchant.example/oncepay/events").await;
    assert_eq!(endpoint_rows(&app.db).await, 4);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_create_with_a_malformed_key_is_refused_and_writes_nothing(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let body = json!({"url": "https://merchant.example/oncepay/events"});

    let refused = create_with_key(&app, &app.tenant, "\"unterminated", &body).await;

    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    assert_eq!(endpoint_rows(&app.db).await, 0);
    app.stop().await;
}

/// Writes a `payment.succeeded` event of `tenant`, queued for its endpoints; its id.
async fn event_of(db: &PgPool, tenant: &Tenant) -> Uuid {
    let event = oncepay_store::merchant_events::NewEvent {
        event_type: oncepay_domain::merchant_event::EventType::PaymentSucceeded,
        payment_id: Some(Uuid::now_v7()),
        refund_id: None,
        sequence: Some(3),
        data: json!({"status": "succeeded"}),
    };
    let mut conn = db.acquire().await.unwrap();
    oncepay_store::merchant_events::write(&mut conn, tenant.id, &[event]).await.unwrap();
    sqlx::query_scalar("SELECT event_id FROM merchant_events WHERE tenant_id = $1 ORDER BY event_order DESC LIMIT 1")
        .bind(tenant.id.as_uuid())
        .fetch_one(db)
        .await
        .unwrap()
}

/// Each delivery's event type, state and attempts, oldest first.
async fn deliveries(db: &PgPool) -> Vec<(String, String, i32)> {
    sqlx::query_as(
        "SELECT e.type, d.state, d.attempts FROM merchant_deliveries d
         JOIN merchant_events e USING (tenant_id, event_id) ORDER BY e.event_order",
    )
    .fetch_all(db)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_test_event_is_queued_for_the_endpoint_alone(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let only_refunds = json!({"url": "https://merchant.example/refunds", "event_types": ["refund.succeeded"]});
    let endpoint: Value = create(&app, &app.tenant, &only_refunds).await.json().await.unwrap();
    created(&app, &app.tenant, "https://merchant.example/all").await;
    let other = create_tenant(&app.db, "globex", None).await;

    let tested = call(&app, &app.tenant, Method::POST, &format!("{}/test", path_of(&endpoint))).send().await.unwrap();
    let elsewhere = call(&app, &other, Method::POST, &format!("{}/test", path_of(&endpoint))).send().await.unwrap();

    assert_eq!(tested.status(), StatusCode::ACCEPTED);
    let queued: Value = tested.json().await.unwrap();
    assert_eq!(elsewhere.status(), StatusCode::NOT_FOUND);
    let rows: Vec<(Uuid, Uuid, String)> = sqlx::query_as(
        "SELECT d.endpoint_id, d.event_id, e.type FROM merchant_deliveries d JOIN merchant_events e USING (tenant_id, event_id)",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    let expected_endpoint: Uuid = endpoint["id"].as_str().unwrap().parse().unwrap();
    let expected_event: Uuid = queued["event_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(rows, [(expected_endpoint, expected_event, "endpoint.test".to_owned())], "whatever types it takes");
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_merchant_replays_an_event_and_an_endpoints_dead_letters_since_a_time(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn(options).await;
    let endpoint = created(&app, &app.tenant, "https://merchant.example/all").await;
    let event_id = event_of(&app.db, &app.tenant).await;
    let other = create_tenant(&app.db, "globex", None).await;
    sqlx::query("UPDATE merchant_deliveries SET state = 'dead_lettered', attempts = 10")
        .execute(&app.db)
        .await
        .unwrap();
    let replay = format!("{}/replay", path_of(&endpoint));
    let send = |tenant: &Tenant, path: &str, body: Value| call(&app, tenant, Method::POST, path).json(&body).send();

    let no_since = send(&app.tenant, &replay, json!({})).await.unwrap();
    let not_a_time = send(&app.tenant, &replay, json!({"since": "yesterday"})).await.unwrap();
    let elsewhere = send(&other, &replay, json!({"since": "2000-01-01T00:00:00Z"})).await.unwrap();
    let unchanged = deliveries(&app.db).await;
    let later = send(&app.tenant, &replay, json!({"since": "2999-01-01T00:00:00Z"})).await.unwrap();
    let earlier = send(&app.tenant, &replay, json!({"since": "2000-01-01T00:00:00Z"})).await.unwrap();
    let after_since = deliveries(&app.db).await;
    sqlx::query("UPDATE merchant_deliveries SET state = 'delivered', attempts = 1").execute(&app.db).await.unwrap();
    let event_path = format!("/v1/events/{event_id}/replay");
    let by_another = call(&app, &other, Method::POST, &event_path).send().await.unwrap();
    let again = call(&app, &app.tenant, Method::POST, &event_path).send().await.unwrap();

    assert_problem(no_since, StatusCode::UNPROCESSABLE_ENTITY, "invalid-request").await;
    assert_problem(not_a_time, StatusCode::UNPROCESSABLE_ENTITY, "invalid-request").await;
    assert_eq!(elsewhere.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        unchanged,
        [("payment.succeeded".to_owned(), "dead_lettered".to_owned(), 10)],
        "refusals change nothing"
    );
    assert_eq!(later.status(), StatusCode::ACCEPTED);
    assert_eq!(later.json::<Value>().await.unwrap(), json!({"deliveries": 0}));
    assert_eq!(earlier.json::<Value>().await.unwrap(), json!({"deliveries": 1}));
    assert_eq!(after_since, [("payment.succeeded".to_owned(), "pending".to_owned(), 0)], "the schedule starts again");
    assert_eq!(by_another.status(), StatusCode::NOT_FOUND);
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    assert_eq!(again.json::<Value>().await.unwrap(), json!({"deliveries": 1}));
    assert_eq!(deliveries(&app.db).await, [("payment.succeeded".to_owned(), "pending".to_owned(), 0)]);
}
