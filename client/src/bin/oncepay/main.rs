//! `oncepay`: pay and refund through the oncepay api (or publish a payment request to its RabbitMQ
//! queue), and follow payments and refunds from a terminal or a script; `listen` receives and
//! verifies oncepay's deliveries on a local port.
//!
//! `main` parses the command line, builds a client, runs one command and exits with a code that
//! sums up the result (see `--help`). Results go to stdout; errors and advice to stderr. The API
//! key is never printed.

mod args;
mod listen;
mod report;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use oncepay_client::{Client, DeadLetterError, DeadLetters, PaymentIntent, Publisher, RefundIntent};

use crate::args::{
    Cli, Command, DeadLettersCommand, PayArgs, PaymentArgs, PublishArgs, RefundArgs, RefundStatusArgs, RefundsArgs,
    StatusArgs,
};
use crate::report::Exit;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // The only place the environment is read (`ONCEPAY_URL`, `ONCEPAY_API_KEY`).
    let cli = Cli::parse();
    // Publishing and the dead letters speak to RabbitMQ only; listening speaks to no one.
    let command = match cli.command {
        Command::Publish(args) => return publish(args, cli.json).await.into(),
        Command::DeadLetters(command) => return dead_letters(command, cli.json).await.into(),
        Command::Listen(args) => return listen::run(args).await.into(),
        command => command,
    };
    let Some(api_key) = cli.api_key else {
        eprintln!("error: an API key is needed: --api-key or ONCEPAY_API_KEY");
        return Exit::Usage.into();
    };
    let client = match Client::new(cli.url, api_key) {
        Ok(client) => client,
        Err(error) => {
            eprintln!("error: {error}");
            return Exit::Usage.into();
        }
    };
    let exit = match command {
        Command::Pay(args) => pay(&client, args, cli.json).await,
        Command::Status(args) => status(&client, args, cli.json).await,
        Command::Refund(args) => refund(&client, args, cli.json).await,
        Command::RefundStatus(args) => refund_status(&client, args, cli.json).await,
        Command::Refunds(args) => refunds(&client, args, cli.json).await,
        Command::Publish(_) | Command::DeadLetters(_) | Command::Listen(_) => unreachable!("answered above"),
    };
    exit.into()
}

/// The intent `args` describe, with its key printed before anything is sent: if this process dies
/// mid-request, the key is what lets the user retry the same payment safely (`--key`).
fn intent(args: PaymentArgs, json: bool) -> PaymentIntent {
    let mut builder = PaymentIntent::builder(args.amount, args.currency, args.customer);
    if let Some(description) = args.description {
        builder = builder.description(description);
    }
    for (key, value) in args.metadata {
        builder = builder.metadata(key, value);
    }
    if let Some(reference) = args.payment_method {
        builder = builder.payment_method(reference);
    }
    if let Some(reference) = args.provider_customer {
        builder = builder.provider_customer(reference);
    }
    let intent = match args.key {
        Some(key) => builder.build_with_key(key),
        None => builder.build(),
    };
    let line = report::key_line(intent.key().as_str(), "payment");
    if json {
        eprintln!("{line}");
    } else {
        say(&line);
    }
    intent
}

