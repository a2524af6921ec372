//! The issues' targets on one PostgreSQL, checked against the rows of one run: each sets a row
//! against another measured in the same run, by rate or by CPU per operation. Issue 37's set the
//! service against the raw SQL; issue 48's set payments from RabbitMQ against the node's own ceiling
//! and against the HTTP accepts of the same api. The Citus targets are the ratios of
//! [`crate::report::against_single`]. Nothing here measures anything.

use crate::broker;
use crate::raw::Baseline;
use crate::report::{CheckedTarget, Kind, Row, TargetOf, aligned_with, thousands};

/// A row of the main dataset, picked by kind and name, and by connections and setup where given
/// (the broker phase's rows are one of each name in a run, whatever their prefetch).
struct Pick {
    kind: Kind,
    name: &'static str,
    connections: Option<u32>,
    setup: Option<String>,
}

impl Pick {
    fn service(name: &'static str, connections: u32, setup: &str) -> Self {
        Self { kind: Kind::Service, name, connections: Some(connections), setup: Some(setup.to_owned()) }
    }

    fn raw(baseline: Baseline, connections: u32) -> Self {
        Self { kind: Kind::Raw, name: baseline.name(), connections: Some(connections), setup: Some(baseline.setup()) }
    }

    fn named(kind: Kind, name: &'static str) -> Self {
        Self { kind, name, connections: None, setup: None }
    }

    fn find<'r>(&self, rows: &'r [Row]) -> Option<&'r Row> {
        rows.iter().find(|row| {
            row.kind == self.kind
                && row.name == self.name
                && self.connections.is_none_or(|connections| row.concurrency == connections)
                && self.setup.as_ref().is_none_or(|setup| &row.setup == setup)
                && row.dataset == "main"
        })
    }
}

/// One target: the issue that sets it, the row it is about, the row it is set against, what is
/// compared, and the bound.
struct Target {
    issue: u32,
    row: Pick,
    against: Pick,
    of: TargetOf,
    bound: f64,
}

/// The single-server targets of issue 37 (the service against raw SQL) and issue 48 (payments from
/// RabbitMQ).
fn targets() -> [Target; 6] {
    let accept_64 = || Pick::service("accept", 64, "1 api process");
    let group_64 = || Pick::raw(Baseline::AcceptGroup(64), 8);
    let from_broker = || Pick::named(Kind::Service, broker::INTAKE);
    [
        Target { issue: 37, row: accept_64(), against: group_64(), of: TargetOf::Rate, bound: 0.5 },
        Target { issue: 37, row: accept_64(), against: group_64(), of: TargetOf::CpuPerOp, bound: 1.5 },
        Target {
            issue: 37,
            row: Pick::service("accept", 8, "1 api process"),
            against: Pick::raw(Baseline::Accept, 8),
            of: TargetOf::Rate,
            bound: 1.2,
        },
        Target {
            issue: 37,
            row: Pick::service("replay", 8, "1 api process, no replay cache"),
            against: Pick::raw(Baseline::Replay, 8),
            of: TargetOf::Rate,
            bound: 0.6,
        },
        Target {
            issue: 48,
            row: from_broker(),
            against: Pick::named(Kind::Raw, broker::CEILING),
            of: TargetOf::Rate,
            bound: 0.5,
        },
        Target {
            issue: 48,
            row: from_broker(),
            against: Pick::service("accept", 64, broker::HTTP_SETUP),
            of: TargetOf::Rate,
            bound: 0.8,
        },
    ]
}

/// Each target whose two rows `rows` has, as measured.
pub fn check(rows: &[Row]) -> Vec<CheckedTarget> {
    targets()
        .into_iter()
        .filter_map(|Target { issue, row, against, of, bound }| {
            let row = row.find(rows)?;
            let against = against.find(rows)?;
            let figure = |row: &Row| match of {
                TargetOf::Rate => Some(row.rate),
                TargetOf::CpuPerOp => row.cpu_seconds_per_op,
            };
            let (measured, baseline_figure) = (figure(row)?, figure(against)?);
            Some(CheckedTarget {
                issue,
                row: format!("{} ({})", row.label(), row.setup),
                baseline: format!("{} ({})", against.label(), against.setup),
                of,
                measured,
                baseline_figure,
                ratio: if baseline_figure > 0.0 { measured / baseline_figure } else { 0.0 },
                target: bound,
            })
        })
        .collect()
}

