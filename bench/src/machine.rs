//! The machine a run measured: cores, CPU, memory, kernel, the load already on it, and the
//! PostgreSQL version and settings, so a figure is never read apart from what produced it.
//!
//! Read once at the start of a run, from `/proc` and `pg_settings`; nothing here changes a setting.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::PgConnection;

/// The PostgreSQL settings that decide these figures.
const SETTINGS: &[&str] = &[
    "synchronous_commit",
    "fsync",
    "full_page_writes",
    "wal_sync_method",
    "wal_compression",
    "wal_level",
    "commit_delay",
    "shared_buffers",
    "max_wal_size",
    "checkpoint_timeout",
    "max_connections",
    "autovacuum",
    "work_mem",
];

/// Where a run ran.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Cores the benchmark may use.
    pub cores: usize,
    /// `model name` of the first CPU.
    pub cpu_model: String,
    /// Memory, GiB.
    pub ram_gib: f64,
    /// `uname -r`.
    pub kernel: String,
    /// 1, 5 and 15 minute load averages before the run: other work already on the machine.
    pub load_average_at_start: Vec<f64>,
    /// `SELECT version()`.
    pub postgres_version: String,
    /// The settings that matter here, as PostgreSQL reports them.
    pub postgres_settings: BTreeMap<String, String>,
}

impl Machine {
    /// Describes this machine and the PostgreSQL server behind `conn`.
    pub async fn describe(conn: &mut PgConnection) -> anyhow::Result<Self> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let postgres_version = sqlx::query_scalar!(r#"SELECT version() AS "version!""#).fetch_one(&mut *conn).await?;
        let names: Vec<String> = SETTINGS.iter().map(|s| (*s).to_owned()).collect();
        let settings = sqlx::query!(
            r#"SELECT name AS "name!", setting || coalesce(' ' || unit, '') AS "value!"
               FROM pg_settings WHERE name = ANY($1)"#,
            &names,
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(Self {
            cores: std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            cpu_model: field(&cpuinfo, "model name").unwrap_or_else(|| "unknown".into()),
            ram_gib: field(&meminfo, "MemTotal")
                .and_then(|v| v.trim_end_matches("kB").trim().parse::<f64>().ok())
                .map_or(0.0, |kib| kib / (1024.0 * 1024.0)),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned(),
            load_average_at_start: load_average(),
            postgres_version,
            postgres_settings: settings.into_iter().map(|row| (row.name, row.value)).collect(),
        })
    }
}

/// The 1, 5 and 15 minute load averages (empty if unreadable).
pub fn load_average() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect()
}

/// The value of the first `name: value` line.
fn field(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim().to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_from_proc_style_text() {
        let text = "processor\t: 0\nmodel name\t: AMD EPYC\nMemTotal:       24576000 kB\n";

        assert_eq!(field(text, "model name").as_deref(), Some("AMD EPYC"));
        assert_eq!(field(text, "MemTotal").as_deref(), Some("24576000 kB"));
        assert_eq!(field(text, "flags"), None);
    }
}
