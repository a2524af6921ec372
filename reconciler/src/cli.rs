//! The command line: `oncepay-reconciler [serve]` runs the service; every other subcommand is an
//! operator tool that does one thing and exits. `migrate` and `operators bootstrap` work on the
//! database; every other command goes through the operations API with the operator's personal token
//! ([`oncepay_ops::operators::client`]), so its roles, tenant limits, approvals and audit trail apply.
//! `sign-in`, `operators enroll` and `operators password` need no token: they ask for the password
//! (and code) on the terminal, without echo, or read them line by line from standard input.
//!
//! This module owns the argument grammar ([`Cli`]) and the dispatch of operator commands to the
//! modules that implement them; a failure's exit code is [`OperatorError::exit_code`]. It reads no environment variable and no configuration itself: `main` passes in what it loaded.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use oncepay_domain::ids::{PaymentId, RefundId};
use oncepay_store::db;
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::settings::Settings;
use oncepay_ops::dead_letters::refunds::DeadRefundList;
use oncepay_ops::dead_letters::reports::EntryList;
use oncepay_ops::operator_error::OperatorError;
use oncepay_ops::operators::accounts::{self, CreatedOperator, OperatorView};
use oncepay_ops::operators::client::OpsClient;
use oncepay_ops::operators::enrollment::IssuedCode;
use oncepay_ops::operators::proposals::{Approved, ProposalView};
use oncepay_ops::operators::refunds::RefundDetail;
use oncepay_ops::operators::reports::{Acted, AuditTrail, Done, OperatorList, PaymentPage, ProposalList, TokenList};
use oncepay_ops::operators::tokens::IssuedToken;
use oncepay_ops::recon::{RunDetail, RunList};
use oncepay_ops::render::Report;
use oncepay_ops::tenants::{BrokerUsers, IssuedKey, RemovedBrokerUser, RevokedKey, TenantList};
use oncepay_store::recon_runs::{Run, RunStatus};

/// How long a command that works on the database waits for it to take a connection. A service's
/// loops retry on their own; a command is one process, just started, perhaps in a container on a
/// busy machine, and nothing retries it.
pub const DATABASE_WITHIN: Duration = Duration::from_secs(15);

