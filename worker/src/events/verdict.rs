//! What an attempt to deliver an event means: delivered, try again when, dead-lettered, and what it
//! says of the endpoint. Pure, so every rule is tested without a network.
//!
//! A 2xx is delivered, as is a message RabbitMQ confirmed to an exchange. A redirect is a failure: oncepay never follows one, so a merchant cannot
//! point a delivery somewhere it may not go. A 410 disables the endpoint at once. A 429 or a 503
//! with `Retry-After` is tried again no sooner than it asks, up to a cap. Anything else is tried
//! again on the retry schedule, with jitter, until the schedule is spent.

use std::time::Duration;

use oncepay_store::merchant_deliveries::{Health, Next};

/// The published retry schedule: the delay before each attempt after the first, which is at once
/// (Standard Webhooks' own: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h).
pub const DEFAULT_SCHEDULE_SECS: [u64; 9] = [5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400];

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The endpoint answered with this status, and `Retry-After` if it sent one.
    Answered {
        /// The HTTP status.
        status: u16,
        /// Its `Retry-After`, in seconds.
        retry_after: Option<Duration>,
    },
    /// RabbitMQ confirmed the message, and a queue bound to the exchange took it.
    Confirmed,
    /// No answer: the connection failed, timed out, or was refused by the address rules; or
    /// RabbitMQ refused the message or no queue took it.
    NoAnswer,
}

/// The rules an attempt is judged by.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The delays before the second, third, … attempts.
    pub schedule: Vec<Duration>,
    /// The longest `Retry-After` honoured.
    pub retry_after_cap: Duration,
    /// How long an endpoint may fail before it is disabled.
    pub disable_after: Duration,
}

/// What becomes of a delivery after the attempt that was number `attempt` (from 1) since it was
/// queued or replayed, and what the attempt says of its endpoint. `jitter` is a number in [0, 1):
/// the delay is spread by ±10 % around the schedule's, so a recovered endpoint is not met by every
/// retry at once.
pub fn judge(outcome: Outcome, attempt: u32, rules: &Rules, jitter: f64) -> (Next, Health) {
    let failed = Health::Failed { disable_after: rules.disable_after };
    let (retry_after, health) = match outcome {
        Outcome::Answered { status: 200..=299, .. } | Outcome::Confirmed => return (Next::Delivered, Health::Took),
        Outcome::Answered { status: 410, .. } => (None, Health::Gone),
        Outcome::Answered { status: 429 | 503, retry_after } => {
            (retry_after.map(|d| d.min(rules.retry_after_cap)), failed)
        }
        Outcome::Answered { .. } | Outcome::NoAnswer => (None, failed),
    };
    let Some(scheduled) = usize::try_from(attempt).ok().and_then(|n| rules.schedule.get(n.saturating_sub(1))) else {
        return (Next::DeadLetter, health);
    };
    let spread = scheduled.mul_f64(0.9 + 0.2 * jitter.clamp(0.0, 1.0));
    (Next::RetryIn(retry_after.map_or(spread, |asked| asked.max(spread))), health)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            schedule: DEFAULT_SCHEDULE_SECS.iter().copied().map(Duration::from_secs).collect(),
            retry_after_cap: Duration::from_secs(3600),
            disable_after: Duration::from_secs(5 * 86400),
        }
    }

    fn answered(status: u16) -> Outcome {
        Outcome::Answered { status, retry_after: None }
    }

    #[test]
    fn a_2xx_or_a_confirmed_message_is_delivered_and_heals_the_endpoint() {
        for status in [200, 201, 204, 299] {
            assert_eq!(judge(answered(status), 1, &rules(), 0.5), (Next::Delivered, Health::Took));
        }
        assert_eq!(judge(Outcome::Confirmed, 10, &rules(), 0.5), (Next::Delivered, Health::Took));
    }

    #[test]
    fn failures_follow_the_schedule_then_dead_letter() {
        let rules = rules();
        for (attempt, secs) in (1..).zip(DEFAULT_SCHEDULE_SECS) {
            let (next, _) = judge(answered(500), attempt, &rules, 0.5);
            assert_eq!(next, Next::RetryIn(Duration::from_secs(secs)), "after attempt {attempt}");
        }
        let tenth = u32::try_from(DEFAULT_SCHEDULE_SECS.len()).unwrap() + 1;
        assert_eq!(judge(Outcome::NoAnswer, tenth, &rules, 0.5).0, Next::DeadLetter);
    }

    #[test]
    fn jitter_spreads_a_delay_by_a_tenth_either_way() {
        let (Next::RetryIn(low), _) = judge(answered(500), 2, &rules(), 0.0) else { panic!() };
        let (Next::RetryIn(high), _) = judge(answered(500), 2, &rules(), 0.999_999) else { panic!() };
        assert_eq!(low, Duration::from_secs(270));
        assert!(high > Duration::from_secs(329) && high <= Duration::from_secs(330), "{high:?}");
    }

    #[test]
    fn redirects_and_other_statuses_are_failures() {
        for status in [301, 302, 307, 308, 400, 404, 500] {
            let (next, health) = judge(answered(status), 1, &rules(), 0.5);
            assert_eq!(next, Next::RetryIn(Duration::from_secs(5)), "{status}");
            assert!(matches!(health, Health::Failed { .. }), "{status}");
        }
    }

    #[test]
    fn a_410_disables_the_endpoint() {
        assert_eq!(judge(answered(410), 1, &rules(), 0.5).1, Health::Gone);
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap_and_never_shortens_the_schedule() {
        let asked = |secs| Outcome::Answered { status: 429, retry_after: Some(Duration::from_secs(secs)) };
        assert_eq!(judge(asked(120), 1, &rules(), 0.5).0, Next::RetryIn(Duration::from_secs(120)));
        assert_eq!(judge(asked(99_999), 1, &rules(), 0.5).0, Next::RetryIn(Duration::from_secs(3600)));
        assert_eq!(judge(asked(1), 3, &rules(), 0.5).0, Next::RetryIn(Duration::from_secs(1800)));
        let unavailable = Outcome::Answered { status: 503, retry_after: Some(Duration::from_secs(60)) };
        assert_eq!(judge(unavailable, 1, &rules(), 0.5).0, Next::RetryIn(Duration::from_secs(60)));
    }
}
