//! The one runner for a process's background loops.
//!
//! A loop is a [`Pass`]: one round of work, and whether more may be waiting. The runner owns the
//! rest: when the next pass starts, stopping at shutdown, and counting and logging a failed pass.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// One round of a background loop.
pub trait Pass: Sync {
    /// The loop's name, in its log lines and in the `loop` label of the failures counter.
    const NAME: &'static str;

    /// How long to wait after a pass that left nothing to do, or that failed.
    fn interval(&self) -> Duration;

    /// Does one round of work. `Ok(true)` means more may be waiting, so the next pass starts at
    /// once.
    fn pass(&self) -> impl Future<Output = anyhow::Result<bool>> + Send;
}

/// Runs `pass` until `shutdown`, counting each failed pass in the counter named `failures` (the
/// process's own, with the loop's name as its `loop` label). A pass in progress is finished first,
/// never cut short.
pub async fn run<P: Pass>(pass: &P, failures: &'static str, shutdown: CancellationToken) {
    tracing::info!(r#loop = P::NAME, "background loop started");
    while !shutdown.is_cancelled() {
        let pause = match pass.pass().await {
            Ok(true) => Duration::ZERO,
            Ok(false) => pass.interval(),
            Err(error) => {
                metrics::counter!(failures, "loop" => P::NAME).increment(1);
                tracing::error!(r#loop = P::NAME, error = format!("{error:#}"), "background pass failed");
                pass.interval()
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(pause) => {}
        }
    }
    tracing::info!(r#loop = P::NAME, "background loop stopped");
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    const INTERVAL: Duration = Duration::from_secs(3600);

    /// Takes each pass's result from a script, notes when (on the paused clock) each pass started,
    /// and shuts the loop down once the script is spent.
    struct Scripted {
        script: Mutex<Vec<anyhow::Result<bool>>>,
        started: Mutex<Vec<Duration>>,
        epoch: Instant,
        shutdown: CancellationToken,
    }

    impl Pass for Scripted {
        const NAME: &'static str = "scripted";

        fn interval(&self) -> Duration {
            INTERVAL
        }

        async fn pass(&self) -> anyhow::Result<bool> {
            self.started.lock().unwrap().push(self.epoch.elapsed());
            let mut script = self.script.lock().unwrap();
            let next = script.remove(0);
            if script.is_empty() {
                self.shutdown.cancel();
            }
            next
        }
    }

    #[tokio::test(start_paused = true)]
    async fn more_work_runs_the_next_pass_at_once_and_anything_else_waits_the_interval() {
        let shutdown = CancellationToken::new();
        let scripted = Scripted {
            script: Mutex::new(vec![Ok(true), Ok(true), Err(anyhow::anyhow!("no database")), Ok(false), Ok(false)]),
            started: Mutex::new(Vec::new()),
            epoch: Instant::now(),
            shutdown: shutdown.clone(),
        };

        run(&scripted, "test_loop_errors_total", shutdown).await;

        let hour = INTERVAL;
        assert_eq!(*scripted.started.lock().unwrap(), [Duration::ZERO, Duration::ZERO, Duration::ZERO, hour, hour * 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_loop_shut_down_before_it_starts_runs_no_pass() {
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let scripted = Scripted {
            script: Mutex::new(vec![Ok(false)]),
            started: Mutex::new(Vec::new()),
            epoch: Instant::now(),
            shutdown: shutdown.clone(),
        };

        run(&scripted, "test_loop_errors_total", shutdown).await;

        assert!(scripted.started.lock().unwrap().is_empty());
    }
}
