//! Waiting for what another task or process makes true: one polling loop with a deadline, for the
//! tests, the tasks and the benchmark, in place of a deadline-and-sleep loop written out in each.

use std::future::Future;
use std::time::Duration;

use anyhow::bail;

/// How long to sleep between two checks.
const EVERY: Duration = Duration::from_millis(50);

/// Runs `check` every 50 ms until it returns `Some`, for up to `within` (a check still running then
/// is dropped), and returns what it returned. On timeout the error says
/// `"waited {within:?} for {what}"`.
///
/// A check that can tell it will never succeed returns `Some(Err(..))`, and the caller unwraps the
/// two results (`wait_until(..).await??`).
pub async fn wait_until<T, F>(what: &str, within: Duration, mut check: impl FnMut() -> F) -> anyhow::Result<T>
where
    F: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, check()).await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) if tokio::time::Instant::now() < deadline => tokio::time::sleep(EVERY).await,
            Ok(None) | Err(_) => bail!("waited {within:?} for {what}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn returns_what_the_check_found_once_it_finds_it() {
        let mut calls = 0;
        let found = wait_until("the third call", Duration::from_secs(1), || {
            calls += 1;
            let now = calls;
            async move { (now == 3).then_some(now) }
        })
        .await
        .unwrap();
        assert_eq!(found, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_that_never_returns_is_given_up_on_in_time() {
        let waited = wait_until("an answer", Duration::from_secs(1), std::future::pending::<Option<()>>);

        let ended = tokio::time::timeout(Duration::from_secs(2), waited).await;

        assert!(matches!(ended, Ok(Err(_))), "still waiting after twice its time");
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_its_time_and_says_what_it_waited_for() {
        let refused = wait_until("a miracle", Duration::from_secs(1), || async { None::<()> }).await.unwrap_err();
        assert_eq!(refused.to_string(), "waited 1s for a miracle");
    }
}
