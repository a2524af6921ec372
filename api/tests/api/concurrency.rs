//! Identical requests racing each other.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::Barrier;

use crate::helpers::{Rows, TestApp, body};

#[sqlx::test(migrator = "oncepay_store::db::MIGRATOR")]
async fn fifty_identical_requests_released_at_once_make_one_payment_and_all_get_its_id(
    _: PgPoolOptions,
    options: PgConnectOptions,
) {
    const REQUESTS: usize = 50;
    let app = TestApp::spawn(options).await;
    let barrier = Arc::new(Barrier::new(REQUESTS));
    let racers: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let request = app.post_payment("order-1", &body());
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                let response = request.send().await.unwrap();
                let status = response.status();
                let replayed = response.headers().get("idempotent-replayed").is_some();
                let body: Value = response.json().await.unwrap();
                (status, replayed, body)
            })
        })
        .collect();

    let mut answers = Vec::with_capacity(REQUESTS);
    for racer in racers {
        answers.push(racer.await.unwrap());
    }

    assert!(answers.iter().all(|(status, _, _)| !status.is_server_error()), "{answers:?}");
    assert!(answers.iter().all(|(status, _, _)| *status == StatusCode::ACCEPTED), "{answers:?}");
    let ids: Vec<&Value> = answers.iter().map(|(_, _, body)| &body["id"]).collect();
    assert!(ids[0].is_string());
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(answers.iter().filter(|(_, replayed, _)| !replayed).count(), 1, "exactly one request created it");
    assert_eq!(app.rows().await, Rows { payments: 1, keys: 1, outbox: 1, events: 1 });
    app.stop().await;
}
