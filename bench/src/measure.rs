//! One measured window each: a pgbench baseline, HTTP load on the api, a worker draining a backlog,
//! and accepts with draining at once. Each takes CPU samples at the window's edges and returns a
//! [`Row`]. Every window opens after a warm-up under the same load. Nothing here starts or stops a
//! binary: callers hand in what runs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::time::{Instant, sleep, sleep_until};

use crate::cpu::{ClientSource, CpuSampler, CpuUsage, Role};
use crate::dataset;
use crate::loadgen::{Generator, Measured, Plan, Workload};
use crate::pgbench::{self, Job};
use crate::raw::Baseline;
use crate::report::{Kind, Row};

/// How long to load before a window, and how long a window lasts.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Load before the window opens.
    pub warmup: Duration,
    /// The window.
    pub window: Duration,
}

/// A database to measure on.
pub struct Target<'a> {
    /// Its pool (a few connections for the benchmark's own queries).
    pub pool: &'a PgPool,
    /// The server's port.
    pub port: u16,
    /// The database's name.
    pub database: &'a str,
    /// How the report names its data.
    pub dataset: &'a str,
    /// The postmaster of every node, for CPU accounting.
    pub postmasters: &'a [i32],
}

impl Target<'_> {
    /// `CHECKPOINT`: what follows starts with no dirty pages of what came before.
    pub async fn checkpoint(&self) -> anyhow::Result<()> {
        let mut conn = self.pool.acquire().await?;
        dataset::checkpoint(&mut conn).await
    }

    async fn outbox_depth(&self) -> anyhow::Result<u64> {
        let mut conn = self.pool.acquire().await?;
        dataset::outbox_depth(&mut conn).await
    }
}

/// pgbench running `baseline` with `clients` connections.
pub async fn raw(
    target: &Target<'_>,
    timing: Timing,
    pgbench_program: &Path,
    baseline: Baseline,
    clients: u32,
    variables: &[(String, String)],
) -> anyhow::Result<Row> {
    target.checkpoint().await?;
    let script = baseline.script()?;
    let job = Job {
        program: pgbench_program,
        script: &script,
        clients,
        variables,
        // A second past the window, so pgbench is still running when it closes.
        duration: timing.warmup + timing.window + Duration::from_secs(1),
        port: target.port,
        database: target.database,
    };
    let sampler = CpuSampler::new(target.postmasters, ClientSource::Process);
    let running = job.spawn()?;
    let from = Instant::now() + timing.warmup;
    sleep_until(from).await;
    let (cpu_from, wall_from) = (sampler.sample(), SystemTime::now());
    sleep_until(from + timing.window).await;
    let (cpu_until, wall_until) = (sampler.sample(), SystemTime::now());
    let transactions = running.finish().await.with_context(|| format!("pgbench {}", baseline.name()))?;
    let (transactions, latencies) = pgbench::in_window(&transactions, wall_from, wall_until);
    let ops = transactions * baseline.operations_per_transaction();
    let cpu = cpu_until.since(&cpu_from);
    let seconds = wall_until.duration_since(wall_from)?.as_secs_f64();
    Ok(Row {
        kind: Kind::Raw,
        name: baseline.name().into(),
        concurrency: clients,
        setup: baseline.setup(),
        dataset: target.dataset.into(),
        ops,
        seconds,
        rate: ops as f64 / seconds,
        latency: latencies.summary(),
        errors: 0,
        cpu_seconds_per_op: Row::cost_per_op(&cpu, &[Role::Postgres], ops),
        cpu,
        comparison: None,
        extra: BTreeMap::new(),
    })
}

/// What HTTP load on the api measured, and the CPU it cost.
struct HttpWindow {
    measured: Measured,
    cpu: CpuUsage,
    /// Outbox rows at the window's edges.
    depth: (u64, u64),
    wall: (OffsetDateTime, OffsetDateTime),
}

