//! Running pgbench: a script for a fixed time at a given number of connections, with every
//! transaction logged (`-l`), so a phase's window is cut from the log as the HTTP load generator
//! cuts its own, and latencies are percentiles of the same kind. A run whose clients abort is an
//! error: its figures would be wrong.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use crate::latency::Latencies;
use crate::pgbench_script::Script;

/// Where pgbench is: `$PG_BINDIR/pgbench`, else next to `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin/pgbench`, else `pgbench` on the PATH.
pub async fn locate() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        return PathBuf::from(dir).join("pgbench");
    }
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output().await
        && output.status.success()
    {
        let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join("pgbench");
        if path.is_file() {
            return path;
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            let path = entry.path().join("bin").join("pgbench");
            path.is_file().then_some((version, path))
        })
        .collect();
    versions.sort();
    versions.pop().map_or_else(|| PathBuf::from("pgbench"), |(_, path)| path)
}

/// One pgbench run.
pub struct Job<'a> {
    /// The executable.
    pub program: &'a Path,
    /// The script: one transaction.
    pub script: &'a Script,
    /// Connections.
    pub clients: u32,
    /// `-D name=value` for every variable the script uses.
    pub variables: &'a [(String, String)],
    /// How long to run, rounded up to whole seconds.
    pub duration: Duration,
    /// The database.
    pub port: u16,
    /// Its name.
    pub database: &'a str,
}

/// A pgbench process, running.
pub struct Running {
    child: Child,
    dir: tempfile::TempDir,
}

/// One transaction from pgbench's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transaction {
    /// When it completed, microseconds since the Unix epoch.
    pub completed_at_us: u64,
    /// How long it took, microseconds.
    pub latency_us: u32,
}

impl Job<'_> {
    /// Starts pgbench.
    pub fn spawn(&self) -> anyhow::Result<Running> {
        let dir = tempfile::Builder::new().prefix("oncepay-pgbench-").tempdir()?;
        let script = dir.path().join("script.sql");
        std::fs::write(&script, self.script.text())?;
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let threads = (self.clients as usize).clamp(1, cores);
        let seconds = self.duration.as_secs() + u64::from(self.duration.subsec_nanos() > 0);
        let mut command = Command::new(self.program);
        // `-M prepared` as the binaries' sqlx prepares its statements; `-n`: no vacuum of pgbench's
        // own tables; TCP on loopback like the binaries.
        command
            .args(["-n", "-M", "prepared", "-l"])
            .arg(format!("--log-prefix={}", dir.path().join("log").display()))
            .arg(format!("--client={}", self.clients))
            .arg(format!("--jobs={threads}"))
            .arg(format!("--time={seconds}"))
            .arg(format!("--file={}", script.display()))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres"]);
        for (name, value) in self.variables {
            command.arg("-D").arg(format!("{name}={value}"));
        }
        command
            .arg(self.database)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = command.spawn().with_context(|| format!("cannot run {}", self.program.display()))?;
        Ok(Running { child, dir })
    }
}

impl Running {
    /// Waits for pgbench to finish and returns every logged transaction.
    pub async fn finish(mut self) -> anyhow::Result<Vec<Transaction>> {
        // Both pipes at once: pgbench blocks if either fills while the other is being waited on.
        let (stdout, stderr) = tokio::join!(read_all(self.child.stdout.take()), read_all(self.child.stderr.take()));
        let (stdout, stderr) = (stdout?, stderr?);
        let status = self.child.wait().await?;
        // A client aborts on an error in the script or a claim that found nothing.
        if !status.success() || stderr.contains("aborted") {
            bail!("pgbench failed ({status}): {}", tail(&format!("{stderr}\n{stdout}"), 1500));
        }
        let mut transactions = Vec::new();
        for entry in std::fs::read_dir(self.dir.path())? {
            let path = entry?.path();
            if path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("log.")) {
                transactions.extend(parse_log(&std::fs::read_to_string(&path)?)?);
            }
        }
        Ok(transactions)
    }
}

/// Parses a pgbench transaction log: `client_id transaction_no time script_no time_epoch time_us`
/// per line, `time` being the latency in microseconds.
pub fn parse_log(text: &str) -> anyhow::Result<Vec<Transaction>> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let number = |i: usize| -> anyhow::Result<u64> {
                fields.get(i).with_context(|| format!("short pgbench log line {line:?}"))?.parse().map_err(|_| {
                    anyhow::anyhow!("pgbench log line {line:?}: field {i} is not a number (a failed transaction?)")
                })
            };
            Ok(Transaction {
                completed_at_us: number(4)? * 1_000_000 + number(5)?,
                latency_us: u32::try_from(number(2)?).unwrap_or(u32::MAX),
            })
        })
        .collect()
}

/// The transactions completed in `[from, until)`: how many, and their latencies.
pub fn in_window(transactions: &[Transaction], from: SystemTime, until: SystemTime) -> (u64, Latencies) {
    let micros = |at: SystemTime| at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    let (from, until) = (micros(from), micros(until));
    let mut latencies = Latencies::new();
    let mut count = 0;
    for transaction in transactions.iter().filter(|t| (from..until).contains(&t.completed_at_us)) {
        count += 1;
        latencies.record_micros(transaction.latency_us);
    }
    (count, latencies)
}

async fn read_all(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> std::io::Result<String> {
    let mut text = String::new();
    if let Some(mut pipe) = pipe {
        pipe.read_to_string(&mut text).await?;
    }
    Ok(text)
}

fn tail(text: &str, max: usize) -> &str {
    let text = text.trim();
    let start = text.len().saturating_sub(max);
    let start = (start..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_give_completion_times_and_latencies() {
        let log = "0 1 350 0 1700000000 999999\n3 7 1250 0 1700000001 5\n\n";

        let transactions = parse_log(log).unwrap();

        assert_eq!(
            transactions,
            vec![
                Transaction { completed_at_us: 1_700_000_000_999_999, latency_us: 350 },
                Transaction { completed_at_us: 1_700_000_001_000_005, latency_us: 1250 },
            ]
        );
    }

    #[test]
    fn failed_or_truncated_log_lines_are_errors() {
        assert!(parse_log("0 1 failed 0 1700000000 5").is_err());
        assert!(parse_log("0 1 350 0").is_err());
    }

    #[test]
    fn the_window_keeps_transactions_completed_inside_it() {
        let at = |us: u64| Transaction { completed_at_us: us, latency_us: (us % 1000) as u32 };
        let transactions = [at(999_999), at(1_000_000), at(1_500_500), at(1_999_999), at(2_000_000)];
        let second = |s: u64| UNIX_EPOCH + Duration::from_secs(s);

        let (count, latencies) = in_window(&transactions, second(1), second(2));

        assert_eq!(count, 3);
        assert_eq!(latencies.summary().unwrap().max_ms, 0.999);
    }
}
