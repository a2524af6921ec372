//! What a run found: one [`Row`] per measurement, the machine it ran on, and how the rows are
//! printed (a table) and kept (JSON, for comparisons over time).
//!
//! A row is either a raw baseline (pgbench running the project's statements, or the RabbitMQ node
//! with nothing behind it) or a service measurement (the real binaries over loopback); a service row
//! names the baseline it is compared with and the target the issue sets for that ratio, if any.
//! Nothing here measures anything.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::cpu::{CpuUsage, Role};
use crate::latency::LatencySummary;
use crate::machine::Machine;

/// The JSON document's format version; bump it when a field changes meaning. 2: a comparison says
/// what its ratio is `of` (rates, or median latencies), and latencies have a p95. 3: a Citus run made
/// after one PostgreSQL's compares its rows with that run's (`against_single`). 4: a run on one
/// PostgreSQL checks issue 37's targets (`targets`). 5: a target names the issue that sets it
/// (`issue`), and issue 48's are among them; CPU time has a `broker` role.
pub const FORMAT_VERSION: u32 = 5;

/// Cores busy with other programs above which a row is marked as measured on a busy machine.
pub const NOISY_OTHER_CORES: f64 = 0.25;

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// When the run started (RFC 3339, UTC).
    pub started_at: String,
    /// `quick`, `standard` or `full`.
    pub profile: String,
    /// A free-text note given with `--label` (e.g. which lever this run tries).
    pub label: Option<String>,
    /// The database server: one PostgreSQL, or a Citus cluster.
    pub server: String,
    /// The command line.
    pub command: Vec<String>,
    /// The commit the binaries were built from, when known.
    pub git_commit: Option<String>,
    /// The run's scheduling priority against other work on the machine.
    pub priority: String,
    /// Seconds of load before each window, and of each window.
    pub warmup_seconds: f64,
    /// See `warmup_seconds`.
    pub window_seconds: f64,
    /// Environment overrides given to the api and worker processes.
    pub api_env: Vec<String>,
    /// See `api_env`.
    pub worker_env: Vec<String>,
    /// Where it ran.
    pub machine: Machine,
    /// Why the run stopped early, if it did: the rows before it are kept.
    pub error: Option<String>,
    /// Every measurement, in the order taken.
    pub rows: Vec<Row>,
    /// On a Citus run made back to back with one PostgreSQL's: each row's rate against the same
    /// row's there. Empty otherwise.
    pub against_single: Vec<AgainstSingle>,
    /// On one PostgreSQL: the issues' targets whose rows the run measured, as it found them.
    pub targets: Vec<CheckedTarget>,
}

/// A row measured on Citus against the same row on one PostgreSQL, in the same invocation.
#[derive(Debug, Clone, Serialize)]
pub struct AgainstSingle {
    /// Raw or service.
    pub kind: Kind,
    /// The row, as [`Row::label`].
    pub row: String,
    /// Its setup.
    pub setup: String,
    /// Its rate on one PostgreSQL.
    pub single_rate: f64,
    /// Its rate on Citus.
    pub citus_rate: f64,
    /// Citus's rate / one PostgreSQL's.
    pub ratio: f64,
    /// The least the ratio may be, where the issue sets it (issue 37: the service's accepts from 8
    /// and 64 clients, and its drains).
    pub target: Option<f64>,
}

impl AgainstSingle {
    /// Whether the target is met (`None` without a target).
    pub fn met(&self) -> Option<bool> {
        self.target.map(|target| self.ratio >= target)
    }
}

/// The least a service row's rate on Citus may be, as a share of its rate on one PostgreSQL.
fn citus_target(row: &Row) -> Option<f64> {
    match (row.kind, row.name.as_str(), row.concurrency) {
        (Kind::Service, "accept", 8 | 64) => Some(0.5),
        (Kind::Service, "drain", _) => Some(0.8),
        _ => None,
    }
}

