//! Issue 37's targets on one PostgreSQL, checked against the rows of one run: each sets a service
//! row against a raw-SQL row measured in the same run, by rate or by CPU per operation. The Citus
//! targets are the ratios of [`crate::report::against_single`]. Nothing here measures anything.

use crate::raw::Baseline;
use crate::report::{CheckedTarget, Kind, Row, TargetOf, aligned_with, thousands};

/// A service row, picked by name, connections and setup, on the main dataset.
struct ServiceRow(&'static str, u32, &'static str);

/// A raw row, picked by its baseline and connections, on the main dataset.
struct RawRow(Baseline, u32);

/// Issue 37's single-server targets.
fn targets() -> [(ServiceRow, RawRow, TargetOf, f64); 4] {
    [
        (ServiceRow("accept", 64, "1 api process"), RawRow(Baseline::AcceptGroup(64), 8), TargetOf::Rate, 0.5),
        (ServiceRow("accept", 64, "1 api process"), RawRow(Baseline::AcceptGroup(64), 8), TargetOf::CpuPerOp, 1.5),
        (ServiceRow("accept", 8, "1 api process"), RawRow(Baseline::Accept, 8), TargetOf::Rate, 1.2),
        (ServiceRow("replay", 8, "1 api process, no replay cache"), RawRow(Baseline::Replay, 8), TargetOf::Rate, 0.6),
    ]
}

/// Each of issue 37's targets whose two rows `rows` has, as measured.
pub fn check(rows: &[Row]) -> Vec<CheckedTarget> {
    let find = |kind: Kind, name: &str, concurrency: u32, setup: &str| {
        rows.iter().find(|row| {
            row.kind == kind
                && row.name == name
                && row.concurrency == concurrency
                && row.setup == setup
                && row.dataset == "main"
        })
    };
    targets()
        .into_iter()
        .filter_map(|(ServiceRow(name, concurrency, setup), RawRow(baseline, connections), of, target)| {
            let row = find(Kind::Service, name, concurrency, setup)?;
            let raw = find(Kind::Raw, baseline.name(), connections, &baseline.setup())?;
            let figure = |row: &Row| match of {
                TargetOf::Rate => Some(row.rate),
                TargetOf::CpuPerOp => row.cpu_seconds_per_op,
            };
            let (measured, baseline_figure) = (figure(row)?, figure(raw)?);
            Some(CheckedTarget {
                row: format!("{} ({})", row.label(), row.setup),
                baseline: format!("{} ({})", raw.label(), raw.setup),
                of,
                measured,
                baseline_figure,
                ratio: if baseline_figure > 0.0 { measured / baseline_figure } else { 0.0 },
                target,
            })
        })
        .collect()
}

/// [`check`]'s findings as a table for a terminal.
pub fn table(checked: &[CheckedTarget]) -> String {
    let header = ["what", "against", "of", "measured", "baseline", "ratio", "target"];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| (*h).to_owned()).collect()];
    for target in checked {
        let (of, figure, bound): (_, fn(f64) -> String, _) = match target.of {
            TargetOf::Rate => ("rate/s", thousands, '≥'),
            TargetOf::CpuPerOp => ("CPU µs/op", |seconds| format!("{:.0}", seconds * 1e6), '≤'),
        };
        lines.push(vec![
            target.row.clone(),
            target.baseline.clone(),
            of.to_owned(),
            figure(target.measured),
            figure(target.baseline_figure),
            format!("{:.2}", target.ratio),
            format!("{bound}{:.1} {}", target.target, if target.met() { "ok" } else { "MISS" }),
        ]);
    }
    aligned_with(&lines, |i| i < 3)
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
        let found: Vec<(TargetOf, f64, bool)> =
            checked.iter().map(|c| (c.of, (c.ratio * 100.0).round() / 100.0, c.met())).collect();
        assert_eq!(
            found,
            [
                (TargetOf::Rate, 0.5, true),
                (TargetOf::CpuPerOp, 2.5, false),
                (TargetOf::Rate, 1.0, false),
                (TargetOf::Rate, 0.6, true)
            ]
        );
        let printed = table(&checked);
        assert!(printed.contains("≤1.5 MISS") && printed.contains("150") && printed.contains("≥0.6 ok"), "{printed}");
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
