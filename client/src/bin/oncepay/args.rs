//! The command line of `oncepay`: its commands and flags, two of which clap may also read from the
//! environment (`ONCEPAY_URL`, `ONCEPAY_API_KEY`). It owns no behaviour.

use std::net::IpAddr;

use clap::{Args, Parser, Subcommand};
use oncepay_client::{IdempotencyKey, PaymentId, RefundId, RefundReason};

const EXIT_CODES: &str = "\
Exit codes:
  0  the payment or refund succeeded (or, with `--no-wait`, was accepted; `publish`: RabbitMQ confirmed
     the request and the api answered)
  1  the api's response could not be understood
  2  usage error (bad flags, no API key, invalid URL)
  3  the payment or refund failed: no money moved
  4  the payment or refund is not final yet (pending, processing, unknown or dead_lettered); ask again later
     (`publish`: confirmed, and no answer from the api yet)
  5  the api rejected the request (4xx problem); sending it again will not help
  6  no response after retries (network, timeouts, 409/429/5xx; `publish`: no confirmation from RabbitMQ); the
     same command again with the printed --key is safe
`dead-letters`: 0 done, 2 usage error, 5 no dead letter has the key, 6 RabbitMQ refused or could not be
reached (nothing was taken off the dead-letter queue)
`listen`: runs until interrupted; 2 when a --secret is not whsec_... or the address cannot be listened on";

/// Pay and refund through oncepay, and follow payments and refunds to their final state.
#[derive(Debug, Parser)]
#[command(name = "oncepay", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// Base URL of the oncepay api.
    #[arg(long, env = "ONCEPAY_URL", default_value = "http://127.0.0.1:8080", global = true)]
    pub url: String,

    /// The tenant's API key (opk_...). Prefer the environment variable: other users of this
    /// machine can see command lines.
    #[arg(long, env = "ONCEPAY_API_KEY", hide_env_values = true, global = true)]
    pub api_key: Option<String>,

    /// Print JSON instead of text: the resource (`status`, `refund-status`), the key, replay flag and
    /// resource (`pay`, `refund`), or `{"data": [...]}` (`refunds`).
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a payment and follow it to its final state.
    Pay(PayArgs),
    /// Show a payment, optionally waiting for it to become final.
    Status(StatusArgs),
    /// Refund a succeeded payment (all that is left of it, or --amount) and follow the refund to its
    /// final state.
    Refund(RefundArgs),
    /// Show a refund, optionally waiting for it to become final.
    RefundStatus(RefundStatusArgs),
    /// List a payment's refunds, oldest first.
    Refunds(RefundsArgs),
    /// Publish a payment request to oncepay's RabbitMQ queue, with publisher confirms (published
    /// again with the same key until RabbitMQ confirms it), and print the api's reply. Needs no
    /// API key: the broker user in the URL stands for the tenant.
    Publish(PublishArgs),
    /// Read the payment requests oncepay dead-lettered on RabbitMQ, or publish one again once its
    /// cause is fixed (as the api's broker user, or a user allowed to read the dead-letter queue).
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(DeadLettersCommand),
    /// Receive oncepay's signed deliveries on a local port while you develop: verify each POST
    /// against the endpoint's secrets, respond 204 or 400, and print one line per delivery. Runs
    /// until interrupted (Ctrl-C).
    Listen(ListenArgs),
}

/// `oncepay listen`.
#[derive(Debug, Args)]
pub struct ListenArgs {
    /// The port to listen on; 0 lets the system choose one (the first line printed says which).
    #[arg(long)]
    pub port: u16,

    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,

    /// The endpoint's signing secret (whsec_...); give it twice while you rotate it, the old and
    /// the new. Prefer the environment variable (secrets a comma apart): other users of this
    /// machine can see command lines.
    #[arg(
        long = "secret",
        value_name = "SECRET",
        env = "ONCEPAY_WEBHOOK_SECRET",
        hide_env_values = true,
        value_delimiter = ',',
        required = true
    )]
    pub secrets: Vec<String>,
}