/// Each row of `citus` that `single` measured too (the same kind, name, connections, setup and
/// dataset), with its ratio; rows only one run has are left out.
pub fn against_single(single: &[Row], citus: &[Row]) -> Vec<AgainstSingle> {
    citus
        .iter()
        .filter_map(|row| {
            let same = single.iter().find(|other| {
                other.kind == row.kind
                    && other.name == row.name
                    && other.concurrency == row.concurrency
                    && other.setup == row.setup
                    && other.dataset == row.dataset
            })?;
            Some(AgainstSingle {
                kind: row.kind,
                row: row.label(),
                setup: row.setup.clone(),
                single_rate: same.rate,
                citus_rate: row.rate,
                ratio: if same.rate > 0.0 { row.rate / same.rate } else { 0.0 },
                target: citus_target(row),
            })
        })
        .collect()
}

/// [`against_single`]'s rows as a table for a terminal.
pub fn against_single_table(rows: &[AgainstSingle]) -> String {
    let header = ["", "what", "one PG/s", "Citus/s", "ratio", "target"];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for row in rows {
        lines.push(vec![
            match row.kind {
                Kind::Raw => "raw".to_owned(),
                Kind::Service => "svc".to_owned(),
            },
            format!("{} ({})", row.row, row.setup),
            thousands(row.single_rate),
            thousands(row.citus_rate),
            format!("{:.2}", row.ratio),
            row.target.map_or("-".to_owned(), |target| {
                format!("≥{target:.1} {}", if row.met() == Some(true) { "ok" } else { "MISS" })
            }),
        ]);
    }
    aligned_with(&lines, |i| i < 2)
}

/// What one of the issues' targets compares ([`crate::targets`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetOf {
    /// Operations per second: the ratio is the least it may be.
    Rate,
    /// CPU-seconds per operation, the service's processes and PostgreSQL against PostgreSQL alone:
    /// the ratio is the most it may be.
    CpuPerOp,
}

/// One of the issues' targets, as a run found it ([`crate::targets::check`]).
#[derive(Debug, Clone, Serialize)]
pub struct CheckedTarget {
    /// The issue that sets it.
    pub issue: u32,
    /// The row, as [`Row::label`], and its setup.
    pub row: String,
    /// The row it is set against, likewise.
    pub baseline: String,
    /// What is compared.
    pub of: TargetOf,
    /// The row's figure.
    pub measured: f64,
    /// The figure of the row it is set against.
    pub baseline_figure: f64,
    /// `measured / baseline_figure`.
    pub ratio: f64,
    /// The least a rate's ratio may be, or the most a cost's may be.
    pub target: f64,
}

impl CheckedTarget {
    /// Whether the ratio is on the right side of the target.
    pub fn met(&self) -> bool {
        match self.of {
            TargetOf::Rate => self.ratio >= self.target,
            TargetOf::CpuPerOp => self.ratio > 0.0 && self.ratio <= self.target,
        }
    }
}

/// Raw PostgreSQL or the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// pgbench running the project's SQL, nothing in front of PostgreSQL; or the RabbitMQ node
    /// alone, its messages acknowledged unread.
    Raw,
    /// The real binaries.
    Service,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Raw or service.
    pub kind: Kind,
    /// What was measured: `accept`, `replay`, `three_inserts`, `drain` ...
    pub name: String,
    /// Concurrent connections (HTTP or PostgreSQL) generating the load; for drains, worker processes;
    /// for messages from RabbitMQ, the consumer's prefetch.
    pub concurrency: u32,
    /// How: `pgbench -M prepared`, `1 api process`, `2 workers` ...
    pub setup: String,
    /// Which data it ran against: `main`, `10k keys`, `10M keys`.
    pub dataset: String,
    /// Operations completed inside the window (transactions, requests with the expected response,
    /// drained payments).
    pub ops: u64,
    /// The window's length.
    pub seconds: f64,
    /// `ops / seconds`.
    pub rate: f64,
    /// Latencies of the operations in the window, when each one is timed.
    pub latency: Option<LatencySummary>,
    /// Operations that did not end as expected (wrong status, transport error).
    pub errors: u64,
    /// What each process spent.
    pub cpu: CpuUsage,
    /// CPU-seconds per operation of the service processes (api or worker) and PostgreSQL; for raw
    /// rows, PostgreSQL alone. With messages from RabbitMQ, the node's too; for its ceiling, the node
    /// alone. The load generator, pgbench, the producer and the simulator are not included.
    pub cpu_seconds_per_op: Option<f64>,
    /// The comparison with a baseline, for service rows.
    pub comparison: Option<Comparison>,
    /// Further figures particular to the row (outbox growth, end-to-end latency ...).
    pub extra: BTreeMap<String, f64>,
}