async fn http_window(
    target: &Target<'_>,
    timing: Timing,
    api: &[SocketAddr],
    token: &str,
    workload: Workload,
    connections: usize,
) -> anyhow::Result<HttpWindow> {
    target.checkpoint().await?;
    let from = Instant::now() + timing.warmup;
    let until = from + timing.window;
    let generator = Generator::start(Plan {
        targets: api.to_vec(),
        connections,
        token: token.to_owned(),
        workload,
        measure_from: from,
        measure_until: until,
    })?;
    let sampler = CpuSampler::new(target.postmasters, ClientSource::Thread(generator.thread_id()));
    sleep_until(from).await;
    let (cpu_from, wall_from) = (sampler.sample(), OffsetDateTime::now_utc());
    let depth_from = target.outbox_depth().await?;
    sleep_until(until).await;
    let (cpu_until, wall_until) = (sampler.sample(), OffsetDateTime::now_utc());
    let depth_until = target.outbox_depth().await?;
    let measured = generator.finish().await?;
    if let Some(problem) = &measured.first_problem {
        eprintln!("bench:   {} unexpected responses, the first: {problem}", measured.errors());
    }
    Ok(HttpWindow {
        measured,
        cpu: cpu_until.since(&cpu_from),
        depth: (depth_from, depth_until),
        wall: (wall_from, wall_until),
    })
}

/// HTTP load on the api processes at `api`.
pub async fn service(
    target: &Target<'_>,
    timing: Timing,
    api: &[SocketAddr],
    token: &str,
    workload: Workload,
    connections: usize,
) -> anyhow::Result<Row> {
    Ok(service_in_window(target, timing, api, token, workload, connections).await?.0)
}

/// [`service`], and when its window opened and closed by the wall clock, for what else is counted
/// in the same window.
pub async fn service_in_window(
    target: &Target<'_>,
    timing: Timing,
    api: &[SocketAddr],
    token: &str,
    workload: Workload,
    connections: usize,
) -> anyhow::Result<(Row, (OffsetDateTime, OffsetDateTime))> {
    let groups_before = intake_groups(api).await?;
    let window = http_window(target, timing, api, token, workload, connections).await?;
    let groups = intake_groups(api).await? - groups_before;
    let ops = window.measured.completed;
    let errors = window.measured.errors();
    let setup = if api.len() == 1 { "1 api process".to_owned() } else { format!("{} api processes", api.len()) };
    let mut extra = BTreeMap::new();
    if groups.count > 0.0 {
        extra.insert("mean_group_size".into(), groups.requests / groups.count);
    }
    let row = Row {
        kind: Kind::Service,
        name: workload.name().into(),
        concurrency: u32::try_from(connections)?,
        setup,
        dataset: target.dataset.into(),
        ops,
        seconds: timing.window.as_secs_f64(),
        rate: ops as f64 / timing.window.as_secs_f64(),
        latency: window.measured.latencies.summary(),
        errors,
        cpu_seconds_per_op: Row::cost_per_op(&window.cpu, &[Role::Api, Role::Postgres], ops),
        cpu: window.cpu,
        comparison: None,
        extra,
    };
    Ok((row, window.wall))
}

/// The requests the api processes wrote to the store, and in how many groups, so far (their
/// `oncepay_api_intake_group_size` histograms), over the warm-up and the window together.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IntakeGroups {
    /// Requests written.
    pub(crate) requests: f64,
    /// Groups they were written in.
    pub(crate) count: f64,
}

impl std::ops::Sub for IntakeGroups {
    type Output = Self;

    fn sub(self, earlier: Self) -> Self {
        Self { requests: self.requests - earlier.requests, count: self.count - earlier.count }
    }
}

pub(crate) async fn intake_groups(api: &[SocketAddr]) -> anyhow::Result<IntakeGroups> {
    let client = reqwest::Client::new();
    let mut groups = IntakeGroups::default();
    for address in api {
        let text = client.get(format!("http://{address}/metrics")).send().await?.error_for_status()?.text().await?;
        for line in text.lines() {
            let value = |prefix: &str| line.strip_prefix(prefix).and_then(|v| v.trim().parse::<f64>().ok());
            if let Some(sum) = value("oncepay_api_intake_group_size_sum ") {
                groups.requests += sum;
            } else if let Some(count) = value("oncepay_api_intake_group_size_count ") {
                groups.count += count;
            }
        }
    }
    Ok(groups)
}

