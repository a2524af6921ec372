//! localstripe, a third-party fake of Stripe's API (from PyPI), as a system's payment provider.
//!
//! `cargo xtask test` installs it into a virtual environment and names that environment's Python in
//! `LOCALSTRIPE_PYTHON`. [`Localstripe::start`] runs it on loopback (`oncepay_devkit::localstripe`).
//! The methods here are what a test does to Stripe directly: make a card, act as the customer who
//! completes 3-D Secure, point its webhooks at the reconciler, and read every PaymentIntent and
//! refund it holds as the ground truth.
//!
//! localstripe has no idempotency keys, no search, and no list filters but a refund list's
//! `payment_intent`; its refunds always succeed, take no `reason` and are never checked against the
//! charge. What depends on those is tested against a wiremock Stripe in the provider crate.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use oncepay_devkit::localstripe;
pub use oncepay_devkit::localstripe::{API_VERSION, SECRET_KEY};
use oncepay_devkit::ports;
use oncepay_devkit::process::{Child, Spec};
use oncepay_provider::stripe::wire::{IntentStatus, ListPage, PaymentIntent, Settled, StripeRefund};
use oncepay_provider::wire::{Charge, Refund};
use serde::Deserialize;

/// The variable that names the Python localstripe is installed for. Not `ONCEPAY_…`: every process
/// reads those as its configuration, and the simulator refuses a setting it does not know.
pub const PYTHON_VARIABLE: &str = "LOCALSTRIPE_PYTHON";

/// Test cards, by what Stripe (and localstripe) do with them.
pub mod cards {
    /// Charged.
    pub const VISA: &str = "pm_card_visa";
    /// Declined when charged (`card_declined`).
    pub const DECLINED: &str = "pm_card_chargeCustomerFail";
    /// Needs 3-D Secure: the intent waits in `requires_action` until the customer completes it.
    pub const THREE_D_SECURE_NUMBER: &str = "4000002500003155";
}

/// A running localstripe.
pub struct Localstripe {
    child: Child,
    port: u16,
    url: String,
    http: reqwest::Client,
}

/// A PaymentIntent as localstripe lists it, with the secret the customer's browser would hold.
#[derive(Deserialize)]
struct Listed {
    #[serde(flatten)]
    intent: PaymentIntent,
    client_secret: String,
}

#[derive(Deserialize)]
struct Created {
    id: String,
}

impl Localstripe {
    /// The Python to run localstripe with, from [`PYTHON_VARIABLE`].
    pub fn python() -> anyhow::Result<PathBuf> {
        match std::env::var_os(PYTHON_VARIABLE) {
            Some(python) => Ok(PathBuf::from(python)),
            None => bail!(
                "{PYTHON_VARIABLE} is not set: run the suite with `cargo xtask test`, which installs localstripe, \
                 or set it to a Python that has tests/localstripe/requirements.txt installed"
            ),
        }
    }

    /// Starts localstripe on a free loopback port, logging to `log_dir`, and waits until it serves.
    pub async fn start(python: &Path, log_dir: &Path) -> anyhow::Result<Self> {
        let port = ports::reserve()?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("localstripe").join("serve.py");
        let child = localstripe::start(python, &script, port, Spec::new("localstripe", python, log_dir)).await?;
        Ok(Self { child, port, url: localstripe::url(port), http: reqwest::Client::new() })
    }

    /// Its base URL, in place of `https://api.stripe.com`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends the events oncepay needs to `url`, signed with `secret`, as a Stripe webhook endpoint
    /// would be set up in the dashboard.
    pub async fn send_webhooks_to(&self, url: &str, secret: &str) -> anyhow::Result<()> {
        localstripe::send_webhooks_to(self.port, url, secret).await
    }

    /// A new card PaymentMethod with this test card number; returns its `pm_…` id.
    pub async fn card(&self, number: &str) -> anyhow::Result<String> {
        let form = [
            ("type", "card"),
            ("card[number]", number),
            ("card[exp_month]", "12"),
            ("card[exp_year]", "2030"),
            ("card[cvc]", "123"),
        ];
        let created: Created =
            self.post("/v1/payment_methods", &form)?.send().await?.error_for_status()?.json().await?;
        Ok(created.id)
    }