async fn pay(client: &Client, args: PayArgs, json: bool) -> Exit {
    let intent = intent(args.payment, json);
    let key = intent.key().as_str();

    let created = match client.create(&intent).await {
        Ok(created) => created,
        Err(error) => {
            eprintln!("{}", report::error_text(&error));
            let exit = Exit::of_error(&error);
            if exit != Exit::Rejected {
                eprintln!("the payment may or may not have been accepted; retrying with --key {key} is safe");
            }
            return exit;
        }
    };
    let mut shown = created.payment.status;
    if !json {
        say(&report::status_line(&created.payment, Some(if created.replayed { "replayed" } else { "accepted" })));
    }

    let payment = if args.no_wait || created.payment.status.is_terminal() {
        created.payment
    } else {
        let followed = client
            .watch(&created.payment.id, Duration::from_secs(args.wait), |payment| {
                if !json && payment.status != shown {
                    shown = payment.status;
                    say(&report::status_line(payment, None));
                }
            })
            .await;
        match followed {
            Ok(payment) => payment,
            Err(error) => {
                eprintln!("{}", report::error_text(&error));
                eprintln!("the payment was accepted; follow it with: oncepay status {} --wait 60", created.payment.id);
                return Exit::of_error(&error);
            }
        }
    };

    if json {
        say(&report::pay_json(key, created.replayed, &payment));
    } else {
        say(&format!("\n{}", report::describe(&payment)));
    }
    if args.no_wait && !payment.status.is_terminal() {
        return Exit::Succeeded;
    }
    if !payment.status.is_terminal() {
        eprintln!("{}", report::still_open(&payment, args.wait));
    }
    Exit::of_status(payment.status)
}

async fn publish(args: PublishArgs, json: bool) -> Exit {
    let intent = intent(args.payment, json);
    let key = intent.key().as_str();
    let mut publisher = match Publisher::new(&args.amqp_url, &args.queue) {
        Ok(publisher) => publisher,
        Err(error) => {
            eprintln!("error: {error}");
            return Exit::Usage;
        }
    };
    let published = match publisher.publish(&intent, Duration::from_secs(args.wait)).await {
        Ok(published) => published,
        Err(error) => {
            eprintln!("error: {error}");
            eprintln!("the request may or may not have been published; publishing again with --key {key} is safe");
            return Exit::Unavailable;
        }
    };
    let Some((payment, replayed)) = published.reply else {
        if json {
            say(&serde_json::json!({"idempotency_key": key, "confirmed": true, "payment": null}).to_string());
        } else {
            say("published; RabbitMQ confirmed it, and the api has not answered yet");
        }
        return if args.wait == 0 { Exit::Succeeded } else { Exit::NotFinal };
    };
    if json {
        say(&report::pay_json(key, replayed, &payment));
    } else {
        say(&report::status_line(&payment, Some(if replayed { "replayed" } else { "accepted" })));
        say(&format!("follow it with: oncepay status {} --wait 60", payment.id));
    }
    Exit::Succeeded
}

async fn dead_letters(command: DeadLettersCommand, json: bool) -> Exit {
    let (DeadLettersCommand::List { queue, .. } | DeadLettersCommand::Republish { queue, .. }) = &command;
    let letters = match DeadLetters::connect(&queue.amqp_url, &queue.queue).await {
        Ok(letters) => letters,
        Err(error) => {
            eprintln!("error: {error}");
            return Exit::Unavailable;
        }
    };
    let done = match command {
        DeadLettersCommand::List { limit, .. } => {
            letters.list(limit).await.map(|letters| report::dead_letters(&letters, json))
        }
        DeadLettersCommand::Republish { key, user, payments_queue, .. } => letters
            .republish(&key, user.as_deref(), &payments_queue)
            .await
            .map(|letter| report::republished(&letter, json)),
    };
    match done {
        Ok(text) => {
            say(&text);
            Exit::Succeeded
        }
        Err(error @ DeadLetterError::NotFound { .. }) => {
            eprintln!("error: {error}");
            Exit::Rejected
        }
        Err(error) => {
            eprintln!("error: {error}");
            Exit::Unavailable
        }
    }
}

async fn status(client: &Client, args: StatusArgs, json: bool) -> Exit {
    let found = match args.wait {
        Some(secs) => client.wait_for_terminal(&args.payment_id, Duration::from_secs(secs)).await,
        None => client.get(&args.payment_id).await,
    };
    let payment = match found {
        Ok(payment) => payment,
        Err(error) => {
            eprintln!("{}", report::error_text(&error));
            return Exit::of_error(&error);
        }
    };
    say(&if json { report::payment_json(&payment) } else { report::describe(&payment) });
    if let (Some(secs), false) = (args.wait, payment.status.is_terminal()) {
        eprintln!("{}", report::still_open(&payment, secs));
    }
    Exit::of_status(payment.status)
}

