//! localstripe, a third-party fake of Stripe's API (from PyPI), as a child process: started on a
//! loopback port with the project's `tests/localstripe/serve.py` (memory only, nothing on disk), and
//! told where to deliver its signed webhooks, as a Stripe webhook endpoint is set up in the dashboard.
//!
//! `cargo xtask up --provider localstripe` runs oncepay against it, and the Stripe end-to-end suite
//! tests against it. It implements no Stripe Connect: it ignores `Stripe-Account`, and its events
//! name no account.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use crate::process::{Child, Spec};

/// The secret key oncepay's processes use. localstripe takes any `sk_…` key.
pub const SECRET_KEY: &str = "sk_test_oncepay_localstripe";

/// The API version oncepay's processes pin. localstripe ignores it; Stripe would not.
pub const API_VERSION: &str = "2024-06-20";

/// How long localstripe may take to start.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts localstripe on `port` of 127.0.0.1 with `python` (which has it installed) running
/// `serve_script`, and waits until it serves.
pub async fn start(python: &Path, serve_script: &Path, port: u16, spec: Spec) -> anyhow::Result<Child> {
    let spec = Spec { program: python.to_path_buf(), ..spec }.arg(serve_script.to_string_lossy()).arg(port.to_string());
    let mut child = Child::spawn(spec).await.context("cannot start localstripe")?;
    // The one page it serves without a key.
    child.wait_until_ready(&format!("{}/js.stripe.com/v3/", url(port)), READY_TIMEOUT).await?;
    Ok(child)
}

/// Its base URL, in place of `https://api.stripe.com`.
pub fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// Sends the PaymentIntent events oncepay acts on to `to`, signed with `secret`.
pub async fn send_webhooks_to(port: u16, to: &str, secret: &str) -> anyhow::Result<()> {
    let form = [
        ("url", to),
        ("secret", secret),
        ("events[]", "payment_intent.succeeded"),
        ("events[]", "payment_intent.payment_failed"),
        ("events[]", "payment_intent.canceled"),
    ];
    reqwest::Client::new()
        .post(format!("{}/_config/webhooks/oncepay", url(port)))
        .bearer_auth(SECRET_KEY)
        .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(serde_urlencoded::to_string(form)?)
        .send()
        .await?
        .error_for_status()
        .context("localstripe refused its webhook endpoint")?;
    Ok(())
}
