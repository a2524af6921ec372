//! The worker's metrics: names, descriptions, and the few helpers that record them.
//!
//! Every series carries `kind`: `payment` for the charges it sends, `refund` for the refunds.
//! Labels are low-cardinality enumerations (a kind, an outcome class), never an id. The recorder is
//! `oncepay_service::metrics`'s, rendered at `/metrics`. The outboxes' depth is not sampled here:
//! the reconciler samples it once for all workers (`oncepay_reconciler_outbox_depth`).

use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use oncepay_store::merchant_deliveries::{Health, Next};
use time::OffsetDateTime;

/// Outbox rows claimed.
pub const CLAIMS: &str = "oncepay_worker_claims_total";
/// Provider calls by outcome class ([`Kind::outcome_classes`]).
pub const PROVIDER_OUTCOMES: &str = "oncepay_worker_provider_outcomes_total";
/// Results not recorded because the lease had been taken over.
pub const LEASE_LOST: &str = "oncepay_worker_lease_lost_total";
/// Results that could not be recorded because of a database error (the lease then expires).
pub const RECORD_ERRORS: &str = "oncepay_worker_record_errors_total";
/// From the api's acceptance to the worker's recording of a payment's or a refund's outcome.
pub const DRAIN_LATENCY: &str = "oncepay_worker_drain_latency_seconds";
/// How long provider calls take.
pub const PROVIDER_CALL_DURATION: &str = "oncepay_worker_provider_call_duration_seconds";
/// Attempts to deliver an event to a merchant's endpoint, by what became of the delivery.
pub const EVENT_DELIVERIES: &str = "oncepay_worker_event_deliveries_total";
/// Endpoints disabled by a delivery, by why (`gone`, `failing`).
pub const ENDPOINTS_DISABLED: &str = "oncepay_worker_endpoints_disabled_total";

/// What the worker sent: the `kind` label of every series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A charge.
    Payment,
    /// A refund.
    Refund,
}

impl Kind {
    const ALL: [Self; 2] = [Self::Payment, Self::Refund];

    /// The label's value.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Payment => "payment",
            Self::Refund => "refund",
        }
    }

    /// Every `class` of [`PROVIDER_OUTCOMES`] for this kind (`SendOutcome::class`,
    /// `RefundOutcome::class`).
    pub const fn outcome_classes(self) -> &'static [&'static str] {
        match self {
            Self::Payment => &["charged", "declined", "not_sent", "uncertain"],
            Self::Refund => &["refunded", "failed", "unfinished", "not_sent", "uncertain"],
        }
    }
}

/// Describes every metric, so `/metrics` carries help text and units, and registers every counter
/// series at zero, so that a Prometheus `increase()` counts its first event.
pub fn describe() {
    describe_counter!(CLAIMS, "Outbox rows claimed for sending to the provider, by kind (payment, refund)");
    describe_counter!(PROVIDER_OUTCOMES, "Provider calls by kind and outcome class");
    describe_counter!(LEASE_LOST, "Results not recorded because another worker or the sweeper took the lease over");
    describe_counter!(RECORD_ERRORS, "Results that could not be recorded because of a database error");
    describe_histogram!(DRAIN_LATENCY, Unit::Seconds, "From acceptance to the recorded outcome of a send, by kind");
    describe_histogram!(PROVIDER_CALL_DURATION, Unit::Seconds, "Duration of provider calls, by kind");
    for kind in Kind::ALL {
        let label = kind.label();
        counter!(CLAIMS, "kind" => label).increment(0);
        for class in kind.outcome_classes() {
            counter!(PROVIDER_OUTCOMES, "kind" => label, "class" => *class).increment(0);
        }
        counter!(LEASE_LOST, "kind" => label).increment(0);
        counter!(RECORD_ERRORS, "kind" => label).increment(0);
    }
    describe_counter!(
        EVENT_DELIVERIES,
        "Attempts to deliver an event to a merchant, by result (delivered, retry, dead_lettered, lease_lost)"
    );
    describe_counter!(ENDPOINTS_DISABLED, "Merchants' endpoints disabled by a delivery, by reason (gone, failing)");
    for result in ["delivered", "retry", "dead_lettered", "lease_lost"] {
        counter!(EVENT_DELIVERIES, "result" => result).increment(0);
    }
    for reason in ["gone", "failing"] {
        counter!(ENDPOINTS_DISABLED, "reason" => reason).increment(0);
    }
}

pub(crate) fn delivery(next: Next) {
    let result = match next {
        Next::Delivered => "delivered",
        Next::RetryIn(_) => "retry",
        Next::DeadLetter => "dead_lettered",
    };
    counter!(EVENT_DELIVERIES, "result" => result).increment(1);
}

pub(crate) fn delivery_lease_lost() {
    counter!(EVENT_DELIVERIES, "result" => "lease_lost").increment(1);
}

pub(crate) fn endpoint_disabled(health: Health) {
    let reason = if health == Health::Gone { "gone" } else { "failing" };
    counter!(ENDPOINTS_DISABLED, "reason" => reason).increment(1);
}

pub(crate) fn claimed(kind: Kind, count: usize) {
    counter!(CLAIMS, "kind" => kind.label()).increment(count as u64);
}

pub(crate) fn provider_outcome(kind: Kind, class: &'static str, duration: Duration) {
    counter!(PROVIDER_OUTCOMES, "kind" => kind.label(), "class" => class).increment(1);
    histogram!(PROVIDER_CALL_DURATION, "kind" => kind.label()).record(duration.as_secs_f64());
}

pub(crate) fn lease_lost(kind: Kind) {
    counter!(LEASE_LOST, "kind" => kind.label()).increment(1);
}

pub(crate) fn record_error(kind: Kind) {
    counter!(RECORD_ERRORS, "kind" => kind.label()).increment(1);
}

/// A payment or refund accepted at `accepted_at` has left `pending` and `processing` for good, or for
/// the reconciler.
pub(crate) fn drained(kind: Kind, accepted_at: OffsetDateTime) {
    let latency: Duration = (OffsetDateTime::now_utc() - accepted_at).try_into().unwrap_or_default();
    histogram!(DRAIN_LATENCY, "kind" => kind.label()).record(latency.as_secs_f64());
}
