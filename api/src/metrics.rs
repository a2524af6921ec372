//! The api's metrics: their names and help texts, and the intake series registered at zero on
//! start. Each is recorded where it happens. Labels are closed enumerations, never ids or keys.

use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram};

/// Intake requests by how each ended (the `outcome` label), one per `POST /v1/payments`, recorded by
/// `create` for `create_payment`.
pub const INTAKE: &str = "oncepay_api_intake_total";
/// Refund requests by how each ended (the `outcome` label), one per `POST /v1/payments/{id}/refunds`,
/// recorded by `create` for `create_refund`.
pub const REFUND_INTAKE: &str = "oncepay_api_refund_intake_total";
/// Request latency by route pattern and method, recorded by `request_span` for every request.
pub const REQUEST_DURATION: &str = "oncepay_api_request_duration_seconds";
/// Requests written together, one sample per group written, recorded by `accept_groups`.
pub const INTAKE_GROUP_SIZE: &str = "oncepay_api_intake_group_size";
/// Requests waiting for their group's write or being written, recorded by `accept_groups`.
pub const INTAKE_WRITING: &str = "oncepay_api_intake_writing";
/// Long polls waiting for a payment or a refund to change, recorded by `watch`.
pub const LONG_POLLS_WAITING: &str = "oncepay_api_long_polls_waiting";
/// Payment requests taken from the broker, by what became of each (the `outcome` label,
/// [`BROKER_LABELS`]), recorded by `broker`.
pub const BROKER_MESSAGES: &str = "oncepay_api_broker_messages_total";

/// Every `outcome` of [`INTAKE`], as `create` labels them: 202 `created`, a `replayed` key, 422
/// `key_reused` (same key, other request), 409 `key_in_use` (the key is being written right now), 503
/// `store_unavailable`, 503 `key_check_busy` (no place to read an API key), 429 `rate_limited`,
/// 400/413/415 `invalid`, 401 `unauthorized`, 500 `error`.
pub const INTAKE_LABELS: [&str; 10] = [
    "created",
    "replayed",
    "key_reused",
    "key_in_use",
    "store_unavailable",
    "key_check_busy",
    "rate_limited",
    "invalid",
    "unauthorized",
    "error",
];

/// Every `outcome` of [`REFUND_INTAKE`], as `create` labels them: those of [`INTAKE_LABELS`]
/// (409 `key_in_use` also when another refund of the payment is being written), plus 404 `not_found`
/// (no such payment for the tenant) and `refused` (409 `payment-not-refundable`, 422
/// `nothing-to-refund` or `refund-exceeds-payment`).
pub const REFUND_INTAKE_LABELS: [&str; 12] = [
    "created",
    "replayed",
    "key_reused",
    "key_in_use",
    "store_unavailable",
    "key_check_busy",
    "rate_limited",
    "invalid",
    "unauthorized",
    "not_found",
    "refused",
    "error",
];

/// Messages ready in the broker's queues, by `queue` (`payments`, `dead_letters`), sampled by each
/// api process's consumer (`broker.sample_interval_ms`).
pub const BROKER_QUEUE_MESSAGES: &str = "oncepay_api_broker_queue_messages";

/// How long ago the oldest message in the dead-letter queue was refused (0 when it is empty),
/// sampled with [`BROKER_QUEUE_MESSAGES`].
pub const BROKER_DEAD_LETTER_AGE: &str = "oncepay_api_broker_dead_letter_age_seconds";

/// Every `outcome` of [`BROKER_MESSAGES`]: `created`, `replayed` (both acknowledged),
/// `dead_lettered`, `delayed` (its key in use elsewhere, or its tenant over its rate),
/// `store_unavailable` (kept, tried again; one per try), `error` (returned to the queue).
pub const BROKER_LABELS: [&str; 6] = ["created", "replayed", "dead_lettered", "delayed", "store_unavailable", "error"];

/// Describes the api's metrics and registers every intake label at zero, so each series exists
/// from the first scrape and a Prometheus `increase()` counts the first 503 or 422 instead of
/// missing a series that just appeared.
pub fn describe() {
    describe_counter!(INTAKE, "POST /v1/payments requests, by outcome");
    describe_counter!(REFUND_INTAKE, "POST /v1/payments/{id}/refunds requests, by outcome");
    describe_histogram!(REQUEST_DURATION, Unit::Seconds, "Time to respond to a request, by route pattern and method");
    describe_histogram!(INTAKE_GROUP_SIZE, Unit::Count, "Requests of one tenant written in one statement and commit");
    describe_gauge!(INTAKE_WRITING, "POST /v1/payments requests waiting for their group's write or being written");
    describe_gauge!(LONG_POLLS_WAITING, "Status requests holding their response for a change (Prefer: wait)");
    for label in INTAKE_LABELS {
        counter!(INTAKE, "outcome" => label).increment(0);
    }
    for label in REFUND_INTAKE_LABELS {
        counter!(REFUND_INTAKE, "outcome" => label).increment(0);
    }
    describe_counter!(BROKER_MESSAGES, "Payment requests taken from the broker, by outcome");
    describe_gauge!(BROKER_QUEUE_MESSAGES, "Messages ready in the broker's payments and dead-letter queues, sampled");
    describe_gauge!(
        BROKER_DEAD_LETTER_AGE,
        "Seconds since the oldest message in the broker's dead-letter queue was refused"
    );
    for label in BROKER_LABELS {
        counter!(BROKER_MESSAGES, "outcome" => label).increment(0);
    }
}
