//! How the operator CLI prints: aligned plain-text tables for people, JSON for scripts.
//!
//! Every command produces a value implementing [`Report`]; `main` decides which form to write. Only
//! this module knows about column alignment. Nothing here reads the database or decides anything.

use std::io::{self, Write};

use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Something a command produced, printable both ways.
pub trait Report {
    /// Writes the human-readable form.
    fn human(&self, out: &mut dyn Write) -> io::Result<()>;
    /// The JSON form.
    fn json(&self) -> serde_json::Value;
}

/// Writes `report` as pretty JSON or as text.
pub fn write(report: &dyn Report, as_json: bool, out: &mut dyn Write) -> io::Result<()> {
    if as_json {
        serde_json::to_writer_pretty(&mut *out, &report.json())?;
        writeln!(out)
    } else {
        report.human(out)
    }
}

/// The JSON of a serialisable value; a value of plain fields cannot fail to serialise.
pub fn to_json(value: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

/// A table with a header row, columns padded to their widest cell.
#[derive(Debug, Default)]
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column names.
    pub fn new(headers: &[&'static str]) -> Self {
        Self { headers: headers.to_vec(), rows: Vec::new() }
    }

    /// Adds a row (missing cells print empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Writes the table, or `empty` when it has no rows.
    pub fn write(&self, out: &mut dyn Write, empty: &str) -> io::Result<()> {
        if self.rows.is_empty() {
            return writeln!(out, "{empty}");
        }
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(widths.len()) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>| -> String {
            let padded: Vec<String> =
                cells.zip(&widths).map(|(cell, width)| format!("{cell:<width$}", width = *width)).collect();
            padded.join("  ").trim_end().to_owned()
        };
        writeln!(out, "{}", line(&mut self.headers.iter().copied()))?;
        for row in &self.rows {
            let mut cells = (0..widths.len()).map(|i| row.get(i).map_or("", String::as_str));
            writeln!(out, "{}", line(&mut cells))?;
        }
        Ok(())
    }
}

/// A timestamp as operators read it: RFC 3339, UTC, whole seconds.
pub fn timestamp(at: OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC).replace_nanosecond(0).unwrap_or(at);
    at.format(&Rfc3339).unwrap_or_else(|_| at.to_string())
}

/// A duration as operators read it: `3d 4h`, `12m 5s`, `40s`.
pub fn age(duration: time::Duration) -> String {
    let secs = duration.whole_seconds().max(0);
    let (days, hours, minutes, seconds) = (secs / 86_400, secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, _) => format!("{minutes}m {seconds}s"),
        (0, _, _) => format!("{hours}h {minutes}m"),
        _ => format!("{days}d {hours}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_to_their_widest_cell() {
        let mut table = Table::new(&["ID", "NAME"]);
        table.row(vec!["1".into(), "acme".into()]);
        table.row(vec!["1234".into(), "b".into()]);
        let mut out = Vec::new();

        table.write(&mut out, "none").unwrap();

        assert_eq!(String::from_utf8(out).unwrap(), "ID    NAME\n1     acme\n1234  b\n");
    }

    #[test]
    fn an_empty_table_says_so() {
        let mut out = Vec::new();
        Table::new(&["ID"]).write(&mut out, "no tenants").unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "no tenants\n");
    }

    #[test]
    fn ages_read_in_their_two_largest_units() {
        let cases = [(40, "40s"), (725, "12m 5s"), (3 * 3600 + 120, "3h 2m"), (3 * 86_400 + 4 * 3600, "3d 4h")];
        for (secs, expected) in cases {
            assert_eq!(age(time::Duration::seconds(secs)), expected);
        }
    }
}
