//! PostgreSQL crashing under load: the api fails closed (503 + `Retry-After`), and afterwards the
//! database holds nothing partial and nothing that was accepted is lost.

use std::collections::HashMap;
use std::time::Duration;

use oncepay_api::Application;
use oncepay_devkit::pg::{Cluster, Durability};
use oncepay_store::db;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::helpers::{self, TestApp, body, rows};

/// What one request got.
#[derive(Debug)]
struct Response {
    key: String,
    status: StatusCode,
    retry_after: bool,
    payment_id: Option<String>,
}

#[tokio::test]
async fn a_database_crash_mid_run_fails_closed_and_leaves_nothing_partial() {
    // Arrange: a durable cluster (a crash loses no committed transaction), migrated, and the api.
    let mut cluster = Cluster::start(Durability::Durable).await.unwrap();
    cluster.create_database("oncepay").await.unwrap();
    let url = cluster.url("oncepay");
    let db = PgPoolOptions::new().max_connections(2).connect(&url).await.unwrap();
    db::migrate(&db).await.unwrap();
    let mut settings = helpers::settings();
    settings.database.url = cluster.url_as("oncepay_api", "oncepay").into();
    settings.database.acquire_timeout_ms = 500;
    let app = TestApp::start(Application::build(settings).unwrap(), db).await;

    // Four clients send payments with fresh keys until told to stop, reporting every response.
    let (responses_tx, mut responses) = mpsc::unbounded_channel::<Response>();
    let stop = CancellationToken::new();
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let (app_client, address, token) = (app.client.clone(), app.address.clone(), app.tenant.token.clone());
            let (responses_tx, stop) = (responses_tx.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.is_cancelled() {
                    n += 1;
                    let key = format!("client-{client}-{n}");
                    let response = send(&app_client, &address, &token, &key).await;
                    if responses_tx.send(response).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    drop(responses_tx);
    let mut seen: Vec<Response> = Vec::new();
    let mut next = async || {
        let response = tokio::time::timeout(Duration::from_secs(30), responses.recv()).await.unwrap().unwrap();
        seen.push(response);
        seen.last().map(|a| a.status).unwrap()
    };
    let mut accepted_before = 0;
    while accepted_before < 20 {
        accepted_before += usize::from(next().await == StatusCode::ACCEPTED);
    }

    // Act: crash PostgreSQL under load, let clients hit the dead store, then bring it back.
    cluster.crash().await.unwrap();
    let mut unavailable = 0;
    while unavailable < 8 {
        unavailable += usize::from(next().await == StatusCode::SERVICE_UNAVAILABLE);
    }
    cluster.resume().await.unwrap();
    let mut accepted_after = 0;
    while accepted_after < 20 {
        accepted_after += usize::from(next().await == StatusCode::ACCEPTED);
    }
    stop.cancel();
    for client in clients {
        client.await.unwrap();
    }
    while let Ok(response) = responses.try_recv() {
        seen.push(response);
    }
    // Every request that was refused is retried with its key, as a client would.
    let mut retried = HashMap::new();
    for response in seen.iter().filter(|a| a.status == StatusCode::SERVICE_UNAVAILABLE) {
        let retry = send(&app.client, &app.address, &app.tenant.token, &response.key).await;
        assert!(retry.status.is_success(), "retry of {}: {retry:?}", response.key);
        retried.insert(response.key.clone(), retry.payment_id);
    }

    // Assert: only 202s and 503s were answered; every 503 carried Retry-After.
    for response in &seen {
        assert!(
            response.status == StatusCode::ACCEPTED || response.status == StatusCode::SERVICE_UNAVAILABLE,
            "{response:?}"
        );
        if response.status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(response.retry_after, "{response:?}");
        }
    }
    // Nothing accepted was lost, and every payment is whole: key, payment, outbox row, audit row.
    let stored: HashMap<String, String> = sqlx::query!(
        r#"SELECT k.idempotency_key, k.payment_id::text AS "payment_id!"
           FROM idempotency_keys k
           JOIN payments p USING (tenant_id, payment_id)
           JOIN outbox o USING (tenant_id, payment_id)
           WHERE EXISTS (SELECT 1 FROM payment_events e
                         WHERE e.tenant_id = p.tenant_id AND e.payment_id = p.payment_id AND e.from_status IS NULL)"#
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
    .into_iter()
    .map(|row| (row.idempotency_key, row.payment_id))
    .collect();
    for response in seen.iter().filter(|a| a.status == StatusCode::ACCEPTED) {
        assert_eq!(stored.get(&response.key), response.payment_id.as_ref(), "accepted {} was lost", response.key);
    }
    for (key, payment_id) in &retried {
        assert_eq!(stored.get(key), payment_id.as_ref(), "retried {key}");
    }
    let counts = rows(&app.db).await;
    let whole = i64::try_from(stored.len()).unwrap();
    assert_eq!((counts.payments, counts.keys, counts.outbox, counts.events), (whole, whole, whole, whole));
    app.stop().await;
}

async fn send(client: &reqwest::Client, address: &str, token: &str, key: &str) -> Response {
    let response = client
        .post(format!("{address}/v1/payments"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&body())
        .send()
        .await
        .unwrap();
    let status = response.status();
    let retry_after = response.headers().contains_key("retry-after");
    let payment_id = if status.is_success() {
        let body: Value = response.json().await.unwrap();
        body["id"].as_str().map(str::to_owned)
    } else {
        None
    };
    Response { key: key.to_owned(), status, retry_after, payment_id }
}