/// A measurement set against a baseline: a service rate against a raw one, or a cost against the
/// same measurement over a shorter history.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The baseline row, as `name×concurrency` (and its dataset unless it is the main one).
    pub baseline: String,
    /// Its rate.
    pub baseline_rate: f64,
    /// What the ratio compares.
    pub of: Measure,
    /// The measurement / the baseline's, of [`Comparison::of`].
    pub ratio: f64,
    /// The ratio the issue asks for, if it sets one: the least a rate's may be, the most a
    /// latency's may be.
    pub target: Option<f64>,
}

/// What a [`Comparison`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// Rates: higher is better.
    Rate,
    /// Median latencies: lower is better.
    MedianLatency,
}

impl Comparison {
    /// Compares `rate` with `baseline`'s.
    pub fn new(rate: f64, baseline: &Row, target: Option<f64>) -> Self {
        let ratio = if baseline.rate > 0.0 { rate / baseline.rate } else { 0.0 };
        Self { baseline: baseline.label(), baseline_rate: baseline.rate, of: Measure::Rate, ratio, target }
    }

    /// Compares `row`'s median latency with `baseline`'s (0 when either has none).
    pub fn of_median_latency(row: &Row, baseline: &Row, target: Option<f64>) -> Self {
        let ratio = match (row.latency, baseline.latency) {
            (Some(latency), Some(base)) if base.p50_ms > 0.0 => latency.p50_ms / base.p50_ms,
            _ => 0.0,
        };
        let label = format!("p50 of {}", baseline.label());
        Self { baseline: label, baseline_rate: baseline.rate, of: Measure::MedianLatency, ratio, target }
    }

    /// Whether the target is met (`None` without a target).
    pub fn met(&self) -> Option<bool> {
        self.target.map(|target| match self.of {
            Measure::Rate => self.ratio >= target,
            Measure::MedianLatency => self.ratio > 0.0 && self.ratio <= target,
        })
    }
}

impl Row {
    /// `name×concurrency`.
    pub fn short_name(&self) -> String {
        format!("{}×{}", self.name, self.concurrency)
    }

    /// `name×concurrency`, with the dataset unless it is the main one.
    pub fn label(&self) -> String {
        if self.dataset == "main" { self.short_name() } else { format!("{} [{}]", self.short_name(), self.dataset) }
    }

    /// The CPU cost per operation of `roles`, or `None` without operations.
    pub fn cost_per_op(cpu: &CpuUsage, roles: &[Role], ops: u64) -> Option<f64> {
        (ops > 0).then(|| roles.iter().map(|role| cpu.of(*role)).sum::<f64>() / ops as f64)
    }
}

