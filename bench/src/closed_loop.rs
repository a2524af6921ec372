//! Closed loops of HTTP requests from tasks of the benchmark process, for the reconciler's
//! endpoints: each connection sends its next request as soon as it has read the previous response,
//! from now until the window that opens after the warm-up closes. Responses inside the window
//! count, by status, with their latencies.
//!
//! The requests are `reqwest`'s, so their CPU time is the `bench` role's, not the reconciler's.
//! Redirects are not followed: a 303 is a response like any other. Nothing here starts a process or
//! talks to PostgreSQL.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::latency::Latencies;
use crate::measure::Timing;

/// What a closed loop measured inside its window.
#[derive(Debug, Default)]
pub struct Window {
    /// Responses inside the window, by status (0: no response, a transport error).
    pub statuses: BTreeMap<u16, u64>,
    /// Their latencies.
    pub latencies: Latencies,
}

impl Window {
    /// Responses inside the window.
    pub fn responded(&self) -> u64 {
        self.statuses.values().sum()
    }

    fn merge(&mut self, other: Window) {
        for (status, count) in other.statuses {
            *self.statuses.entry(status).or_default() += count;
        }
        self.latencies.merge(other.latencies);
    }
}

/// Runs `connections` closed loops of the requests `request` builds, and returns what they
/// measured. `request` is given the request's number, counted from 0 over every connection, so a
/// load can go round a set of requests or make each one unique.
pub async fn run<F>(connections: usize, timing: Timing, request: F) -> anyhow::Result<Window>
where
    F: Fn(&reqwest::Client, u64) -> reqwest::RequestBuilder + Send + Sync + 'static,
{
    let request = Arc::new(request);
    let sent = Arc::new(AtomicU64::new(0));
    let from = Instant::now() + timing.warmup;
    let until = from + timing.window;
    let mut loops = JoinSet::new();
    for _ in 0..connections {
        let (request, sent) = (Arc::clone(&request), Arc::clone(&sent));
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
        loops.spawn(async move {
            let mut window = Window::default();
            while Instant::now() < until {
                let number = sent.fetch_add(1, Ordering::Relaxed);
                let started = Instant::now();
                let status = match request(&client, number).send().await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        // The whole body, as a browser reads it: rendering and sending it is part of the cost.
                        let _ = response.bytes().await;
                        status
                    }
                    Err(_) => 0,
                };
                if started >= from && Instant::now() <= until {
                    *window.statuses.entry(status).or_default() += 1;
                    window.latencies.record(started.elapsed());
                }
            }
            window
        });
    }
    let mut total = Window::default();
    while let Some(finished) = loops.join_next().await {
        total.merge(finished?);
    }
    Ok(total)
}