/// `oncepay-reconciler`: the reconciler service and the operator CLI.
#[derive(Debug, Parser)]
#[command(name = "oncepay-reconciler", version, about, long_about = None)]
pub struct Cli {
    /// A TOML file overriding the embedded defaults.
    #[arg(long, global = true, env = "ONCEPAY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs the service: webhooks, poller, sweeper, reaper, nightly reconciliation (the default).
    Serve,
    /// Applies every pending database migration, then exits.
    Migrate,
    /// Tenants: create (with a first API key), list, connect to a provider account (through the
    /// operations API).
    #[command(subcommand)]
    Tenants(TenantsCommand),
    /// A tenant's API keys: issue another, revoke one (through the operations API).
    #[command(subcommand)]
    Keys(KeysCommand),
    /// The RabbitMQ users that publish a tenant's payments: list, add (proposed for a second
    /// operator), remove (through the operations API).
    #[command(subcommand, name = "broker-users")]
    BrokerUsers(BrokerUsersCommand),
    /// Payments automation could not settle: list, show, retry, resolve (through the operations API).
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(DeadLettersCommand),
    /// Refunds: propose an operator's refund of a payment; list, show, retry and resolve the refunds
    /// automation gave up on (through the operations API).
    #[command(subcommand)]
    Refunds(RefundsCommand),
    /// Decisions waiting for a second operator: list, approve, reject, withdraw (through the
    /// operations API).
    #[command(subcommand)]
    Proposals(ProposalsCommand),
    /// The operators' audit trail, newest first (through the operations API).
    Audit {
        /// Only this operator's rows.
        #[arg(long)]
        operator: Option<String>,
        /// Only rows about this tenant (its id).
        #[arg(long)]
        tenant_id: Option<Uuid>,
        /// Only rows about this payment.
        #[arg(long)]
        payment_id: Option<PaymentId>,
        /// Only this action, e.g. `proposal.approve`.
        #[arg(long)]
        action: Option<String>,
        /// Only rows older than this audit id (the next page).
        #[arg(long)]
        before: Option<i64>,
        /// How many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// An operator's personal tokens for the operations API: list, issue, revoke (through it).
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Ledger reconciliation: run a window now, list runs, show a run's discrepancies (through the
    /// operations API).
    #[command(subcommand)]
    Recon(ReconCommand),
    /// Signs you in with your password and prints a personal token of your own, once: made by you,
    /// so four eyes counts it as yours alone. Needs ONCEPAY_OPS_URL only; asks for the password.
    #[command(name = "sign-in")]
    SignIn {
        /// Your operator name (asked for when left out).
        #[arg(long)]
        name: Option<String>,
        /// What the token is for, e.g. the machine it lives on.
        #[arg(long, default_value = "cli")]
        label: String,
        /// Days it works (default: the API's `operators.token_ttl_days`).
        #[arg(long)]
        days: Option<u32>,
        /// Why (recorded).
        #[arg(long, default_value = "signed in at the command line")]
        reason: String,
    },
    /// Operator accounts: only the first admin is made here; admins make the rest through the
    /// operations API.
    #[command(subcommand)]
    Operators(OperatorsCommand),
}

/// `operators …`.
#[derive(Debug, Subcommand)]
pub enum OperatorsCommand {
    /// On an installation with no operator yet, creates the first admin and prints a personal token
    /// for the operations API, once. Refused once any operator exists. Works on the database.
    Bootstrap {
        /// The admin's name: 1–63 of a-z 0-9 . _ -, starting with a letter or digit.
        name: String,
    },
    /// Lists the operators (admins only; through the operations API).
    List,
    /// Sets your own first password with the enrollment code an admin gave you; asks for the code
    /// and the password. Needs ONCEPAY_OPS_URL only.
    Enroll {
        /// Your operator name.
        name: String,
    },
    /// Changes your own password; asks for the old one (which signs you in afresh) and the new one.
    /// Ends every session and token of yours. Needs ONCEPAY_OPS_URL only.
    Password {
        /// Your operator name (asked for when left out).
        #[arg(long)]
        name: Option<String>,
    },
    /// Issues another operator a fresh enrollment code, for a lost password: their password is
    /// removed and their sessions and tokens end at once (admins of every tenant; through the
    /// operations API).
    Reset {
        /// Their name.
        name: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Creates an operator and prints the enrollment code they set their own password with, once
    /// (admins only; through the operations API).
    Create {
        /// Their name: 1–63 of a-z 0-9 . _ -, starting with a letter or digit.
        name: String,
        /// viewer, operator, approver or admin.
        #[arg(long)]
        role: String,
        /// Limits them to this tenant (by name); repeat for more. Without it: every tenant.
        #[arg(long = "tenant")]
        tenants: Vec<String>,
        /// The identity (`sub`) they sign in as at the organisation's OpenID provider.
        #[arg(long)]
        oidc_subject: Option<String>,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Changes another operator's role or tenants (admins only; through the operations API).
    Update {
        /// Their name.
        name: String,
        /// viewer, operator, approver or admin.
        #[arg(long)]
        role: Option<String>,
        /// Limits them to this tenant (by name) from now on; repeat for more.
        #[arg(long = "tenant", conflicts_with = "every_tenant")]
        tenants: Vec<String>,
        /// Every tenant from now on.
        #[arg(long)]
        every_tenant: bool,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Disables another operator: their tokens and sessions stop working at once (admins only;
    /// through the operations API).
    Disable {
        /// Their name.
        name: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
}

/// `proposals …`.
#[derive(Debug, Subcommand)]
pub enum ProposalsCommand {
    /// Lists proposals, newest first.
    List {
        /// Only those in this status: pending, approved, rejected, withdrawn or expired.
        #[arg(long)]
        status: Option<String>,
        /// Only those of this payment.
        #[arg(long)]
        payment_id: Option<PaymentId>,
    },
    /// Approves another operator's proposal and does what it proposes (approvers only), after
    /// checking that the payment did not move since.
    Approve {
        /// The proposal's id.
        proposal_id: Uuid,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Rejects another operator's proposal (approvers only).
    Reject {
        /// The proposal's id.
        proposal_id: Uuid,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Withdraws your own proposal.
    Withdraw {
        /// The proposal's id.
        proposal_id: Uuid,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
}

/// `tokens …`.
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Lists an operator's tokens (yours unless --operator; others' for admins).
    List {
        /// Whose.
        #[arg(long)]
        operator: Option<String>,
    },
    /// Issues a token and prints it, once (yours unless --operator; others' for admins).
    Issue {
        /// Whose.
        #[arg(long)]
        operator: Option<String>,
        /// What it is for, e.g. the machine it lives on.
        #[arg(long)]
        label: String,
        /// Days it works (default: the API's `operators.token_ttl_days`).
        #[arg(long)]
        days: Option<u32>,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Revokes a token (yours, or anyone's for admins).
    Revoke {
        /// The token's id.
        token_id: Uuid,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
}

/// `recon …`.
#[derive(Debug, Subcommand)]
pub enum ReconCommand {
    /// Queues the window [from, to) for the reconciler and waits for its run (dates are UTC midnights).
    Run {
        /// Start, inclusive: a date (2026-03-01) or an RFC 3339 time.
        #[arg(long)]
        from: String,
        /// End, exclusive: a date (2026-03-02) or an RFC 3339 time.
        #[arg(long)]
        to: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Lists the latest runs, newest first.
    Runs {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Shows a run and its discrepancies by class.
    Show {
        /// The run's id.
        run_id: Uuid,
    },
}

/// `tenants …`.
#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// Proposes a tenant with its first API key; once a second operator approves, `keys collect`
    /// prints the key, once.
    Create {
        /// Operator-facing handle: 1–63 of a-z 0-9 _ -, starting with a letter or digit.
        name: String,
        /// Requests per second this tenant may make to one api process (default: the api's).
        #[arg(long)]
        rate_limit: Option<i32>,
        /// The provider account its payments are charged to in connect mode (a Stripe connected
        /// account, `acct_…`); `tenants connect` sets it later.
        #[arg(long)]
        provider_account: Option<String>,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Lists every tenant.
    List,
    /// Proposes the provider account a tenant's payments are charged to (Stripe Connect: its
    /// connected account, `acct_…`), from its approval on. Payments accepted before keep the account
    /// they were accepted with.
    Connect {
        /// The tenant's name.
        tenant: String,
        /// The account, e.g. `acct_1032D82eZvKYlo2C`.
        account: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Removes a tenant's provider account: in connect mode it can take no payments until one is set
    /// again. Payments accepted before keep theirs.
    Disconnect {
        /// The tenant's name.
        tenant: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
}

/// `broker-users …`.
#[derive(Debug, Subcommand)]
pub enum BrokerUsersCommand {
    /// Lists the broker users that publish a tenant's payments.
    List {
        /// The tenant's name.
        tenant: String,
    },
    /// Proposes letting a RabbitMQ user publish a tenant's payments (its messages' user_id); done
    /// once a second operator approves. A broker user belongs to one tenant.
    Add {
        /// The tenant's name.
        tenant: String,
        /// The RabbitMQ user.
        user: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Stops a RabbitMQ user publishing a tenant's payments, at once.
    Remove {
        /// The tenant's name.
        tenant: String,
        /// The RabbitMQ user.
        user: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
}

/// `keys …`.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Proposes another API key for a tenant; once a second operator approves, `keys collect` prints
    /// it, once.
    Issue {
        /// The tenant's name.
        tenant: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
    /// Prints the API key an approved proposal of yours made (`tenants create`, `keys issue`), once.
    Collect {
        /// The proposal's id.
        proposal_id: Uuid,
    },
    /// Revokes one of a tenant's keys; the api refuses it within its `auth.cache_ttl_secs`.
    Revoke {
        /// The tenant's name.
        tenant: String,
        /// The key id printed when the key was issued.
        key_id: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
}

/// `dead-letters …`.
#[derive(Debug, Subcommand)]
pub enum DeadLettersCommand {
    /// Lists dead letters, oldest first (open ones unless --all).
    List {
        /// Only entries awaiting an operator (the default).
        #[arg(long, conflicts_with = "all")]
        open: bool,
        /// Resolved entries too.
        #[arg(long)]
        all: bool,
    },
    /// Shows a payment's dead letters: why, evidence, attempts, age, and its audit trail.
    Show {
        /// The payment's id.
        payment_id: PaymentId,
    },
    /// Sends a dead-lettered payment again, with the same downstream key. Done at once within the
    /// provider's key window; past it (--outside-key-window), or when the API's
    /// `operators.retries_need_approval` is set, proposed for a second operator's approval.
    Retry {
        /// The payment's id.
        payment_id: PaymentId,
        /// Why (recorded with your name).
        #[arg(long)]
        reason: String,
        /// Resend although the provider may have forgotten the key (a double charge is then
        /// possible): needs an approver's approval.
        #[arg(long)]
        outside_key_window: bool,
    },
    /// Settles a dead-lettered payment (--as succeeded|failed: proposed for a second operator's
    /// approval, and done only when approved), or acknowledges a conflict on a terminal one (done at
    /// once).
    Resolve {
        /// The payment's id.
        payment_id: PaymentId,
        /// What the payment's outcome was.
        #[arg(long = "as", value_enum, required_unless_present = "acknowledge", conflicts_with = "acknowledge")]
        outcome: Option<ResolveAs>,
        /// For a conflict on a terminal payment: record that you looked at it; the state stays.
        #[arg(long, conflicts_with_all = ["charge_id", "amount"])]
        acknowledge: bool,
        /// Why (recorded with your name).
        #[arg(long)]
        reason: String,
        /// The provider's charge (required with --as succeeded).
        #[arg(long)]
        charge_id: Option<String>,
        /// What the provider charged, in minor units, when it no longer lists the charge by key.
        #[arg(long, requires_all = ["currency", "charged_at"])]
        amount: Option<i64>,
        /// The charge's currency (with --amount).
        #[arg(long, requires = "amount")]
        currency: Option<String>,
        /// When the provider created the charge, RFC 3339 (with --amount).
        #[arg(long, requires = "amount")]
        charged_at: Option<String>,
        /// With --as failed: settle as failed although a recorded charge says the payment succeeded
        /// (you refunded it, say); --reason must say why.
        #[arg(long, requires = "outcome")]
        force: bool,
    },
}

/// `resolve --as`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResolveAs {
    /// The provider charged the customer (or, for a refund, gave the money back).
    Succeeded,
    /// No money moved.
    Failed,
}

impl ResolveAs {
    /// The name the operations API takes.
    const fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }
}

/// `refunds …`.
#[derive(Debug, Subcommand)]
pub enum RefundsCommand {
    /// Proposes refunding a succeeded payment, for a second operator's approval; nothing moves
    /// before. Refused at once when the refund could not be made now (nothing or too little left).
    Propose {
        /// The payment's id.
        payment_id: PaymentId,
        /// How much to give back, in minor units (default: all that is left).
        #[arg(long)]
        amount: Option<i64>,
        /// Why, in the provider's words.
        #[arg(long, value_enum)]
        refund_reason: Option<RefundReasonArg>,
        /// Why you propose it (recorded with your name).
        #[arg(long)]
        reason: String,
    },
    /// Lists the refunds automation gave up on (dead-lettered), oldest first.
    #[command(name = "dead-letters")]
    DeadLetters,
    /// Shows a refund and its history, with the evidence of each change.
    Show {
        /// The refund's id.
        refund_id: RefundId,
    },
    /// Sends a dead-lettered refund again, with the same downstream key. Done at once within the
    /// provider's key window; past it (--outside-key-window), or when the API's
    /// `operators.retries_need_approval` is set, proposed for a second operator's approval.
    Retry {
        /// The refund's id.
        refund_id: RefundId,
        /// Why (recorded with your name).
        #[arg(long)]
        reason: String,
        /// Resend although the provider may have forgotten the key (a second refund is then
        /// possible): needs an approver's approval.
        #[arg(long)]
        outside_key_window: bool,
    },
    /// Proposes settling a dead-lettered refund as succeeded (with the provider's refund) or failed,
    /// for a second operator's approval; or acknowledges a conflict on a final refund (done at once).
    Resolve {
        /// The refund's id.
        refund_id: RefundId,
        /// What the refund's outcome was.
        #[arg(long = "as", value_enum, required_unless_present = "acknowledge", conflicts_with = "acknowledge")]
        outcome: Option<ResolveAs>,
        /// For a conflict on a final refund: record that you looked at it and put the money right;
        /// the refund's status stays.
        #[arg(long, conflicts_with_all = ["provider_refund_id", "amount", "force"])]
        acknowledge: bool,
        /// Why (recorded with your name).
        #[arg(long)]
        reason: String,
        /// The provider's refund (required with --as succeeded).
        #[arg(long)]
        provider_refund_id: Option<String>,
        /// What the provider gave back, in minor units, when it no longer lists the refund by key.
        #[arg(long, requires_all = ["currency", "refunded_at"])]
        amount: Option<i64>,
        /// The refund's currency (with --amount).
        #[arg(long, requires = "amount")]
        currency: Option<String>,
        /// When the provider made the refund, RFC 3339 (with --amount).
        #[arg(long, requires = "amount")]
        refunded_at: Option<String>,
        /// With --as failed: settle as failed although the provider reported a succeeded refund for
        /// it (it was reversed, say); --reason must say why.
        #[arg(long)]
        force: bool,
    },
}

/// `refunds propose --refund-reason`: the provider's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RefundReasonArg {
    /// The customer was charged twice for one thing.
    #[value(name = "duplicate")]
    Duplicate,
    /// The charge was fraudulent.
    #[value(name = "fraudulent")]
    Fraudulent,
    /// The customer asked for the money back.
    #[value(name = "requested_by_customer")]
    RequestedByCustomer,
}

impl RefundReasonArg {
    /// The name the operations API takes.
    const fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::RequestedByCustomer => "requested_by_customer",
        }
    }
}

/// What operator commands need; built by `main`.
pub struct Context {
    /// The loaded settings.
    pub settings: Settings,
    /// A pool on the configured database (connected only when a command uses it).
    pub pool: PgPool,
    /// The operations API, with the operator's token (`ONCEPAY_OPS_URL`, `ONCEPAY_OPS_TOKEN`, read
    /// by `main`); `None` when either is unset.
    pub ops: Option<OpsClient>,
    /// The operations API's address alone (`ONCEPAY_OPS_URL`), for the commands that sign in.
    pub ops_url: Option<String>,
}

impl Context {
    /// The operations API; refused with what to set when it is not configured.
    fn ops(&self) -> Result<&OpsClient, OperatorError> {
        self.ops.as_ref().ok_or_else(|| {
            OperatorError::Invalid(
                "this command goes through the operations API: set ONCEPAY_OPS_URL to its address (e.g. \
                 http://127.0.0.1:8083) and ONCEPAY_OPS_TOKEN to your personal token"
                    .into(),
            )
        })
    }
}

impl Context {
    /// A client of the operations API with no credential yet; refused with what to set when its
    /// address is not configured.
    fn anonymous(&self) -> Result<OpsClient, OperatorError> {
        let url = self.ops_url.as_deref().ok_or_else(|| {
            OperatorError::Invalid(
                "this command goes through the operations API: set ONCEPAY_OPS_URL to its address (e.g. \
                 http://127.0.0.1:8083)"
                    .into(),
            )
        })?;
        OpsClient::anonymous(url)
    }
}

/// Asks for `what` on standard error and reads a line of standard input: without echo when it is a
/// terminal and `secret`.
fn ask(what: &str, secret: bool) -> Result<SecretString, OperatorError> {
    use std::io::{BufRead, IsTerminal, Write};
    let terminal = std::io::stdin().is_terminal();
    if terminal {
        eprint!("{what}: ");
        let _ = std::io::stderr().flush();
    }
    // `stty` switches the terminal's echo off and on again; nothing else here touches the terminal.
    let echo = |on: bool| {
        if terminal && secret {
            let _ = std::process::Command::new("stty").arg(if on { "echo" } else { "-echo" }).status();
        }
    };
    echo(false);
    let mut line = String::new();
    let read = std::io::stdin().lock().read_line(&mut line);
    echo(true);
    if terminal && secret {
        eprintln!();
    }
    read.context("cannot read standard input")?;
    let line = line.trim_end_matches(['\r', '\n']).to_owned();
    if line.is_empty() {
        return Err(OperatorError::Invalid(format!("no {what} was given")));
    }
    Ok(SecretString::from(line))
}

/// Runs one operator command (anything but `serve`).
pub async fn execute(command: Command, ctx: &Context) -> Result<Box<dyn Report>, OperatorError> {
    match command {
        Command::Serve => Err(OperatorError::Invalid("`serve` runs the service; it is not an operator command".into())),
        Command::Migrate => migrate(database(ctx).await?).await.map(boxed),
        Command::Tenants(command) => tenant_command(command, ctx.ops()?).await,
        Command::Keys(command) => key_command(command, ctx.ops()?).await,
        Command::BrokerUsers(command) => broker_user_command(command, ctx.ops()?).await,
        Command::DeadLetters(command) => dead_letter_command(command, ctx.ops()?).await,
        Command::Refunds(command) => refund_command(command, ctx.ops()?).await,
        Command::Proposals(command) => proposal_command(command, ctx.ops()?).await,
        Command::Audit { operator, tenant_id, payment_id, action, before, limit } => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(operator.map(|o| ("operator", o)));
            query.extend(tenant_id.map(|t| ("tenant_id", t.to_string())));
            query.extend(payment_id.map(|p| ("payment_id", p.to_string())));
            query.extend(action.map(|a| ("action", a)));
            query.extend(before.map(|b| ("before", b.to_string())));
            ctx.ops()?.get_with("/v1/audit", &query).await?.report::<AuditTrail>()
        }
        Command::Operators(command) => operator_command(command, ctx).await,
        Command::SignIn { name, label, days, reason } => {
            let api = ctx.anonymous()?;
            let name = match name {
                Some(name) => name,
                None => ask("operator name", false)?.expose_secret().to_owned(),
            };
            let password = ask("password", true)?;
            let session = api.sign_in(&name, &password).await?;
            let body = json!({ "label": label, "expires_in_days": days, "reason": reason });
            let issued = session.post(&format!("/v1/operators/{name}/tokens"), &body).await;
            // The session was only the way to the token: end it either way.
            let _ = session.delete("/v1/session", &serde_json::Value::Null).await;
            issued?.report::<IssuedToken>()
        }
        Command::Tokens(command) => token_command(command, ctx.ops()?).await,
        Command::Recon(command) => recon_command(command, ctx.ops()?).await,
    }
}

async fn broker_user_command(command: BrokerUsersCommand, ops: &OpsClient) -> Result<Box<dyn Report>, OperatorError> {
    match command {
        BrokerUsersCommand::List { tenant } => {
            ops.get(&format!("/v1/tenants/{tenant}/broker-users")).await?.report::<BrokerUsers>()
        }
        BrokerUsersCommand::Add { tenant, user, reason } => {
            let path = format!("/v1/tenants/{tenant}/broker-users/{user}");
            ops.put(&path, &json!({ "reason": reason })).await?.report::<Acted>()
        }
        BrokerUsersCommand::Remove { tenant, user, reason } => {
            let path = format!("/v1/tenants/{tenant}/broker-users/{user}");
            ops.delete(&path, &json!({ "reason": reason })).await?;
            Ok(boxed(RemovedBrokerUser { tenant, broker_user: user }))
        }
    }
}

async fn key_command(command: KeysCommand, ops: &OpsClient) -> Result<Box<dyn Report>, OperatorError> {
    match command {
        KeysCommand::Issue { tenant, reason } => {
            let path = format!("/v1/tenants/{tenant}/keys");
            ops.post(&path, &json!({ "reason": reason })).await?.report::<Acted>()
        }
        KeysCommand::Collect { proposal_id } => {
            let path = format!("/v1/proposals/{proposal_id}/key");
            ops.post(&path, &json!({})).await?.report::<IssuedKey>()
        }
        KeysCommand::Revoke { tenant, key_id, reason } => {
            let path = format!("/v1/tenants/{tenant}/keys/{key_id}");
            ops.delete(&path, &json!({ "reason": reason })).await?;
            Ok(boxed(RevokedKey { tenant, key_id }))
        }
    }
}

async fn operator_command(command: OperatorsCommand, ctx: &Context) -> Result<Box<dyn Report>, OperatorError> {
    match command {
        OperatorsCommand::Bootstrap { name } => {
            let ttl = ctx.settings.operators.token_ttl();
            accounts::bootstrap(&mut *connection(ctx).await?, &name, ttl).await.map(boxed)
        }
        OperatorsCommand::List => ctx.ops()?.get("/v1/operators").await?.report::<OperatorList>(),
        OperatorsCommand::Create { name, role, tenants, oidc_subject, reason } => {
            let tenants = (!tenants.is_empty()).then_some(tenants);
            let body = json!({ "name": name, "role": role, "tenants": tenants, "oidc_subject": oidc_subject, "reason": reason });
            ctx.ops()?.post("/v1/operators", &body).await?.report::<CreatedOperator>()
        }
        OperatorsCommand::Enroll { name } => {
            let api = ctx.anonymous()?;
            let code = ask("enrollment code", true)?;
            let password = new_password()?;
            let body = json!({ "name": name, "code": code.expose_secret(), "password": password.expose_secret() });
            api.post("/v1/enrollment", &body).await?;
            Ok(boxed(Done(format!("your password is set, {name}: sign in with it (`oncepay-reconciler sign-in`)"))))
        }
        OperatorsCommand::Password { name } => {
            let api = ctx.anonymous()?;
            let name = match name {
                Some(name) => name,
                None => ask("operator name", false)?.expose_secret().to_owned(),
            };
            let old = ask("old password", true)?;
            let new = new_password()?;
            let session = api.sign_in(&name, &old).await?;
            let body = json!({ "old_password": old.expose_secret(), "password": new.expose_secret(), "reason": "changed their own password at the command line" });
            session.put(&format!("/v1/operators/{name}/password"), &body).await?;
            Ok(boxed(Done("your password is changed; every session and token of yours has ended".into())))
        }
        OperatorsCommand::Reset { name, reason } => {
            let path = format!("/v1/operators/{name}/enrollment");
            ctx.ops()?.post(&path, &json!({ "reason": reason })).await?.report::<IssuedCode>()
        }
        OperatorsCommand::Update { name, role, tenants, every_tenant, reason } => {
            let tenants = (!tenants.is_empty()).then_some(tenants);
            let body = json!({ "role": role, "tenants": tenants, "every_tenant": every_tenant, "reason": reason });
            ctx.ops()?.patch(&format!("/v1/operators/{name}"), &body).await?.report::<OperatorView>()
        }
        OperatorsCommand::Disable { name, reason } => {
            ctx.ops()?.delete(&format!("/v1/operators/{name}"), &json!({ "reason": reason })).await?;
            Ok(boxed(Done(format!("operator {name} is disabled: their tokens and sessions no longer work"))))
        }
    }
}

async fn recon_command(command: ReconCommand, ops: &OpsClient) -> Result<Box<dyn Report>, OperatorError> {
    match command {
        ReconCommand::Run { from, to, reason } => {
            let body = json!({ "from": from, "to": to, "reason": reason });
            let queued: Run = ops.post("/v1/recon/runs", &body).await?.into()?;
            Ok(boxed(finished_run(ops, queued.run_id).await?))
        }
        ReconCommand::Runs { limit } => {
            let query = [("limit", limit.to_string())];
            ops.get_with("/v1/recon/runs", &query).await?.report::<RunList>()
        }
        ReconCommand::Show { run_id } => ops.get(&format!("/v1/recon/runs/{run_id}")).await?.report::<RunDetail>(),
    }
}

async fn tenant_command(command: TenantsCommand, ops: &OpsClient) -> Result<Box<dyn Report>, OperatorError> {
    let (tenant, account, reason) = match command {
        TenantsCommand::Create { name, rate_limit, provider_account, reason } => {
            let body = json!({ "name": name, "rate_limit": rate_limit, "provider_account": provider_account, "reason": reason });
            let proposed: Acted = ops.post("/v1/tenants", &body).await?.into()?;
            return Ok(boxed(proposed));
        }
        TenantsCommand::List => {
            let list: TenantList = ops.get("/v1/tenants").await?.into()?;
            return Ok(boxed(list));
        }
        TenantsCommand::Connect { tenant, account, reason } => (tenant, Some(account), reason),
        TenantsCommand::Disconnect { tenant, reason } => (tenant, None, reason),
    };
    let path = format!("/v1/tenants/{tenant}/provider-account");
    ops.put(&path, &json!({ "account": account, "reason": reason })).await?.report::<Acted>()
}

async fn dead_letter_command(command: DeadLettersCommand, ops: &OpsClient) -> Result<Box<dyn Report>, OperatorError> {
    match command {
        DeadLettersCommand::List { open: _, all } => {
            ops.get(if all { "/v1/dead-letters?all=true" } else { "/v1/dead-letters" }).await?.report::<EntryList>()
        }
        DeadLettersCommand::Show { payment_id } => {
            ops.get(&format!("/v1/payments/{payment_id}")).await?.report::<PaymentPage>()
        }
        DeadLettersCommand::Retry { payment_id, reason, outside_key_window } => {
            let body = json!({ "reason": reason, "outside_key_window": outside_key_window });
            ops.post(&format!("/v1/payments/{payment_id}/retry"), &body).await?.report::<Acted>()
        }
        DeadLettersCommand::Resolve {
            payment_id,
            outcome,
            acknowledge: _,
            reason,
            charge_id,
            amount,
            currency,
            charged_at,
            force,
        } => {
            let outcome = outcome.map_or("acknowledged", ResolveAs::as_str);
            let body = json!({
                "as": outcome,
                "reason": reason,
                "charge_id": charge_id,
                "amount": amount,
                "currency": currency,
                "charged_at": charged_at,
                "force": force,
            });
            ops.post(&format!("/v1/payments/{payment_id}/resolve"), &body).await?.report::<Acted>()
        }
    }
}

async fn refund_command(command: RefundsCommand, ops: &OpsClient) -> Result<Box<dyn Report>, OperatorError> {
    match command {
        RefundsCommand::Propose { payment_id, amount, refund_reason, reason } => {
            let refund_reason = refund_reason.map(RefundReasonArg::as_str);
            let body = json!({ "amount": amount, "refund_reason": refund_reason, "reason": reason });
            ops.post(&format!("/v1/payments/{payment_id}/refund"), &body).await?.report::<Acted>()
        }
        RefundsCommand::DeadLetters => ops.get("/v1/dead-letters/refunds").await?.report::<DeadRefundList>(),
        RefundsCommand::Show { refund_id } => {
            ops.get(&format!("/v1/refunds/{refund_id}")).await?.report::<RefundDetail>()
        }
        RefundsCommand::Retry { refund_id, reason, outside_key_window } => {
            let body = json!({ "reason": reason, "outside_key_window": outside_key_window });
            ops.post(&format!("/v1/refunds/{refund_id}/retry"), &body).await?.report::<Acted>()
        }
        RefundsCommand::Resolve {
            refund_id,
            outcome,
            acknowledge: _,
            reason,
            provider_refund_id,
            amount,
            currency,
            refunded_at,
            force,
        } => {
            let outcome = outcome.map_or("acknowledged", ResolveAs::as_str);
            let body = json!({
                "as": outcome,
                "reason": reason,
                "provider_refund_id": provider_refund_id,
                "amount": amount,
                "currency": currency,
                "refunded_at": refunded_at,
                "force": force,
            });
            ops.post(&format!("/v1/refunds/{refund_id}/resolve"), &body).await?.report::<Acted>()
        }
    }
}

async fn proposal_command(command: ProposalsCommand, ops: &OpsClient) -> Result<Box<dyn Report>, OperatorError> {
    let (proposal_id, decision, reason) = match command {
        ProposalsCommand::List { status, payment_id } => {
            let mut query = Vec::new();
            query.extend(status.map(|s| ("status", s)));
            query.extend(payment_id.map(|p| ("payment_id", p.to_string())));
            let list: ProposalList = ops.get_with("/v1/proposals", &query).await?.into()?;
            return Ok(boxed(list));
        }
        ProposalsCommand::Approve { proposal_id, reason } => {
            let path = format!("/v1/proposals/{proposal_id}/approve");
            let approved: Approved = ops.post(&path, &json!({ "reason": reason })).await?.into()?;
            return Ok(boxed(approved));
        }
        ProposalsCommand::Reject { proposal_id, reason } => (proposal_id, "reject", reason),
        ProposalsCommand::Withdraw { proposal_id, reason } => (proposal_id, "withdraw", reason),
    };
    let path = format!("/v1/proposals/{proposal_id}/{decision}");
    ops.post(&path, &json!({ "reason": reason })).await?.report::<ProposalView>()
}

async fn token_command(command: TokensCommand, ops: &OpsClient) -> Result<Box<dyn Report>, OperatorError> {
    match command {
        TokensCommand::List { operator } => {
            let whose = whose(ops, operator).await?;
            ops.get(&format!("/v1/operators/{whose}/tokens")).await?.report::<TokenList>()
        }
        TokensCommand::Issue { operator, label, days, reason } => {
            let whose = whose(ops, operator).await?;
            let body = json!({ "label": label, "expires_in_days": days, "reason": reason });
            ops.post(&format!("/v1/operators/{whose}/tokens"), &body).await?.report::<IssuedToken>()
        }
        TokensCommand::Revoke { token_id, reason } => {
            ops.delete(&format!("/v1/tokens/{token_id}"), &json!({ "reason": reason })).await?;
            Ok(boxed(Done(format!("token {token_id} revoked"))))
        }
    }
}

/// The operator named, or the one the token acts as.
async fn whose(ops: &OpsClient, operator: Option<String>) -> Result<String, OperatorError> {
    if let Some(operator) = operator {
        return Ok(operator);
    }
    let me = ops.get("/v1/me").await?;
    me.body["name"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| OperatorError::Failed(anyhow::anyhow!("GET /v1/me named nobody")))
}

/// A new password, asked for twice.
fn new_password() -> Result<SecretString, OperatorError> {
    let password = ask("new password (12 characters or more)", true)?;
    let again = ask("the new password again", true)?;
    if password.expose_secret() != again.expose_secret() {
        return Err(OperatorError::Invalid("the two passwords differ: nothing was changed".into()));
    }
    Ok(password)
}

/// Waits for queued run `run_id` to end, reading it every second, and returns what it found. A run
/// that failed is an error, with the run's own.
async fn finished_run(ops: &OpsClient, run_id: Uuid) -> Result<RunDetail, OperatorError> {
    eprintln!("run {run_id} is queued; waiting for a reconciler to run it (stopping here leaves it queued)");
    loop {
        let detail: RunDetail = ops.get(&format!("/v1/recon/runs/{run_id}")).await?.into()?;
        match detail.run.status {
            RunStatus::Queued | RunStatus::Running => tokio::time::sleep(Duration::from_secs(1)).await,
            RunStatus::Completed => return Ok(detail),
            RunStatus::Failed => {
                let error = detail.run.error.unwrap_or_default();
                return Err(OperatorError::Failed(anyhow::anyhow!("run {run_id} failed: {error}")));
            }
        }
    }
}

fn boxed<R: Report + 'static>(report: R) -> Box<dyn Report> {
    Box::new(report)
}

async fn connection(ctx: &Context) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, OperatorError> {
    Ok(database(ctx).await?.acquire().await.context("cannot reach the database")?)
}

/// The pool, once the database has taken a connection (within [`DATABASE_WITHIN`]).
async fn database(ctx: &Context) -> Result<&PgPool, OperatorError> {
    db::wait_until_reachable(&ctx.pool.connect_options(), DATABASE_WITHIN)
        .await
        .context("cannot reach the database")?;
    Ok(&ctx.pool)
}

/// `migrate`: the schema version after applying every pending migration.
#[derive(Debug, serde::Serialize)]
pub struct Migrated {
    /// The latest applied migration.
    pub schema_version: i64,
    /// Whether the tables are distributed by tenant on Citus.
    pub distributed: bool,
}

impl Report for Migrated {
    fn human(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        let layout = if self.distributed { "; tables distributed by tenant on Citus" } else { "" };
        writeln!(out, "migrations applied; schema version {}{layout}", self.schema_version)
    }

    fn json(&self) -> serde_json::Value {
        oncepay_ops::render::to_json(self)
    }
}

async fn migrate(pool: &PgPool) -> Result<Migrated, OperatorError> {
    let layout = db::migrate(pool).await.context("cannot apply the migrations")?;
    db::check_ready(pool).await.context("the schema is not current after migrating")?;
    let schema_version = db::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    Ok(Migrated { schema_version, distributed: layout == db::Layout::DistributedByTenant })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_subcommand_means_serve() {
        let cli = Cli::try_parse_from(["oncepay-reconciler"]).unwrap();
        assert!(cli.command.is_none());
    }

    #[test]
    fn resolving_needs_an_outcome_or_an_acknowledgement_and_a_reason() {
        let id = "0190c1f2-aaaa-7bbb-8ccc-123456789abc";
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["oncepay-reconciler", "dead-letters", "resolve", id], args].concat())
        };
        assert!(parse(&["--as", "failed", "--reason", "card expired"]).is_ok());
        assert!(parse(&["--acknowledge", "--reason", "refunded by hand"]).is_ok());
        assert!(parse(&["--reason", "no outcome"]).is_err());
        assert!(parse(&["--as", "failed"]).is_err());
        assert!(parse(&["--as", "failed", "--acknowledge", "--reason", "both"]).is_err());
        assert!(parse(&["--as", "succeeded", "--charge-id", "ch_1", "--amount", "5", "--reason", "x"]).is_err());
    }

    #[test]
    fn a_refund_is_proposed_with_a_reason_and_optionally_an_amount_and_the_providers_words() {
        let id = "0190c1f2-aaaa-7bbb-8ccc-123456789abc";
        let parse =
            |args: &[&str]| Cli::try_parse_from([&["oncepay-reconciler", "refunds", "propose", id], args].concat());

        let full = parse(&["--amount", "500", "--refund-reason", "requested_by_customer", "--reason", "returned"]);
        assert!(matches!(
            full.unwrap().command,
            Some(Command::Refunds(RefundsCommand::Propose {
                amount: Some(500),
                refund_reason: Some(RefundReasonArg::RequestedByCustomer),
                ..
            }))
        ));
        assert!(parse(&["--reason", "all of it"]).is_ok());
        assert!(parse(&["--amount", "500"]).is_err(), "a proposal says why");
        assert!(parse(&["--refund-reason", "whim", "--reason", "x"]).is_err());
    }

    #[test]
    fn resolving_a_refund_by_hand_gives_its_amount_currency_and_time_together() {
        let id = "0190c1f2-aaaa-7bbb-8ccc-123456789abc";
        let parse =
            |args: &[&str]| Cli::try_parse_from([&["oncepay-reconciler", "refunds", "resolve", id], args].concat());

        assert!(parse(&["--as", "failed", "--reason", "the provider failed it"]).is_ok());
        assert!(parse(&["--as", "succeeded", "--provider-refund-id", "re_1", "--reason", "in the dashboard"]).is_ok());
        assert!(parse(&["--acknowledge", "--reason", "paid back by bank transfer"]).is_ok());
        assert!(parse(&["--reason", "no outcome"]).is_err());
        assert!(parse(&["--as", "failed", "--acknowledge", "--reason", "both"]).is_err());
        let by_hand = ["--amount", "500", "--currency", "EUR", "--refunded-at", "2026-01-10T12:00:00Z"];
        assert!(
            parse(&[&["--as", "succeeded", "--provider-refund-id", "re_1", "--reason", "x"][..], &by_hand].concat())
                .is_ok()
        );
        assert!(
            parse(&["--as", "succeeded", "--provider-refund-id", "re_1", "--amount", "500", "--reason", "x"]).is_err()
        );
        assert!(parse(&["--reason", "no outcome"]).is_err());
    }
}