/// [`check`]'s findings as a table for a terminal.
pub fn table(checked: &[CheckedTarget]) -> String {
    let header = ["issue", "what", "against", "of", "measured", "baseline", "ratio", "target"];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for target in checked {
        let (of, figure, bound): (_, fn(f64) -> String, _) = match target.of {
            TargetOf::Rate => ("rate/s", thousands, '≥'),
            TargetOf::CpuPerOp => ("CPU µs/op", |seconds| format!("{:.0}", seconds * 1e6), '≤'),
        };
        lines.push(vec![
            target.issue.to_string(),
            target.row.clone(),
            target.baseline.clone(),
            of.to_owned(),
            figure(target.measured),
            figure(target.baseline_figure),
            format!("{:.2}", target.ratio),
            format!("{bound}{:.1} {}", target.target, if target.met() { "ok" } else { "MISS" }),
        ]);
    }
    aligned_with(&lines, |i| (1..4).contains(&i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::row;

    fn raw(baseline: Baseline, connections: u32, rate: f64, cpu: f64) -> Row {
        let mut row = row(Kind::Raw, baseline.name(), rate);
        row.concurrency = connections;
        row.setup = baseline.setup();
        row.cpu_seconds_per_op = Some(cpu);
        row
    }

    fn service(name: &str, connections: u32, setup: &str, rate: f64, cpu: f64) -> Row {
        let mut row = row(Kind::Service, name, rate);
        row.concurrency = connections;
        row.setup = setup.to_owned();
        row.cpu_seconds_per_op = Some(cpu);
        row
    }

    #[test]
    fn each_target_sets_its_service_row_against_its_raw_row_and_a_cost_must_stay_below_its_bound() {
        let rows = vec![
            raw(Baseline::AcceptGroup(64), 8, 30_000.0, 0.000_060),
            raw(Baseline::AcceptGroup(8), 8, 20_000.0, 0.000_040),
            raw(Baseline::Accept, 8, 4_000.0, 0.000_200),
            raw(Baseline::Replay, 8, 20_000.0, 0.000_050),
            service("accept", 64, "1 api process", 15_000.0, 0.000_150),
            service("accept", 8, "1 api process", 4_000.0, 0.000_200),
            service("replay", 8, "1 api process", 19_000.0, 0.000_050),
            service("replay", 8, "1 api process, no replay cache", 12_000.0, 0.000_090),
        ];
        let checked = check(&rows);
        let found: Vec<(u32, TargetOf, f64, bool)> =
            checked.iter().map(|c| (c.issue, c.of, (c.ratio * 100.0).round() / 100.0, c.met())).collect();
        assert_eq!(
            found,
            [
                (37, TargetOf::Rate, 0.5, true),
                (37, TargetOf::CpuPerOp, 2.5, false),
                (37, TargetOf::Rate, 1.0, false),
                (37, TargetOf::Rate, 0.6, true)
            ]
        );
        let printed = table(&checked);
        assert!(printed.contains("≤1.5 MISS") && printed.contains("150") && printed.contains("≥0.6 ok"), "{printed}");
    }

    #[test]
    fn payments_from_the_broker_are_set_against_its_ceiling_and_the_same_apis_http_accepts_whatever_the_prefetch() {
        let mut ceiling = row(Kind::Raw, broker::CEILING, 8_000.0);
        ceiling.concurrency = 256;
        let mut from_broker = service(broker::INTAKE, 256, "prefetch 256", 3_000.0, 0.000_300);
        from_broker.cpu_seconds_per_op = None;
        let rows = vec![
            ceiling,
            // The accept phase's row at 64 connections is not the broker phase's.
            service("accept", 64, "1 api process", 12_000.0, 0.000_100),
            service("accept", 64, broker::HTTP_SETUP, 6_000.0, 0.000_100),
            from_broker,
        ];

        let checked = check(&rows);

        let found: Vec<(u32, f64, bool)> = checked.iter().map(|c| (c.issue, c.ratio, c.met())).collect();
        assert_eq!(found, [(48, 0.375, false), (48, 0.5, false)]);
        let printed = table(&checked);
        assert!(
            printed.contains("≥0.5 MISS") && printed.contains("≥0.8 MISS") && printed.contains("6,000"),
            "{printed}"
        );
    }

    #[test]
    fn a_target_whose_rows_the_run_did_not_measure_is_left_out() {
        let rows =
            vec![raw(Baseline::Accept, 8, 4_000.0, 0.000_200), service("accept", 8, "1 api process", 5_000.0, 0.0)];
        let checked = check(&rows);
        assert_eq!(checked.len(), 1);
        assert!(checked[0].met());
    }
}