async fn refund(client: &Client, args: RefundArgs, json: bool) -> Exit {
    let mut builder = RefundIntent::builder(args.payment_id);
    if let Some(amount) = args.amount {
        builder = builder.amount(amount);
    }
    if let Some(reason) = args.reason {
        builder = builder.reason(reason);
    }
    for (key, value) in args.metadata {
        builder = builder.metadata(key, value);
    }
    let intent = match args.key {
        Some(key) => builder.build_with_key(key),
        None => builder.build(),
    };
    let key = intent.key().as_str();
    // Before sending: if this process dies mid-request, the key is what lets the user retry the
    // same refund safely (`--key`).
    if json {
        eprintln!("{}", report::key_line(key, "refund"));
    } else {
        say(&report::key_line(key, "refund"));
    }

    let created = match client.refund(&intent).await {
        Ok(created) => created,
        Err(error) => {
            eprintln!("{}", report::error_text(&error));
            let exit = Exit::of_error(&error);
            if exit != Exit::Rejected {
                eprintln!("the refund may or may not have been accepted; retrying with --key {key} is safe");
            }
            return exit;
        }
    };
    let mut shown = created.refund.status;
    if !json {
        say(&report::refund_status_line(&created.refund, Some(if created.replayed { "replayed" } else { "accepted" })));
    }

    let refund = if args.no_wait || created.refund.status.is_terminal() {
        created.refund
    } else {
        let followed = client
            .watch_refund(&created.refund.id, Duration::from_secs(args.wait), |refund| {
                if !json && refund.status != shown {
                    shown = refund.status;
                    say(&report::refund_status_line(refund, None));
                }
            })
            .await;
        match followed {
            Ok(refund) => refund,
            Err(error) => {
                eprintln!("{}", report::error_text(&error));
                eprintln!(
                    "the refund was accepted; follow it with: oncepay refund-status {} --wait 60",
                    created.refund.id
                );
                return Exit::of_error(&error);
            }
        }
    };

    if json {
        say(&report::refund_json(key, created.replayed, &refund));
    } else {
        say(&format!("\n{}", report::describe_refund(&refund)));
    }
    if args.no_wait && !refund.status.is_terminal() {
        return Exit::Succeeded;
    }
    if !refund.status.is_terminal() {
        eprintln!("{}", report::refund_still_open(&refund, args.wait));
    }
    Exit::of_refund(refund.status)
}

async fn refund_status(client: &Client, args: RefundStatusArgs, json: bool) -> Exit {
    let found = match args.wait {
        Some(secs) => client.wait_for_refund(&args.refund_id, Duration::from_secs(secs)).await,
        None => client.get_refund(&args.refund_id).await,
    };
    let refund = match found {
        Ok(refund) => refund,
        Err(error) => {
            eprintln!("{}", report::error_text(&error));
            return Exit::of_error(&error);
        }
    };
    say(&if json { report::refund_resource_json(&refund) } else { report::describe_refund(&refund) });
    if let (Some(secs), false) = (args.wait, refund.status.is_terminal()) {
        eprintln!("{}", report::refund_still_open(&refund, secs));
    }
    Exit::of_refund(refund.status)
}

async fn refunds(client: &Client, args: RefundsArgs, json: bool) -> Exit {
    match client.list_refunds(&args.payment_id).await {
        Ok(refunds) => {
            say(&if json { report::refund_list_json(&refunds) } else { report::refund_list(&refunds) });
            Exit::Succeeded
        }
        Err(error) => {
            eprintln!("{}", report::error_text(&error));
            Exit::of_error(&error)
        }
    }
}

/// Prints a result line and flushes it, so that a pipe sees it at once (`listen` prints for as long
/// as it runs). A closed stdout must not stop a payment from being followed: the exit code still
/// tells the result, so a failed write is deliberately not an error.
fn say(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
    let _ = stdout.flush();
}
