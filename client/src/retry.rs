//! When to try a request again, and how long to wait first: exponential backoff with jitter, and
//! never less than the server's `Retry-After`.
//!
//! Pure apart from the random source and the clock passed in; the I/O loop lives in `client`.

use std::time::{Duration, SystemTime};

use rand::Rng;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

use crate::problem::Problem;

/// How the backoff is randomised, so that clients that failed together do not come back together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Jitter {
    /// Exactly the backoff ceiling. Only for tests and single clients.
    None,
    /// Uniform in `[0, ceiling]`: the best spread when many clients fail at once.
    #[default]
    Full,
    /// Uniform in `[ceiling / 2, ceiling]`: spread, but never much shorter than the ceiling.
    Equal,
}

/// How often and how patiently to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// The backoff ceiling of the first retry.
    pub base_backoff: Duration,
    /// The largest backoff ceiling.
    pub max_backoff: Duration,
    /// How the backoff is randomised.
    pub jitter: Jitter,
    /// The longest `Retry-After` the client will sit out; a longer one ends the retries.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    /// Six attempts, the backoff from 200 ms doubling up to 5 s (full jitter), and up to a minute
    /// for a server that asks for it.
    fn default() -> Self {
        Self {
            max_attempts: 6,
            base_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            jitter: Jitter::Full,
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Wait this long, then try again.
    RetryAfter(Duration),
    /// Stop: attempts are spent, or the server asked for a longer wait than allowed.
    GiveUp,
}

impl RetryPolicy {
    /// Attempts in all, never fewer than one.
    pub(crate) fn attempts(&self) -> u32 {
        self.max_attempts.max(1)
    }

    /// The backoff ceiling before retry `retry` (1-based), before jitter:
    /// `min(max_backoff, base_backoff * 2^(retry-1))`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(31);
        self.base_backoff.saturating_mul(1u32 << doublings).min(self.max_backoff)
    }

    /// A jittered backoff before retry `retry` (1-based).
    pub(crate) fn backoff(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(retry);
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => ceiling.mul_f64(rng.random_range(0.0..=1.0)),
            Jitter::Equal => ceiling / 2 + (ceiling / 2).mul_f64(rng.random_range(0.0..=1.0)),
        }
    }

    /// Decides what follows failed attempt number `attempt` (1-based), given the server's
    /// `Retry-After`, if it sent one.
    pub(crate) fn next(&self, attempt: u32, retry_after: Option<Duration>, rng: &mut impl Rng) -> Next {
        if attempt >= self.attempts() {
            return Next::GiveUp;
        }
        match retry_after {
            // Give up rather than hang silently for as long as a server asks.
            Some(asked) if asked > self.max_retry_after => Next::GiveUp,
            // The server's `Retry-After` is a floor under the backoff, never shortened.
            asked => Next::RetryAfter(self.backoff(attempt, rng).max(asked.unwrap_or_default())),
        }
    }
}

/// Conflicts the api reports as final: the request conflicts with the state of what it names, not
/// with another request under way, and sending it again soon will not help.
const FINAL_CONFLICTS: [&str; 1] = ["payment-not-refundable"];

/// Whether a response with `status` may be retried under the same idempotency key: the request
/// was not rejected, it just could not be served now (`408`, `409` key busy, `429`, `500`, `502`,
/// `503`, `504`). The key makes the retry safe; it replays whatever was accepted.
pub(crate) fn is_retryable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 409 | 429 | 500 | 502 | 503 | 504)
}

/// [`is_retryable_status`], except a `409` whose `problem` says the conflict is final (a refund of
/// a payment that has not succeeded).
pub(crate) fn is_retryable(status: StatusCode, problem: &Problem) -> bool {
    is_retryable_status(status) && !(status == StatusCode::CONFLICT && FINAL_CONFLICTS.contains(&problem.kind()))
}