/// [`service`] accepts by the tenant of `token` while `flood_connections` more connections send
/// accepts with `flood_token`, an API key that does not exist, as fast as the api responds: what a
/// flood of made-up keys costs real tenants. The flood's responses per second are in `extra`.
#[allow(clippy::too_many_arguments)]
pub async fn service_under_flood(
    target: &Target<'_>,
    timing: Timing,
    api: &[SocketAddr],
    token: &str,
    flood_token: &str,
    connections: usize,
    flood_connections: usize,
) -> anyhow::Result<Row> {
    // The flood runs from before the tenant's warm-up until after its window (and checkpoint).
    let flood_from = Instant::now();
    let flood_until = flood_from + timing.warmup + timing.window + Duration::from_secs(5);
    let flood = Generator::start(Plan {
        targets: api.to_vec(),
        connections: flood_connections,
        token: flood_token.to_owned(),
        workload: Workload::Accept,
        measure_from: flood_from,
        measure_until: flood_until,
    })?;
    let row = service(target, timing, api, token, Workload::Accept, connections).await;
    let flooded = flood.finish().await?;
    let mut row = row?;
    let seconds = (flood_until - flood_from).as_secs_f64();
    row.setup.push_str(&format!(", {flood_connections} connections flooding unknown API keys"));
    row.extra.insert("flood_answers_per_s".into(), flooded.errors() as f64 / seconds);
    // A made-up key must never be accepted.
    row.extra.insert("flood_accepted".into(), flooded.completed as f64);
    for (kind, count) in &flooded.unexpected {
        row.extra.insert(format!("flood {kind}"), *count as f64);
    }
    Ok(row)
}

/// Workers, already started, draining a backlog: payments finished per second.
///
/// The window opens after the warm-up and closes after `timing.window`, or earlier once nine tenths
/// of the backlog are gone (the last rows drain slower as the queue empties, which is not the rate
/// asked about).
pub async fn drain(target: &Target<'_>, timing: Timing, workers: usize, started: Instant) -> anyhow::Result<Row> {
    let sampler = CpuSampler::new(target.postmasters, ClientSource::Process);
    sleep_until(started + timing.warmup).await;
    let cpu_from = sampler.sample();
    let depth_from = target.outbox_depth().await?;
    let from = Instant::now();
    let mut depth_until;
    loop {
        sleep(Duration::from_millis(500)).await;
        depth_until = target.outbox_depth().await?;
        if from.elapsed() >= timing.window || depth_until * 10 < depth_from {
            break;
        }
    }
    let cpu = sampler.sample().since(&cpu_from);
    let seconds = from.elapsed().as_secs_f64();
    let ops = depth_from.saturating_sub(depth_until);
    let mut extra = BTreeMap::new();
    extra.insert("backlog_at_start".into(), depth_from as f64);
    extra.insert("backlog_at_end".into(), depth_until as f64);
    Ok(Row {
        kind: Kind::Service,
        name: "drain".into(),
        concurrency: u32::try_from(workers)?,
        setup: format!("{workers} worker{}, simulator at 0 ms", if workers == 1 { "" } else { "s" }),
        dataset: target.dataset.into(),
        ops,
        seconds,
        rate: ops as f64 / seconds,
        latency: None,
        errors: 0,
        cpu_seconds_per_op: Row::cost_per_op(&cpu, &[Role::Worker, Role::Postgres], ops),
        cpu,
        comparison: None,
        extra,
    })
}

/// Where the outbox stands when accepts start arriving for [`accept_while_draining`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Empty, workers idle: does the outbox grow, and how long does a payment wait to be sent?
    Empty,
    /// A backlog of pending payments: how fast do the workers drain while the api accepts at full
    /// speed? With work always waiting, the drain is not held back by the arrival rate.
    Backlog,
}

