//! What `oncepay` tells its user: the text and JSON it prints, and the exit code that sums it up.
//!
//! Pure: functions here build strings and codes; `main` writes them. Nothing here ever sees the
//! API key.

use std::error::Error as _;
use std::fmt::Write as _;
use std::process::ExitCode;

use oncepay_client::{Error, Payment, PaymentStatus};
use serde_json::json;
use time::format_description::well_known::Rfc3339;

/// How the process ends; the codes are listed in `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The payment succeeded, or `pay --no-wait` saw it accepted.
    Succeeded = 0,
    /// The api's response could not be understood.
    Unexpected = 1,
    /// Bad flags, no API key, an invalid URL.
    Usage = 2,
    /// The payment failed.
    Failed = 3,
    /// The payment is not final yet.
    NotFinal = 4,
    /// The api rejected the request.
    Rejected = 5,
    /// No response after retries.
    Unavailable = 6,
}

impl Exit {
    /// The exit code for a payment seen in `status`.
    pub fn of_status(status: PaymentStatus) -> Self {
        match status {
            PaymentStatus::Succeeded => Self::Succeeded,
            PaymentStatus::Failed => Self::Failed,
            PaymentStatus::Pending
            | PaymentStatus::Processing
            | PaymentStatus::Unknown
            | PaymentStatus::DeadLettered => Self::NotFinal,
        }
    }

    /// The exit code for a request that ended in `error`.
    pub fn of_error(error: &Error) -> Self {
        match error {
            Error::Problem { status, .. } if *status < 500 => Self::Rejected,
            Error::Problem { .. } | Error::Http(_) | Error::GaveUp { .. } => Self::Unavailable,
            Error::Decode { .. } => Self::Unexpected,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        Self::from(exit as u8)
    }
}

/// What a status means for the person waiting on it.
pub fn meaning(status: PaymentStatus) -> &'static str {
    match status {
        PaymentStatus::Pending => "accepted, waiting to be sent to the provider",
        PaymentStatus::Processing => "being sent to the provider",
        PaymentStatus::Succeeded => "the customer was charged",
        PaymentStatus::Failed => "the customer was not charged",
        PaymentStatus::Unknown => {
            "the provider's response was lost; oncepay is finding out whether the charge happened, which can take a while"
        }
        PaymentStatus::DeadLettered => "automatic reconciliation gave up; an operator will settle it",
    }
}

/// The line `pay` prints before sending anything, so the key survives whatever happens next.
pub fn key_line(key: &str) -> String {
    format!("idempotency key: {key}\n  (to retry this payment safely, run the same command with --key {key})")
}

/// One line per status seen while following a payment.
pub fn status_line(payment: &Payment, note: Option<&str>) -> String {
    match note {
        Some(note) => format!("payment {}: {} ({note})", payment.id, payment.status),
        None => format!("payment {}: {}", payment.id, payment.status),
    }
}

/// The full text description of a payment.
pub fn describe(payment: &Payment) -> String {
    let mut text = String::new();
    let mut row = |label: &str, value: &str| {
        let _ = writeln!(text, "{label:<12} {value}");
    };
    row("payment", &payment.id.to_string());
    row("status", &format!("{} ({})", payment.status, meaning(payment.status)));
    row("amount", &format!("{} {} (minor units)", payment.amount, payment.currency));
    row("customer", &payment.customer_id);
    if let Some(description) = &payment.description {
        row("description", description);
    }
    if !payment.metadata.is_empty() {
        let pairs: Vec<String> = payment.metadata.iter().map(|(key, value)| format!("{key}={value}")).collect();
        row("metadata", &pairs.join(", "));
    }
    if let Some(method) = &payment.payment_method {
        row("method", method);
    }
    if let Some(customer) = &payment.provider_customer {
        row("provider customer", customer);
    }
    if let Some(charge) = &payment.provider_charge_id {
        row("charge", charge);
    }
    if let Some(failure) = &payment.failure {
        row("failure", &format!("{}: {}", failure.code, failure.message));
    }
    row("created", &timestamp(payment.created_at));
    row("updated", &timestamp(payment.updated_at));
    text.trim_end().to_owned()
}

/// What to do about a payment that was not final when waiting stopped.
pub fn still_open(payment: &Payment, waited_secs: u64) -> String {
    format!(
        "payment {} is still {} after {waited_secs} s: {}.\nfollow it with: oncepay status {} --wait 60",
        payment.id,
        payment.status,
        meaning(payment.status),
        payment.id
    )
}

