//! The reconciler's metrics: their names, help texts, and the series registered at zero on start;
//! and [`other_account`], a report that is only counted and logged. Labels are closed enumerations,
//! never ids.

use metrics::{Unit, counter, describe_counter, describe_gauge};

// The dead letters' own metrics are named beside their kinds, and listed here with the rest.
use oncepay_ops::dead_letters::Kind;
pub use oncepay_ops::dead_letters::{DEAD_LETTERS, OPEN_DEAD_LETTERS, REFUND_CONFLICT, REFUND_UNRESOLVED};
use oncepay_store::recon_runs::Class;

/// Webhook deliveries by `verdict`.
pub const WEBHOOKS: &str = "oncepay_reconciler_webhooks_total";
/// `unknown` payments that left `unknown`, by `how`.
pub const UNKNOWN_RESOLVED: &str = "oncepay_reconciler_unknown_resolved_total";
/// `unknown` refunds that left `unknown`, by `how`.
pub const UNKNOWN_REFUNDS_RESOLVED: &str = "oncepay_reconciler_unknown_refunds_resolved_total";
/// Provider reports (webhooks, lookups) of a charge or refund held by another provider account than
/// the payment's, which change nothing, by `source` and `object`.
pub const OTHER_ACCOUNT: &str = "oncepay_reconciler_other_account_reports_total";
/// Expired idempotency keys deleted.
pub const REAPED_KEYS: &str = "oncepay_reconciler_reaped_keys_total";
/// Expired refund idempotency keys deleted.
pub const REAPED_REFUND_KEYS: &str = "oncepay_reconciler_reaped_refund_keys_total";
/// Events to merchants deleted past their retention.
pub const REAPED_MERCHANT_EVENTS: &str = "oncepay_reconciler_reaped_merchant_events_total";
/// Ledger reconciliation discrepancies, by `class`.
pub const RECON_DISCREPANCIES: &str = "oncepay_reconciler_recon_discrepancies_total";
/// Ledger reconciliation runs that ended, by `status` (`completed`, `failed`).
pub const RECON_RUNS: &str = "oncepay_reconciler_recon_runs_total";
/// Expired worker leases taken back, by `outcome`.
pub const LEASES_TAKEN_OVER: &str = "oncepay_reconciler_leases_taken_over_total";
/// Expired worker leases of refunds taken back, by `outcome`.
pub const REFUND_LEASES_TAKEN_OVER: &str = "oncepay_reconciler_refund_leases_taken_over_total";
/// Passes of a background loop that failed, by `loop`.
pub const LOOP_ERRORS: &str = "oncepay_reconciler_loop_errors_total";

// The gauges describe the whole system's backlog, sampled from PostgreSQL by `crate::backlog`: one
// sampler per reconciler process, not one per worker.

/// Outbox rows by `state` (`due`, `scheduled`, `leased`).
pub const OUTBOX_DEPTH: &str = "oncepay_reconciler_outbox_depth";
/// Age of the oldest payment waiting in the outbox (accepted or queued again, not yet sent to an
/// outcome), 0 when none.
pub const OLDEST_PENDING_AGE: &str = "oncepay_reconciler_oldest_pending_age_seconds";
/// Payments in `unknown`.
pub const UNKNOWN_PAYMENTS: &str = "oncepay_reconciler_unknown_payments";
/// How long the oldest `unknown` payment has been `unknown`, 0 when none.
pub const OLDEST_UNKNOWN_AGE: &str = "oncepay_reconciler_oldest_unknown_age_seconds";
/// Refund outbox rows by `state` (`due`, `scheduled`, `leased`).
pub const REFUND_OUTBOX_DEPTH: &str = "oncepay_reconciler_refund_outbox_depth";
/// Age of the oldest refund waiting in the refund outbox, 0 when none.
pub const OLDEST_PENDING_REFUND_AGE: &str = "oncepay_reconciler_oldest_pending_refund_age_seconds";
/// Refunds in `unknown`.
pub const UNKNOWN_REFUNDS: &str = "oncepay_reconciler_unknown_refunds";
/// How long the oldest `unknown` refund has been `unknown`, 0 when none.
pub const OLDEST_UNKNOWN_REFUND_AGE: &str = "oncepay_reconciler_oldest_unknown_refund_age_seconds";
/// When the backlog gauges were last sampled (Unix time): stale gauges are visible as such.
pub const BACKLOG_SAMPLED_AT: &str = "oncepay_reconciler_backlog_sampled_timestamp_seconds";

/// Every `verdict` of [`WEBHOOKS`].
pub const WEBHOOK_VERDICTS: [&str; 14] = [
    "applied",
    "duplicate",
    "not_unknown",
    "dead_lettered",
    "already_terminal",
    "conflict",
    "unbookable",
    "unfinished",
    "not_ours",
    "other_account",
    "invalid_signature",
    "invalid_body",
    "unavailable",
    "error",
];
/// Every `how` of [`UNKNOWN_RESOLVED`].
pub const RESOLUTIONS: [&str; 6] =
    ["webhook_charged", "webhook_declined", "poll_charged", "poll_declined", "resend", "dead_lettered"];
/// Every `how` of [`UNKNOWN_REFUNDS_RESOLVED`].
pub const REFUND_RESOLUTIONS: [&str; 7] =
    ["webhook_refunded", "webhook_failed", "poll_refunded", "poll_failed", "poll_not_made", "resend", "dead_lettered"];