/// `oncepay dead-letters`.
#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// The oldest dead letters, with why each was refused; they stay in the queue.
    List {
        #[command(flatten)]
        queue: DeadLetterQueue,
        /// How many, at most.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Publish the dead letter with this key to the payments queue again, as its producer published
    /// it, and take it off the dead-letter queue once RabbitMQ confirmed the copy. Needs the api's
    /// broker user (an impersonator) unless the URL's user is the message's producer.
    Republish {
        #[command(flatten)]
        queue: DeadLetterQueue,
        /// The message's idempotency key.
        #[arg(long)]
        key: String,
        /// Only the message of this producer (two tenants' producers may use one key).
        #[arg(long)]
        user: Option<String>,
        /// The queue oncepay takes payment requests from (the api's broker.queue).
        #[arg(long, default_value = "oncepay.payments")]
        payments_queue: String,
    },
}

/// Where the dead letters are.
#[derive(Debug, Args)]
pub struct DeadLetterQueue {
    /// The RabbitMQ node: amqp://user:password@host:5672/%2f. Prefer the environment variable:
    /// other users of this machine can see command lines.
    #[arg(long, env = "ONCEPAY_AMQP_URL", hide_env_values = true)]
    pub amqp_url: String,

    /// The dead-letter queue (the api's broker.dead_letter_queue).
    #[arg(long, default_value = "oncepay.payments.dead-letters")]
    pub queue: String,
}

/// `oncepay publish`.
#[derive(Debug, Args)]
pub struct PublishArgs {
    #[command(flatten)]
    pub payment: PaymentArgs,

    /// The RabbitMQ node, as the tenant's broker user: amqp://user:password@host:5672/%2f. Prefer
    /// the environment variable: other users of this machine can see command lines.
    #[arg(long, env = "ONCEPAY_AMQP_URL", hide_env_values = true)]
    pub amqp_url: String,

    /// The queue oncepay takes payment requests from (the api's broker.queue).
    #[arg(long, default_value = "oncepay.payments")]
    pub queue: String,

    /// How long to wait for the api's reply once RabbitMQ confirmed the message; 0 waits for none.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub wait: u64,
}

/// What a payment asks for: the flags `pay` and `publish` share.
#[derive(Debug, Args)]
pub struct PaymentArgs {
    /// Amount in minor units (1999 = 19.99 EUR).
    #[arg(long)]
    pub amount: i64,

    /// ISO 4217 currency code, e.g. EUR.
    #[arg(long)]
    pub currency: String,

    /// Your reference for the customer.
    #[arg(long)]
    pub customer: String,

    /// Free text shown with the payment.
    #[arg(long)]
    pub description: Option<String>,

    /// A metadata pair; repeat for more.
    #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = parse_pair)]
    pub metadata: Vec<(String, String)>,

    /// The payment method to charge: the provider's reference for it, e.g. pm_card_visa (ASCII
    /// letters, digits and _), sent to the provider unchanged. Whether a payment without one can
    /// be charged depends on the provider.
    #[arg(long, value_name = "REFERENCE")]
    pub payment_method: Option<String>,

    /// The provider's customer the payment method belongs to, e.g. Stripe's cus_..., for a payment
    /// method saved to a customer. --customer is always your own reference, never the provider's.
    #[arg(long, value_name = "REFERENCE")]
    pub provider_customer: Option<String>,

    /// The idempotency key to use: pass the one an earlier run printed to retry that payment
    /// safely. A new random key if omitted.
    #[arg(long, value_name = "KEY")]
    pub key: Option<IdempotencyKey>,
}

/// `oncepay pay`.
#[derive(Debug, Args)]
pub struct PayArgs {
    #[command(flatten)]
    pub payment: PaymentArgs,

    /// Print the accepted payment and stop, without following it.
    #[arg(long, conflicts_with = "wait")]
    pub no_wait: bool,

    /// How long to follow the payment before returning.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub wait: u64,
}