/// `pay --json`: the key, whether the api had seen it, and the payment resource.
pub fn pay_json(key: &str, replayed: bool, payment: &Payment) -> String {
    json!({"idempotency_key": key, "replayed": replayed, "payment": payment}).to_string()
}

/// `status --json`: the payment resource.
pub fn payment_json(payment: &Payment) -> String {
    json!(payment).to_string()
}

/// An error with its causes, one `: ` apart, and the api's field errors.
pub fn error_text(error: &Error) -> String {
    let mut text = format!("error: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

fn timestamp(at: time::OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_else(|_| at.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use oncepay_client::{Failure, FieldError, Problem};
    use time::macros::datetime;

    use super::*;

    fn payment(status: PaymentStatus) -> Payment {
        Payment {
            id: "0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e7f".parse().unwrap(),
            status,
            amount: 1999,
            currency: "EUR".into(),
            customer_id: "cus_42".into(),
            description: None,
            metadata: BTreeMap::new(),
            payment_method: None,
            provider_customer: None,
            created_at: datetime!(2026-11-22 04:23:00.5 UTC),
            updated_at: datetime!(2026-11-22 04:23:01 UTC),
            provider_charge_id: None,
            failure: None,
        }
    }

    fn problem(status: u16) -> Error {
        Error::Problem {
            status,
            problem: Problem {
                type_uri: "https://oncepay.dev/problems/x".into(),
                title: "T".into(),
                status: Some(status),
                detail: "d".into(),
                errors: Vec::new(),
            },
        }
    }

    #[test]
    fn the_exit_code_follows_the_status() {
        let cases = [
            (PaymentStatus::Succeeded, 0),
            (PaymentStatus::Failed, 3),
            (PaymentStatus::Pending, 4),
            (PaymentStatus::Processing, 4),
            (PaymentStatus::Unknown, 4),
            (PaymentStatus::DeadLettered, 4),
        ];
        for (status, code) in cases {
            assert_eq!(Exit::of_status(status) as u8, code, "{status}");
        }
    }

    #[test]
    fn the_exit_code_tells_a_rejection_from_an_outage() {
        let decode = Error::Decode { status: 202, source: serde_json::from_str::<u8>("x").unwrap_err() };
        let gave_up = Error::GaveUp { attempts: 3, last: Box::new(problem(503)) };
        let cases = [
            (problem(422), Exit::Rejected),
            (problem(501), Exit::Unavailable),
            (gave_up, Exit::Unavailable),
            (decode, Exit::Unexpected),
        ];
        for (error, exit) in cases {
            assert_eq!(Exit::of_error(&error), exit, "{error:?}");
        }
    }

    #[test]
    fn a_failed_payment_is_described_with_its_failure() {
        let mut failed = payment(PaymentStatus::Failed);
        failed.failure = Some(Failure { code: "card_declined".into(), message: "The card was declined.".into() });
        failed.metadata.insert("order".into(), "A-17".into());
        failed.payment_method = Some("pm_card_chargeDeclined".into());

        let text = describe(&failed);

        assert_eq!(
            text,
            "payment      0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e7f
status       failed (the customer was not charged)
amount       1999 EUR (minor units)
customer     cus_42
metadata     order=A-17
method       pm_card_chargeDeclined
failure      card_declined: The card was declined.
created      2026-11-22T04:23:00.5Z
updated      2026-11-22T04:23:01Z"
        );
    }

    #[test]
    fn an_error_shows_its_whole_chain_including_field_errors() {
        let mut rejected = problem(400);
        if let Error::Problem { problem, .. } = &mut rejected {
            problem.errors.push(FieldError { field: "amount".into(), message: "must be at least 1".into() });
        }
        let gave_up = Error::GaveUp { attempts: 2, last: Box::new(problem(503)) };

        assert_eq!(
            error_text(&rejected),
            "error: the oncepay api responded with 400: T: d (amount: must be at least 1)"
        );
        assert_eq!(error_text(&gave_up), "error: gave up after 2 attempt(s): the oncepay api responded with 503: T: d");
    }

    #[test]
    fn pay_json_carries_the_key_and_the_raw_resource() {
        let accepted = payment(PaymentStatus::Pending);

        let printed: serde_json::Value = serde_json::from_str(&pay_json("k-1", true, &accepted)).unwrap();

        assert_eq!(printed["idempotency_key"], "k-1");
        assert_eq!(printed["replayed"], true);
        assert_eq!(printed["payment"], serde_json::to_value(&accepted).unwrap());
    }
}