    /// A form-encoded POST to `path`, as Stripe's API takes it.
    fn post(&self, path: &str, form: &[(&str, &str)]) -> anyhow::Result<reqwest::RequestBuilder> {
        Ok(self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(SECRET_KEY)
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(form)?))
    }

    /// Every PaymentIntent it holds, oldest first.
    async fn listed(&self) -> anyhow::Result<Vec<Listed>> {
        let mut all = Vec::new();
        loop {
            let mut query = vec![("limit", "100".to_owned())];
            if let Some(last) = all.last().map(|listed: &Listed| listed.intent.id.clone()) {
                query.push(("starting_after", last));
            }
            let page: ListPage<Listed> = self
                .http
                .get(format!("{}/v1/payment_intents", self.url))
                .bearer_auth(SECRET_KEY)
                .query(&query)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await
                .context("reading localstripe's list of PaymentIntents")?;
            let more = page.has_more && !page.data.is_empty();
            all.extend(page.data);
            if !more {
                return Ok(all);
            }
        }
    }

    /// Completes 3-D Secure, as the customer would, for every intent that waits for it; returns how
    /// many there were.
    pub async fn authenticate_waiting(&self) -> anyhow::Result<usize> {
        let waiting: Vec<Listed> =
            self.listed().await?.into_iter().filter(|l| l.intent.status == IntentStatus::RequiresAction).collect();
        for listed in &waiting {
            let form = [("client_secret", listed.client_secret.as_str()), ("success", "true")];
            self.post(&format!("/v1/payment_intents/{}/_authenticate", listed.intent.id), &form)?
                .send()
                .await?
                .error_for_status()
                .with_context(|| format!("authenticating {}", listed.intent.id))?;
        }
        Ok(waiting.len())
    }

    /// Every PaymentIntent as the charge it amounts to, oldest first: the ground truth for the
    /// checker. An intent that has not finished is an error, since it could still take money.
    pub async fn charges(&self) -> anyhow::Result<Vec<Charge>> {
        let mut charges = Vec::new();
        for listed in self.listed().await? {
            match listed.intent.settled_by_metadata() {
                Settled::Final(charge) => charges.push(*charge),
                Settled::NotFinal(status) => bail!("localstripe's {} has not finished: {status:?}", listed.intent.id),
            }
        }
        Ok(charges)
    }

    /// Every refund of every succeeded PaymentIntent, read from localstripe's list of each intent's
    /// refunds (`GET /v1/refunds?payment_intent=`): the ground truth of refunds for the checker.
    pub async fn refunds(&self) -> anyhow::Result<Vec<Refund>> {
        let mut refunds = Vec::new();
        for listed in self.listed().await? {
            if listed.intent.status != IntentStatus::Succeeded {
                continue;
            }
            let intent = listed.intent.id;
            let mut last: Option<String> = None;
            loop {
                let mut query = vec![("payment_intent", intent.clone()), ("limit", "100".to_owned())];
                if let Some(after) = last.take() {
                    query.push(("starting_after", after));
                }
                let page: ListPage<StripeRefund> = self
                    .http
                    .get(format!("{}/v1/refunds", self.url))
                    .bearer_auth(SECRET_KEY)
                    .query(&query)
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await
                    .with_context(|| format!("reading localstripe's refunds of {intent}"))?;
                last = page.data.last().map(|refund| refund.id.clone());
                let more = page.has_more && !page.data.is_empty();
                refunds.extend(page.data.iter().map(|refund| refund.to_refund(&intent, None)));
                if !more {
                    break;
                }
            }
        }
        Ok(refunds)
    }

    /// Stops it; an error if it had already died.
    pub async fn terminate(&mut self, grace: Duration) -> anyhow::Result<std::process::ExitStatus> {
        self.child.terminate(grace).await
    }
}
