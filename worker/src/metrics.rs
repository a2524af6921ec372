//! The worker's metrics: names, descriptions, and the few helpers that record them.
//!
//! Labels are low-cardinality enumerations (an outcome class), never an id. The recorder is
//! `oncepay_service::metrics`'s, rendered at `/metrics`. The outbox's depth is not sampled here: the
//! reconciler samples it once for all workers (`oncepay_reconciler_outbox_depth`).

use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};

/// Outbox rows claimed.
pub const CLAIMS: &str = "oncepay_worker_claims_total";
/// Provider calls by outcome class: `charged`, `declined`, `not_sent`, `uncertain`.
pub const PROVIDER_OUTCOMES: &str = "oncepay_worker_provider_outcomes_total";
/// Results not recorded because the lease had been taken over.
pub const LEASE_LOST: &str = "oncepay_worker_lease_lost_total";
/// Results that could not be recorded because of a database error (the lease then expires).
pub const RECORD_ERRORS: &str = "oncepay_worker_record_errors_total";
/// From the api's acceptance to the worker's recording of the payment's outcome.
pub const DRAIN_LATENCY: &str = "oncepay_worker_drain_latency_seconds";
/// How long provider calls take.
pub const PROVIDER_CALL_DURATION: &str = "oncepay_worker_provider_call_duration_seconds";

/// Every `class` of [`PROVIDER_OUTCOMES`] (`SendOutcome::class`).
pub const OUTCOME_CLASSES: [&str; 4] = ["charged", "declined", "not_sent", "uncertain"];

/// Describes every metric, so `/metrics` carries help text and units, and registers every counter
/// series at zero, so that a Prometheus `increase()` counts its first event.
pub fn describe() {
    describe_counter!(CLAIMS, "Outbox rows claimed for sending to the provider");
    describe_counter!(PROVIDER_OUTCOMES, "Provider calls by outcome class (charged, declined, not_sent, uncertain)");
    describe_counter!(LEASE_LOST, "Results not recorded because another worker or the sweeper took the lease over");
    describe_counter!(RECORD_ERRORS, "Results that could not be recorded because of a database error");
    describe_histogram!(DRAIN_LATENCY, Unit::Seconds, "From acceptance to the recorded outcome of a payment's send");
    describe_histogram!(PROVIDER_CALL_DURATION, Unit::Seconds, "Duration of provider charge calls");
    counter!(CLAIMS).increment(0);
    for class in OUTCOME_CLASSES {
        counter!(PROVIDER_OUTCOMES, "class" => class).increment(0);
    }
    counter!(LEASE_LOST).increment(0);
    counter!(RECORD_ERRORS).increment(0);
}

pub(crate) fn claimed(count: usize) {
    counter!(CLAIMS).increment(count as u64);
}

pub(crate) fn provider_outcome(class: &'static str, duration: Duration) {
    counter!(PROVIDER_OUTCOMES, "class" => class).increment(1);
    histogram!(PROVIDER_CALL_DURATION).record(duration.as_secs_f64());
}

pub(crate) fn lease_lost() {
    counter!(LEASE_LOST).increment(1);
}

pub(crate) fn record_error() {
    counter!(RECORD_ERRORS).increment(1);
}

pub(crate) fn drained(latency: Duration) {
    histogram!(DRAIN_LATENCY).record(latency.as_secs_f64());
}