/// `oncepay status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The payment's id, as `pay` printed it.
    pub payment_id: PaymentId,

    /// Follow the payment for up to this long if it is not final yet.
    #[arg(long, value_name = "SECS")]
    pub wait: Option<u64>,
}

/// `oncepay refund`.
#[derive(Debug, Args)]
pub struct RefundArgs {
    /// The id of the payment to give money back from, as `pay` printed it.
    pub payment_id: PaymentId,

    /// How much to give back, in minor units of the payment's currency; all that is left of the
    /// payment if omitted.
    #[arg(long)]
    pub amount: Option<i64>,

    /// Why: duplicate, fraudulent or requested_by_customer.
    #[arg(long)]
    pub reason: Option<RefundReason>,

    /// A metadata pair; repeat for more.
    #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = parse_pair)]
    pub metadata: Vec<(String, String)>,

    /// The idempotency key to use: pass the one an earlier run printed to retry that refund safely.
    /// A new random key if omitted.
    #[arg(long, visible_alias = "idempotency-key", value_name = "KEY")]
    pub key: Option<IdempotencyKey>,

    /// Print the accepted refund and stop, without following it.
    #[arg(long, conflicts_with = "wait")]
    pub no_wait: bool,

    /// How long to follow the refund before returning.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub wait: u64,
}

/// `oncepay refund-status`.
#[derive(Debug, Args)]
pub struct RefundStatusArgs {
    /// The refund's id, as `refund` printed it.
    pub refund_id: RefundId,

    /// Follow the refund for up to this long if it is not final yet.
    #[arg(long, value_name = "SECS")]
    pub wait: Option<u64>,
}

/// `oncepay refunds`.
#[derive(Debug, Args)]
pub struct RefundsArgs {
    /// The payment's id.
    pub payment_id: PaymentId,
}

fn parse_pair(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {raw:?}")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn metadata_pairs_split_at_the_first_equals_sign() {
        assert_eq!(parse_pair("order=A=17"), Ok(("order".into(), "A=17".into())));
        assert_eq!(parse_pair("note="), Ok(("note".into(), String::new())));
        assert!(parse_pair("order").is_err());
        assert!(parse_pair("=x").is_err());
    }

    #[test]
    fn a_refund_takes_a_payment_and_optionally_an_amount_a_reason_and_a_key_by_either_name() {
        let payment = "0192f0c4-7a3e-7c1d-9b1e-3f2a4c5d6e7f";
        let parse = |extra: &[&str]| Cli::try_parse_from([&["oncepay", "refund", payment][..], extra].concat());

        let Command::Refund(bare) = parse(&[]).unwrap().command else { panic!("not a refund") };
        let Command::Refund(full) =
            parse(&["--amount", "500", "--reason", "duplicate", "--idempotency-key", "r-1"]).unwrap().command
        else {
            panic!("not a refund")
        };

        assert_eq!((bare.amount, bare.reason, bare.key), (None, None, None));
        assert_eq!(full.amount, Some(500));
        assert_eq!(full.reason, Some(RefundReason::Duplicate));
        assert_eq!(full.key, Some(IdempotencyKey::new("r-1").unwrap()));
        assert!(parse(&["--key", "r-1"]).is_ok());
        assert!(parse(&["--reason", "changed_my_mind"]).is_err());
        assert!(Cli::try_parse_from(["oncepay", "refund", "not-a-payment"]).is_err());
    }

    #[test]
    fn no_wait_and_wait_cannot_both_be_given() {
        let parsed = Cli::try_parse_from(["oncepay", "pay", "--amount", "1", "--currency", "EUR", "--customer", "c"]);
        assert!(parsed.is_ok());

        let both = Cli::try_parse_from([
            "oncepay",
            "pay",
            "--amount",
            "1",
            "--currency",
            "EUR",
            "--customer",
            "c",
            "--no-wait",
            "--wait",
            "5",
        ]);
        assert!(both.is_err());
    }
}