/// Accepts over HTTP while workers (already started) drain.
///
/// The row's rate is the drain rate: accepted minus the outbox's growth, per second. A steady queue
/// drains exactly what arrives, so from an empty outbox the ratio to the accept rate is 1.0 at best
/// and says only whether the queue grew; from a backlog it is the workers' headroom over the accept
/// rate, and above 1.0 the queue shrinks while accepts run. From an empty outbox the row's latency is
/// each accepted payment's time from acceptance to its final status, read from the payments once
/// everything is drained (which this waits for); from a backlog that time is mostly the wait behind
/// the backlog, so none is given. The accept rate and latency are extras.
pub async fn accept_while_draining(
    target: &Target<'_>,
    timing: Timing,
    api: &[SocketAddr],
    token: &str,
    connections: usize,
    workers: usize,
    start: Start,
) -> anyhow::Result<Row> {
    let window = http_window(target, timing, api, token, Workload::Accept, connections).await?;
    let seconds = timing.window.as_secs_f64();
    let accepted = window.measured.completed;
    let growth = window.depth.1 as f64 - window.depth.0 as f64;
    let drained = (accepted as f64 - growth).max(0.0);

    let mut extra = BTreeMap::new();
    extra.insert("accept_rate".into(), accepted as f64 / seconds);
    if let Some(accept) = window.measured.latencies.clone().summary() {
        extra.insert("accept_p50_ms".into(), accept.p50_ms);
        extra.insert("accept_p99_ms".into(), accept.p99_ms);
    }
    extra.insert("outbox_growth_per_s".into(), growth / seconds);
    extra.insert("outbox_at_start".into(), window.depth.0 as f64);
    extra.insert("outbox_at_end".into(), window.depth.1 as f64);
    let latency = match start {
        Start::Empty => {
            wait_for_empty_outbox(target, Duration::from_secs(600)).await?;
            let settled = settle_latency(target.pool, window.wall).await?;
            extra.insert("settled_of_accepted_in_window".into(), settled.count as f64);
            settled.summary
        }
        Start::Backlog => None,
    };
    let (name, from) = match start {
        Start::Empty => ("drain_during_accepts", "from empty"),
        Start::Backlog => ("drain_backlog_during_accepts", "from a backlog"),
    };
    Ok(Row {
        kind: Kind::Service,
        name: name.into(),
        concurrency: u32::try_from(connections)?,
        setup: format!("1 api + {workers} worker{}, {from}", if workers == 1 { "" } else { "s" }),
        dataset: target.dataset.into(),
        ops: drained as u64,
        seconds,
        rate: drained / seconds,
        latency,
        errors: window.measured.errors(),
        cpu_seconds_per_op: Row::cost_per_op(&window.cpu, &[Role::Api, Role::Worker, Role::Postgres], accepted),
        cpu: window.cpu,
        comparison: None,
        extra,
    })
}

/// Waits until the outbox is empty (every queued payment sent and recorded).
pub async fn wait_for_empty_outbox(target: &Target<'_>, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let depth = target.outbox_depth().await?;
        if depth == 0 {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{depth} outbox rows still queued after {timeout:?}");
        sleep(Duration::from_millis(500)).await;
    }
}

struct Settled {
    count: u64,
    summary: Option<crate::latency::LatencySummary>,
}

/// From acceptance to the final status, for payments accepted in `window`.
async fn settle_latency(pool: &PgPool, window: (OffsetDateTime, OffsetDateTime)) -> anyhow::Result<Settled> {
    let micros: Vec<i64> = sqlx::query_scalar!(
        r#"
        SELECT (extract(epoch FROM updated_at - created_at) * 1000000)::bigint AS "micros!"
        FROM payments
        WHERE created_at >= $1 AND created_at < $2 AND status IN ('succeeded', 'failed')
        "#,
        window.0,
        window.1,
    )
    .fetch_all(pool)
    .await?;
    let mut latencies = crate::latency::Latencies::new();
    for value in &micros {
        latencies.record_micros(u32::try_from(*value).unwrap_or(u32::MAX));
    }
    Ok(Settled { count: micros.len() as u64, summary: latencies.summary() })
}
