//! What `oncepay` tells its user: the text and JSON it prints, and the exit code that sums it up.
//!
//! Pure: functions here build strings and codes; `main` writes them. Nothing here ever sees the
//! API key.

use std::error::Error as _;
use std::fmt::Write as _;
use std::process::ExitCode;

use oncepay_client::{DeadLetter, Error, Payment, PaymentStatus, Refund, RefundStatus};
use serde_json::json;
use time::format_description::well_known::Rfc3339;

/// How the process ends; the codes are listed in `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The payment or refund succeeded, or `--no-wait` saw it accepted.
    Succeeded = 0,
    /// The api's response could not be understood.
    Unexpected = 1,
    /// Bad flags, no API key, an invalid URL.
    Usage = 2,
    /// The payment or refund failed.
    Failed = 3,
    /// The payment or refund is not final yet.
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

    /// The exit code for a refund seen in `status`: as for a payment, by its refund's meaning.
    pub fn of_refund(status: RefundStatus) -> Self {
        match status {
            RefundStatus::Succeeded => Self::Succeeded,
            RefundStatus::Failed => Self::Failed,
            RefundStatus::Pending | RefundStatus::Processing | RefundStatus::Unknown | RefundStatus::DeadLettered => {
                Self::NotFinal
            }
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

/// What a refund's status means for the person waiting on it.
pub fn refund_meaning(status: RefundStatus) -> &'static str {
    match status {
        RefundStatus::Pending => "accepted, waiting to be sent to the provider",
        RefundStatus::Processing => "being sent to the provider",
        RefundStatus::Succeeded => "the money went back to the customer",
        RefundStatus::Failed => "no money went back to the customer",
        RefundStatus::Unknown => {
            "the provider's response was lost; oncepay is finding out whether the refund happened, which can take a while"
        }
        RefundStatus::DeadLettered => "automatic reconciliation gave up; an operator will settle it",
    }
}

/// The line `pay` and `refund` print before sending anything, so the key survives whatever happens
/// next. `what` is `payment` or `refund`.
pub fn key_line(key: &str, what: &str) -> String {
    format!("idempotency key: {key}\n  (to retry this {what} safely, run the same command with --key {key})")
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
    if payment.amount_refunded > 0 {
        row("refunded", &format!("{} {} (minor units)", payment.amount_refunded, payment.currency));
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

/// One line per status seen while following a refund.
pub fn refund_status_line(refund: &Refund, note: Option<&str>) -> String {
    match note {
        Some(note) => format!("refund {}: {} ({note})", refund.id, refund.status),
        None => format!("refund {}: {}", refund.id, refund.status),
    }
}

/// The full text description of a refund.
pub fn describe_refund(refund: &Refund) -> String {
    let mut text = String::new();
    let mut row = |label: &str, value: &str| {
        let _ = writeln!(text, "{label:<12} {value}");
    };
    row("refund", &refund.id.to_string());
    row("payment", &refund.payment_id.to_string());
    row("status", &format!("{} ({})", refund.status, refund_meaning(refund.status)));
    row("amount", &format!("{} {} (minor units)", refund.amount, refund.currency));
    if let Some(reason) = refund.reason {
        row("reason", reason.as_str());
    }
    if !refund.metadata.is_empty() {
        let pairs: Vec<String> = refund.metadata.iter().map(|(key, value)| format!("{key}={value}")).collect();
        row("metadata", &pairs.join(", "));
    }
    if let Some(provider_refund) = &refund.provider_refund_id {
        row("provider", provider_refund);
    }
    if let Some(failure) = &refund.failure {
        row("failure", &format!("{}: {}", failure.code, failure.message));
    }
    row("created", &timestamp(refund.created_at));
    row("updated", &timestamp(refund.updated_at));
    text.trim_end().to_owned()
}

/// What to do about a refund that was not final when waiting stopped.
pub fn refund_still_open(refund: &Refund, waited_secs: u64) -> String {
    format!(
        "refund {} is still {} after {waited_secs} s: {}.\nfollow it with: oncepay refund-status {} --wait 60",
        refund.id,
        refund.status,
        refund_meaning(refund.status),
        refund.id
    )
}

/// `refunds`: one line per refund, oldest first, or a line saying there are none.
pub fn refund_list(refunds: &[Refund]) -> String {
    if refunds.is_empty() {
        return "no refunds".to_owned();
    }
    let lines: Vec<String> = refunds
        .iter()
        .map(|refund| {
            format!(
                "{}  {:<13} {} {}  {}",
                refund.id,
                refund.status.as_str(),
                refund.amount,
                refund.currency,
                timestamp(refund.created_at)
            )
        })
        .collect();
    lines.join("\n")
}

/// `refund --json`: the key, whether the api had seen it, and the refund resource.
pub fn refund_json(key: &str, replayed: bool, refund: &Refund) -> String {
    json!({"idempotency_key": key, "replayed": replayed, "refund": refund}).to_string()
}

/// `refund-status --json`: the refund resource.
pub fn refund_resource_json(refund: &Refund) -> String {
    json!(refund).to_string()
}

/// `refunds --json`: the list as the api sends it.
pub fn refund_list_json(refunds: &[Refund]) -> String {
    json!({"data": refunds}).to_string()
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
/// `dead-letters list`: one line each (`{"data": [...]}` with `--json`).
pub fn dead_letters(letters: &[DeadLetter], json: bool) -> String {
    if json {
        return json!({ "data": letters.iter().map(dead_letter_value).collect::<Vec<_>>() }).to_string();
    }
    if letters.is_empty() {
        return "no dead letter waits".to_owned();
    }
    letters.iter().map(dead_letter_line).collect::<Vec<_>>().join("\n")
}

/// `dead-letters republish`: the message published again.
pub fn republished(letter: &DeadLetter, json: bool) -> String {
    if json {
        return dead_letter_value(letter).to_string();
    }
    format!("published again and taken off the dead-letter queue: {}", dead_letter_line(letter))
}

fn dead_letter_line(letter: &DeadLetter) -> String {
    let unknown = || "-".to_owned();
    let failed_at = letter
        .failed_at
        .and_then(|seconds| time::OffsetDateTime::from_unix_timestamp(i64::try_from(seconds).ok()?).ok())
        .and_then(|at| at.format(&Rfc3339).ok())
        .unwrap_or_else(unknown);
    format!(
        "key {}  user {}  reason {}  refused {failed_at}  body {}",
        letter.key.clone().unwrap_or_else(unknown),
        letter.user.clone().unwrap_or_else(unknown),
        letter.reason.clone().unwrap_or_else(unknown),
        String::from_utf8_lossy(&letter.body),
    )
}

fn dead_letter_value(letter: &DeadLetter) -> serde_json::Value {
    let problem = letter.problem.as_deref().and_then(|problem| serde_json::from_str::<serde_json::Value>(problem).ok());
    json!({
        "idempotency_key": letter.key,
        "user": letter.user,
        "reason": letter.reason,
        "problem": problem,
        "failed_at": letter.failed_at,
        "body": String::from_utf8_lossy(&letter.body),
    })
}

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
            amount_refunded: 0,
            failure: None,
        }
    }

    fn refund(status: RefundStatus) -> Refund {
        Refund {
            id: "0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e80".parse().unwrap(),
            payment_id: "0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e7f".parse().unwrap(),
            status,
            amount: 500,
            currency: "EUR".into(),
            reason: None,
            metadata: BTreeMap::new(),
            created_at: datetime!(2026-11-22 05:00:00 UTC),
            updated_at: datetime!(2026-11-22 05:00:01 UTC),
            provider_refund_id: None,
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
            let refund: RefundStatus = serde_json::from_value(json!(status.as_str())).unwrap();
            assert_eq!(Exit::of_refund(refund) as u8, code, "a refund {status}");
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
    fn a_refunded_payment_says_how_much_went_back() {
        let mut refunded = payment(PaymentStatus::Succeeded);
        refunded.amount_refunded = 500;

        assert!(describe(&refunded).contains("refunded     500 EUR (minor units)"), "{}", describe(&refunded));
        assert!(!describe(&payment(PaymentStatus::Succeeded)).contains("refunded"));
    }

    #[test]
    fn a_refund_is_described_in_the_words_of_a_refund() {
        let mut succeeded = refund(RefundStatus::Succeeded);
        succeeded.reason = Some(oncepay_client::RefundReason::RequestedByCustomer);
        succeeded.provider_refund_id = Some("re_1".into());

        let text = describe_refund(&succeeded);

        assert_eq!(
            text,
            "refund       0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e80
payment      0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e7f
status       succeeded (the money went back to the customer)
amount       500 EUR (minor units)
reason       requested_by_customer
provider     re_1
created      2026-11-22T05:00:00Z
updated      2026-11-22T05:00:01Z"
        );
        assert_eq!(Exit::of_refund(succeeded.status), Exit::Succeeded);
    }

    #[test]
    fn a_list_of_refunds_is_one_line_each_or_says_there_are_none() {
        let refunds = [refund(RefundStatus::Succeeded), refund(RefundStatus::Pending)];

        let text = refund_list(&refunds);

        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.lines().next().unwrap().contains("succeeded     500 EUR"), "{text}");
        assert_eq!(refund_list(&[]), "no refunds");
        let printed: serde_json::Value = serde_json::from_str(&refund_list_json(&refunds)).unwrap();
        assert_eq!(printed["data"].as_array().unwrap().len(), 2);
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