/// Every `outcome` of [`LEASES_TAKEN_OVER`] and [`REFUND_LEASES_TAKEN_OVER`].
pub const TAKEOVERS: [&str; 3] = ["released", "uncertain", "obsolete"];
/// Every `source` of [`OTHER_ACCOUNT`].
pub const OTHER_ACCOUNT_SOURCES: [&str; 2] = ["webhook", "lookup"];
/// Every `object` of [`OTHER_ACCOUNT`].
pub const OTHER_ACCOUNT_OBJECTS: [&str; 2] = ["charge", "refund"];
/// Every `loop` of [`LOOP_ERRORS`].
pub const LOOPS: [&str; 7] = ["poller", "refund_poller", "sweeper", "reaper", "recon", "recon_queue", "backlog"];

/// Describes every metric and registers every counter series at zero, for every label value.
///
/// Each series then exists from the first scrape, so Prometheus's `increase()` sees the first dead
/// letter or the first failed webhook as an increase from 0, not as a new series (which it cannot
/// tell from one that was always there).
/// The operators' own metrics are described by [`oncepay_ops::metrics`].
pub fn describe() {
    describe_counter!(WEBHOOKS, "Provider webhook deliveries, by verdict");
    describe_counter!(UNKNOWN_RESOLVED, "Payments that left `unknown`, by how");
    describe_counter!(UNKNOWN_REFUNDS_RESOLVED, "Refunds that left `unknown`, by how");
    describe_counter!(DEAD_LETTERS, "Dead letters opened for an operator, by kind");
    describe_counter!(
        OTHER_ACCOUNT,
        "Provider reports of a charge or refund in another account than the payment's, which change nothing"
    );
    describe_counter!(REAPED_KEYS, "Expired idempotency keys of terminal payments deleted");
    describe_counter!(REAPED_REFUND_KEYS, "Expired idempotency keys of terminal refunds deleted");
    describe_counter!(REAPED_MERCHANT_EVENTS, "Events to merchants deleted past their retention, none still owed");
    describe_counter!(RECON_DISCREPANCIES, "Ledger reconciliation discrepancies found, by class");
    describe_counter!(RECON_RUNS, "Ledger reconciliation runs that ended, by status");
    describe_counter!(LEASES_TAKEN_OVER, "Expired worker leases taken back by the sweeper, by outcome");
    describe_counter!(
        REFUND_LEASES_TAKEN_OVER,
        "Expired worker leases of refunds taken back by the sweeper, by outcome"
    );
    describe_counter!(LOOP_ERRORS, "Background loop passes that failed, by loop");
    describe_gauge!(OUTBOX_DEPTH, "Outbox rows by state (due, scheduled, leased)");
    describe_gauge!(OLDEST_PENDING_AGE, Unit::Seconds, "Age of the oldest payment waiting in the outbox");
    describe_gauge!(UNKNOWN_PAYMENTS, "Payments whose outcome is unknown, awaiting a webhook or a poll");
    describe_gauge!(OLDEST_UNKNOWN_AGE, Unit::Seconds, "How long the oldest unknown payment has been unknown");
    describe_gauge!(REFUND_OUTBOX_DEPTH, "Refund outbox rows by state (due, scheduled, leased)");
    describe_gauge!(OLDEST_PENDING_REFUND_AGE, Unit::Seconds, "Age of the oldest refund waiting in the refund outbox");
    describe_gauge!(UNKNOWN_REFUNDS, "Refunds whose outcome is unknown, awaiting a webhook or a lookup");
    describe_gauge!(OLDEST_UNKNOWN_REFUND_AGE, Unit::Seconds, "How long the oldest unknown refund has been unknown");
    describe_gauge!(OPEN_DEAD_LETTERS, "Dead letters awaiting an operator, by kind");
    describe_gauge!(BACKLOG_SAMPLED_AT, Unit::Seconds, "Unix time of the last successful backlog sample");

    for verdict in WEBHOOK_VERDICTS {
        counter!(WEBHOOKS, "verdict" => verdict).increment(0);
    }
    for how in RESOLUTIONS {
        counter!(UNKNOWN_RESOLVED, "how" => how).increment(0);
    }
    for how in REFUND_RESOLUTIONS {
        counter!(UNKNOWN_REFUNDS_RESOLVED, "how" => how).increment(0);
    }
    for kind in Kind::ALL.map(Kind::as_str).into_iter().chain([REFUND_CONFLICT]) {
        counter!(DEAD_LETTERS, "kind" => kind).increment(0);
    }
    for source in OTHER_ACCOUNT_SOURCES {
        for object in OTHER_ACCOUNT_OBJECTS {
            counter!(OTHER_ACCOUNT, "source" => source, "object" => object).increment(0);
        }
    }
    counter!(REAPED_KEYS).increment(0);
    counter!(REAPED_REFUND_KEYS).increment(0);
    counter!(REAPED_MERCHANT_EVENTS).increment(0);
    for class in Class::ALL {
        counter!(RECON_DISCREPANCIES, "class" => class.as_str()).increment(0);
    }
    for status in ["completed", "failed"] {
        counter!(RECON_RUNS, "status" => status).increment(0);
    }
    for outcome in TAKEOVERS {
        counter!(LEASES_TAKEN_OVER, "outcome" => outcome).increment(0);
        counter!(REFUND_LEASES_TAKEN_OVER, "outcome" => outcome).increment(0);
    }
    for name in LOOPS {
        counter!(LOOP_ERRORS, "loop" => name).increment(0);
    }
    oncepay_ops::metrics::describe();
}

/// Counts a report of a charge or refund (`object`) held by another provider account than the
/// payment's, from a webhook or a lookup (`source`), and logs `why`: that is all it does.
pub fn other_account(source: &'static str, object: &'static str, why: &str) {
    counter!(OTHER_ACCOUNT, "source" => source, "object" => object).increment(1);
    tracing::warn!(source, object, why, "a report from another provider account than the payment's changes nothing");
}