/// Reads `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP date, relative to `now`. A
/// date in the past means no wait; an unreadable value is ignored.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use reqwest::header::HeaderValue;

    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        max_attempts: 4,
        base_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(1),
        jitter: Jitter::None,
        max_retry_after: Duration::from_secs(10),
    };

    #[test]
    fn the_ceiling_doubles_until_the_cap() {
        let ceilings: Vec<u128> = (1..=6).map(|n| POLICY.ceiling(n).as_millis()).collect();

        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(POLICY.ceiling(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_its_band() {
        let mut rng = StdRng::seed_from_u64(7);
        let bands = [(Jitter::None, 800, 800), (Jitter::Full, 0, 800), (Jitter::Equal, 400, 800)];
        for (jitter, low, high) in bands {
            let policy = RetryPolicy { jitter, ..POLICY };
            for _ in 0..1000 {
                let millis = policy.backoff(4, &mut rng).as_millis();
                assert!((low..=high).contains(&millis), "{jitter:?}: {millis}");
            }
        }
    }

    #[test]
    fn retry_after_is_a_floor_under_the_backoff_and_too_long_a_one_gives_up() {
        let mut rng = StdRng::seed_from_u64(7);
        let secs = Duration::from_secs;
        let cases = [
            (1, None, Next::RetryAfter(Duration::from_millis(100))),
            (2, Some(Duration::ZERO), Next::RetryAfter(Duration::from_millis(200))),
            (1, Some(secs(3)), Next::RetryAfter(secs(3))),
            (3, Some(secs(10)), Next::RetryAfter(secs(10))),
            (3, Some(secs(11)), Next::GiveUp),
            (4, None, Next::GiveUp),
            (9, Some(secs(1)), Next::GiveUp),
        ];
        for (attempt, asked, expected) in cases {
            assert_eq!(POLICY.next(attempt, asked, &mut rng), expected, "attempt {attempt}, {asked:?}");
        }
    }

    #[test]
    fn zero_attempts_still_means_one() {
        let policy = RetryPolicy { max_attempts: 0, ..POLICY };

        assert_eq!(policy.next(1, None, &mut StdRng::seed_from_u64(1)), Next::GiveUp);
    }

    #[test]
    fn only_responses_that_did_not_reject_the_request_are_retried() {
        let retried = [408, 409, 429, 500, 502, 503, 504];
        let final_ = [200, 202, 301, 400, 401, 403, 404, 405, 413, 415, 422, 501, 505];
        for code in retried {
            assert!(is_retryable_status(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in final_ {
            assert!(!is_retryable_status(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }

    #[test]
    fn a_conflict_with_the_state_of_a_payment_is_final_and_one_with_a_request_under_way_is_not() {
        let conflict = |body: &[u8]| Problem::from_response(StatusCode::CONFLICT, body);
        let in_use = conflict(br#"{"type": "https://oncepay.dev/problems/idempotency-key-in-use"}"#);
        let not_refundable = conflict(br#"{"type": "https://oncepay.dev/problems/payment-not-refundable"}"#);
        let from_a_proxy = conflict(b"<html>conflict</html>");
        let unavailable = Problem::from_response(StatusCode::SERVICE_UNAVAILABLE, b"");

        assert!(is_retryable(StatusCode::CONFLICT, &in_use));
        assert!(is_retryable(StatusCode::CONFLICT, &from_a_proxy));
        assert!(!is_retryable(StatusCode::CONFLICT, &not_refundable));
        assert!(is_retryable(StatusCode::SERVICE_UNAVAILABLE, &unavailable));
        assert!(!is_retryable(StatusCode::UNPROCESSABLE_ENTITY, &not_refundable));
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = httpdate::parse_http_date("Sun, 22 Nov 2026 04:23:00 GMT").unwrap();
        let cases = [
            ("2", Some(Duration::from_secs(2))),
            (" 0 ", Some(Duration::ZERO)),
            ("Sun, 22 Nov 2026 04:23:05 GMT", Some(Duration::from_secs(5))),
            ("Sun, 22 Nov 2026 04:22:00 GMT", Some(Duration::ZERO)),
            ("-1", None),
            ("soon", None),
        ];
        for (value, expected) in cases {
            let mut headers = HeaderMap::new();
            headers.insert(RETRY_AFTER, HeaderValue::from_static(value));
            assert_eq!(retry_after(&headers, now), expected, "{value:?}");
        }
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }
}
