//! 401: every way of not presenting a live API key of a tenant.

use std::time::{Duration, Instant};

use oncepay_devkit::wait::wait_until;
use oncepay_domain::api_key;
use oncepay_store::tenants;
use reqwest::{RequestBuilder, Response, StatusCode};
use secrecy::ExposeSecret;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::helpers::{Tenant, TestApp, assert_problem, body, header};

/// How long to wait for what the api does on its own.
const PATIENCE: Duration = Duration::from_secs(10);

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_request_without_an_api_key_is_unauthorized(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;

    let response = app
        .request(reqwest::Method::POST, "/v1/payments")
        .header("Idempotency-Key", "k-1")
        .json(&body())
        .send()
        .await
        .unwrap();

    let (headers, _) = assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_eq!(header(&headers, "www-authenticate"), Some("Bearer"));
    assert_eq!(app.rows().await.payments, 0);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn malformed_authorization_headers_are_unauthorized(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let token = app.tenant.token.clone();
    let malformed = [
        format!("Basic {token}"),
        "Bearer".to_owned(),
        "Bearer not-a-key".to_owned(),
        format!("Bearer {}", token.replace("opk_", "sk_")),
        format!("Bearer {}", &token[..token.len() - 3]),
    ];

    for value in malformed {
        let response = app
            .request(reqwest::Method::GET, &format!("/v1/payments/{}", uuid::Uuid::now_v7()))
            .header("Authorization", value.as_str())
            .send()
            .await
            .unwrap();

        assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_of_the_tenant_with_a_wrong_secret_is_unauthorized(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    // Authenticate once with the right secret so the key is cached: the cache must not let the
    // wrong secret through either.
    let ok = app.get_payment(&uuid::Uuid::now_v7().to_string()).send().await.unwrap();
    assert_eq!(ok.status(), StatusCode::NOT_FOUND);
    // The last characters of a token encode its secret.
    let mut tampered = app.tenant.token.clone().into_bytes();
    let at = tampered.len() - 2;
    tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    assert!(api_key::parse(&tampered).is_some(), "still a well-formed token of the same key");

    let response = app.post_payment("k-1", &body()).bearer_auth(&tampered).send().await.unwrap();

    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_eq!(app.rows().await.payments, 0);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_unknown_to_its_tenant_is_unauthorized(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let never_stored = api_key::generate(app.tenant.id);

    let response = app.post_payment("k-1", &body()).bearer_auth(api_key::reveal(&never_stored)).send().await.unwrap();

    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_revoked_key_is_unauthorized(_: PgPoolOptions, options: PgConnectOptions) {
    let app = TestApp::spawn(options).await;
    let presented = api_key::parse(&app.tenant.token).unwrap();
    let mut conn = app.db.acquire().await.unwrap();
    assert!(tenants::revoke_api_key(&mut conn, app.tenant.id, &presented.key_id).await.unwrap());
    drop(conn);

    let response = app.post_payment("k-1", &body()).send().await.unwrap();

    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_eq!(app.rows().await.payments, 0);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_key_revoked_after_use_is_refused_once_the_cache_ttl_has_passed(_: PgPoolOptions, options: PgConnectOptions) {
    // A TTL of zero: revocation takes effect on the very next request.
    let app = TestApp::spawn_with(options, |settings| settings.auth.cache_ttl_secs = 0).await;
    let first = app.post_payment("k-1", &body()).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let presented = api_key::parse(&app.tenant.token).unwrap();
    let mut conn = app.db.acquire().await.unwrap();
    tenants::revoke_api_key(&mut conn, app.tenant.id, &presented.key_id).await.unwrap();
    drop(conn);

    let after = app.post_payment("k-2", &body()).send().await.unwrap();

    assert_problem(after, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_eq!(app.rows().await.payments, 1);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn a_flood_of_unknown_keys_cannot_take_the_connections_of_a_real_tenant(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    let app = TestApp::spawn_with(options, |settings| {
        settings.http.workers = 1;
        settings.database.max_connections = 4;
        settings.database.acquire_timeout_ms = 1_000;
        settings.auth.max_concurrent_lookups = 1;
        // The blocked key reads below wait for the lock rather than give up after half a second.
        settings.intake.key_lock_wait_ms = 10_000;
    })
    .await;
    // The tenant's key is verified once before the flood, as a busy tenant's always is.
    assert_eq!(app.post_payment("order-0", &body()).send().await.unwrap().status(), StatusCode::ACCEPTED);
    // From now on every read of a key waits: a transaction holds the keys' table.
    let mut blocker = app.db.begin().await.unwrap();
    sqlx::query!("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE").execute(&mut *blocker).await.unwrap();
    let flood: Vec<_> = (0..16)
        .map(|i| {
            let unknown = api_key::generate(app.tenant.id).token.expose_secret().to_owned();
            let request = app
                .request(reqwest::Method::POST, "/v1/payments")
                .bearer_auth(unknown)
                .header("Idempotency-Key", format!("flood-{i}"))
                .json(&body());
            tokio::spawn(request.send())
        })
        .collect();
    wait_until("a key read to wait for the lock", PATIENCE, || async {
        (lookups_waiting(&app).await > 0).then_some(())
    })
    .await
    .unwrap();
    // Not a timing assertion: time for the rest of the flood to reach the api before the tenant.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let real = app.post_payment("order-1", &body()).send().await.unwrap();

    assert_eq!(real.status(), StatusCode::ACCEPTED, "the tenant lost its connections to the flood");
    blocker.rollback().await.unwrap();
    for answer in flood {
        let status = answer.await.unwrap().unwrap().status();
        assert!(
            [StatusCode::UNAUTHORIZED, StatusCode::SERVICE_UNAVAILABLE].contains(&status),
            "an unknown key was answered {status}"
        );
    }
    assert_eq!(app.rows().await.payments, 2);
    app.stop().await;
}

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn under_a_flood_of_made_up_keys_a_revoked_key_is_refused_once_the_cache_ttl_has_passed(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    const TTL: Duration = Duration::from_secs(1);
    let app = TestApp::spawn_with(options, |settings| {
        settings.auth.cache_ttl_secs = TTL.as_secs();
        settings.auth.max_concurrent_lookups = 1;
        settings.auth.lookup_wait_ms = 20;
        // A key read held up by the lock below waits for it rather than give up after half a second.
        settings.intake.key_lock_wait_ms = 10_000;
    })
    .await;
    let mut conn = app.db.acquire().await.unwrap();
    let rotated = tenants::issue_api_key(&mut conn, app.tenant.id, Some("rotated out")).await.unwrap();
    let revoked = Tenant { id: app.tenant.id, token: api_key::reveal(&rotated).to_owned() };
    // Both keys of the tenant are in use, so both are verified and cached.
    for (key, tenant) in [("live-0", &app.tenant), ("revoked-0", &revoked)] {
        let response = app.post_payment_as(tenant, key, &body()).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
    }
    let last_verified = Instant::now();
    assert!(tenants::revoke_api_key(&mut conn, app.tenant.id, &rotated.key_id).await.unwrap());
    drop(conn);
    let flood = Flood::start(&app, 16);
    // The bound under test: the TTL since the keys were last verified.
    tokio::time::sleep_until((last_verified + TTL).into()).await;

    let after_revocation =
        sent_while_the_flood_holds_the_lookups(&app, app.post_payment_as(&revoked, "revoked-1", &body())).await;
    let live = sent_while_the_flood_holds_the_lookups(&app, app.post_payment("live-1", &body())).await;

    assert_problem(after_revocation, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_eq!(live.status(), StatusCode::ACCEPTED, "a live key past its TTL was refused under the flood");
    let flooded = flood.stop().await;
    assert!(!flooded.is_empty());
    for status in flooded {
        assert!(
            [StatusCode::UNAUTHORIZED, StatusCode::SERVICE_UNAVAILABLE].contains(&status),
            "a made-up key was answered {status}"
        );
    }
    assert_eq!(app.rows().await.payments, 3);
    app.stop().await;
}

/// Requests with a made-up key of the tenant, a new one each time (a refused key is remembered),
/// from many tasks at once, until stopped.
struct Flood {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<Vec<StatusCode>>>,
}

impl Flood {
    fn start(app: &TestApp, tasks: usize) -> Self {
        let stop = CancellationToken::new();
        let tasks = (0..tasks)
            .map(|task| {
                let (client, url, tenant_id, stop) =
                    (app.client.clone(), format!("{}/v1/payments", app.address), app.tenant.id, stop.clone());
                tokio::spawn(async move {
                    let mut statuses = Vec::new();
                    for n in 0.. {
                        if stop.is_cancelled() {
                            break;
                        }
                        let made_up = api_key::generate(tenant_id).token.expose_secret().to_owned();
                        let request = client
                            .post(&url)
                            .bearer_auth(made_up)
                            .header("Idempotency-Key", format!("flood-{task}-{n}"))
                            .json(&body());
                        statuses.push(request.send().await.unwrap().status());
                    }
                    statuses
                })
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops the flood; the status of every response it got.
    async fn stop(self) -> Vec<StatusCode> {
        self.stop.cancel();
        let mut statuses = Vec::new();
        for task in self.tasks {
            statuses.extend(task.await.unwrap());
        }
        statuses
    }
}

/// Sends `request` while a made-up key's read holds the only place for key reads: a transaction
/// locks the keys' table, so that read waits, and the rest of the flood finds no place free. The
/// lock is released once `request` has its response or waits for a read of its own.
async fn sent_while_the_flood_holds_the_lookups(app: &TestApp, request: RequestBuilder) -> Response {
    let mut blocker = app.db.begin().await.unwrap();
    sqlx::query!("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE").execute(&mut *blocker).await.unwrap();
    wait_until("a key read to wait for the lock", PATIENCE, || async {
        (lookups_waiting(app).await > 0).then_some(())
    })
    .await
    .unwrap();
    let response = tokio::spawn(request.send());
    wait_until("the request's response, or its own key read", PATIENCE, || async {
        (response.is_finished() || lookups_waiting(app).await >= 2).then_some(())
    })
    .await
    .unwrap();
    blocker.rollback().await.unwrap();
    response.await.unwrap().unwrap()
}

/// The api's statements waiting on a lock.
async fn lookups_waiting(app: &TestApp) -> i64 {
    sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM pg_stat_activity WHERE application_name LIKE 'oncepay-api%' AND wait_event_type = 'Lock'"#)
    .fetch_one(&app.db)
    .await
    .unwrap()
}