/// The rows as a table for a terminal.
pub fn table(rows: &[Row]) -> String {
    let header = [
        "", "what", "conns", "dataset", "rate/s", "baseline", "base/s", "ratio", "target", "p50 ms", "p95 ms",
        "p99 ms", "max ms", "CPU-s/op", "client", "other",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for row in rows {
        let kind = match row.kind {
            Kind::Raw => "raw",
            Kind::Service => "svc",
        };
        let kind = if row.cpu.other_cores > NOISY_OTHER_CORES { format!("{kind}*") } else { kind.to_owned() };
        let comparison = row.comparison.as_ref();
        let latency = |pick: fn(&LatencySummary) -> f64| row.latency.as_ref().map_or("-".to_owned(), |l| ms(pick(l)));
        lines.push(vec![
            kind,
            format!("{} ({})", row.name, row.setup),
            row.concurrency.to_string(),
            row.dataset.clone(),
            thousands(row.rate),
            comparison.map_or("-".to_owned(), |c| c.baseline.clone()),
            comparison.map_or("-".to_owned(), |c| thousands(c.baseline_rate)),
            comparison.map_or("-".to_owned(), |c| format!("{:.2}", c.ratio)),
            comparison.and_then(|c| c.target.map(|t| (t, c.of, c.met()))).map_or("-".to_owned(), |(t, of, met)| {
                let bound = match of {
                    Measure::Rate => '≥',
                    Measure::MedianLatency => '≤',
                };
                format!("{bound}{t:.1} {}", if met == Some(true) { "ok" } else { "MISS" })
            }),
            latency(|l| l.p50_ms),
            latency(|l| l.p95_ms),
            latency(|l| l.p99_ms),
            latency(|l| l.max_ms),
            row.cpu_seconds_per_op.map_or("-".to_owned(), |c| format!("{c:.6}")),
            format!("{:.2}", row.cpu.cores(Role::Client)),
            format!("{:.2}", row.cpu.other_cores),
        ]);
    }
    let mut out = aligned_with(&lines, |i| i <= 3 || i == 5);
    if rows.iter().any(|row| row.cpu.other_cores > NOISY_OTHER_CORES) {
        let _ = writeln!(
            out,
            "\n* other programs kept more than {NOISY_OTHER_CORES} cores busy during this window: rerun on a quiet machine"
        );
    }
    let extras: Vec<String> = rows
        .iter()
        .filter(|row| !row.extra.is_empty() || row.errors > 0)
        .map(|row| {
            let mut parts: Vec<String> = row.extra.iter().map(|(k, v)| format!("{k}={v:.2}")).collect();
            if row.errors > 0 {
                parts.push(format!("errors={}", row.errors));
            }
            format!("  {} {} [{}]: {}", row.short_name(), row.setup, row.dataset, parts.join(", "))
        })
        .collect();
    if !extras.is_empty() {
        let _ = writeln!(out, "\nfurther figures:");
        for line in extras {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// `lines` as columns, those `is_text` says aligned left, the rest (numbers) right.
pub(crate) fn aligned_with(lines: &[Vec<String>], is_text: impl Fn(usize) -> bool) -> String {
    let columns = lines.first().map_or(0, Vec::len);
    let widths: Vec<usize> =
        (0..columns).map(|i| lines.iter().map(|line| line[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for line in lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &width))| if is_text(i) { format!("{cell:<width$}") } else { format!("{cell:>width$}") })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

/// `12345.6` as `12,346`.
pub(crate) fn thousands(value: f64) -> String {
    let rounded = value.round() as i64;
    let digits = rounded.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    if rounded < 0 { format!("-{out}") } else { out }
}

fn ms(value: f64) -> String {
    if value < 10.0 { format!("{value:.2}") } else { format!("{value:.1}") }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn usage() -> CpuUsage {
        CpuUsage {
            wall_seconds: 10.0,
            seconds: BTreeMap::from([(Role::Api, 6.0), (Role::Postgres, 8.0), (Role::Client, 2.0)]),
            machine_busy_cores: 1.9,
            other_cores: 0.1,
        }
    }

    pub(crate) fn row(kind: Kind, name: &str, rate: f64) -> Row {
        Row {
            kind,
            name: name.into(),
            concurrency: 8,
            setup: "test".into(),
            dataset: "main".into(),
            ops: (rate * 10.0) as u64,
            seconds: 10.0,
            rate,
            latency: None,
            errors: 0,
            cpu: usage(),
            cpu_seconds_per_op: None,
            comparison: None,
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn a_comparison_is_the_ratio_of_rates_and_meets_its_target_at_or_above_it() {
        let baseline = row(Kind::Raw, "three_inserts", 5000.0);

        let at = Comparison::new(4000.0, &baseline, Some(0.8));
        let below = Comparison::new(3999.0, &baseline, Some(0.8));
        let without = Comparison::new(1.0, &baseline, None);

        assert_eq!((at.baseline.as_str(), at.ratio, at.met()), ("three_inserts×8", 0.8, Some(true)));
        assert_eq!(below.met(), Some(false));
        assert_eq!(without.met(), None);
        assert_eq!(Comparison::new(1.0, &row(Kind::Raw, "empty", 0.0), None).ratio, 0.0);
    }

    fn with_median(mut row: Row, p50_ms: f64) -> Row {
        row.latency = Some(LatencySummary {
            count: 100,
            p50_ms,
            p95_ms: p50_ms,
            p99_ms: p50_ms,
            max_ms: p50_ms,
            mean_ms: p50_ms,
        });
        row
    }

    #[test]
    fn a_latency_comparison_is_the_ratio_of_medians_and_meets_its_target_at_or_below_it() {
        let short = with_median(row(Kind::Service, "console search", 1000.0), 2.0);
        let at = with_median(row(Kind::Service, "console search", 700.0), 3.0);
        let above = with_median(row(Kind::Service, "console search", 600.0), 3.2);

        let met = Comparison::of_median_latency(&at, &short, Some(1.5));
        let missed = Comparison::of_median_latency(&above, &short, Some(1.5));
        let unmeasured = Comparison::of_median_latency(&row(Kind::Service, "x", 1.0), &short, Some(1.5));

        assert_eq!((met.baseline.as_str(), met.ratio, met.met()), ("p50 of console search×8", 1.5, Some(true)));
        assert_eq!((missed.ratio, missed.met()), (1.6, Some(false)));
        assert_eq!((unmeasured.ratio, unmeasured.met()), (0.0, Some(false)), "no latency is no pass");
        let mut long = above;
        long.comparison = Some(missed);
        let table = table(&[short, long]);
        assert!(table.contains("≤1.5 MISS") && table.contains("1.60"), "{table}");
    }

    #[test]
    fn the_cost_per_op_sums_the_named_roles() {
        assert_eq!(Row::cost_per_op(&usage(), &[Role::Api, Role::Postgres], 7000), Some(0.002));
        assert_eq!(Row::cost_per_op(&usage(), &[Role::Api], 0), None);
    }

    #[test]
    fn the_table_shows_rates_ratios_and_misses() {
        let baseline = row(Kind::Raw, "three_inserts", 5123.4);
        let mut service = row(Kind::Service, "accept", 3000.0);
        service.comparison = Some(Comparison::new(3000.0, &baseline, Some(0.8)));
        service.extra.insert("outbox_growth_per_s".into(), 12.5);

        let table = table(&[baseline, service]);

        assert!(table.contains("5,123"), "{table}");
        assert!(table.contains("0.59"), "{table}");
        assert!(table.contains("≥0.8 MISS"), "{table}");
        assert!(table.contains("outbox_growth_per_s=12.50"), "{table}");
        assert!(!table.contains("svc*") && !table.contains("quiet machine"), "{table}");
    }

    #[test]
    fn rows_measured_on_a_busy_machine_are_marked() {
        let mut noisy = row(Kind::Raw, "replay_sql", 100.0);
        noisy.cpu.other_cores = 0.8;

        let table = table(&[noisy]);

        assert!(table.contains("raw*"), "{table}");
        assert!(table.contains("rerun on a quiet machine"), "{table}");
    }

    #[test]
    fn citus_rows_are_set_against_the_same_rows_on_one_postgresql_with_the_issues_targets() {
        let mut single_drain = row(Kind::Service, "drain", 2000.0);
        single_drain.concurrency = 1;
        let mut citus_drain = row(Kind::Service, "drain", 1700.0);
        citus_drain.concurrency = 1;
        let single = [row(Kind::Raw, "accept_sql", 4000.0), row(Kind::Service, "accept", 6000.0), single_drain];
        let citus = [
            row(Kind::Raw, "accept_sql", 1000.0),
            row(Kind::Service, "accept", 2000.0),
            citus_drain,
            row(Kind::Service, "only_on_citus", 10.0),
        ];

        let compared = against_single(&single, &citus);

        let seen: Vec<(&str, f64, Option<bool>)> =
            compared.iter().map(|c| (c.row.as_str(), c.ratio, c.met())).collect();
        assert_eq!(
            seen,
            [("accept_sql×8", 0.25, None), ("accept×8", 2000.0 / 6000.0, Some(false)), ("drain×1", 0.85, Some(true))]
        );
        let table = against_single_table(&compared);
        assert!(table.contains("≥0.5 MISS") && table.contains("≥0.8 ok") && table.contains("0.33"), "{table}");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1234567.0), "1,234,567");
        assert_eq!(thousands(-4321.0), "-4,321");
    }
}
