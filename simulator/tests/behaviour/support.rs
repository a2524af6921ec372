//! What every behaviour test needs: an in-process simulator on port 0 with a fixed seed, a raw
//! HTTP client for the protocol (to see statuses and headers), oncepay's own provider client (so the
//! simulator is checked against the client that will really use it), and the control client.

use std::collections::BTreeMap;
use std::time::Duration;

use oncepay_devkit::wait::wait_until;
use oncepay_domain::ids::{PaymentId, RefundId, TenantId};
use oncepay_domain::money::{Amount, Currency};
use oncepay_provider::http::HttpProvider;
use oncepay_provider::wire::{Charge, CreateCharge, CreateRefund};
use oncepay_provider::{ChargeRequest, RefundRequest};
use oncepay_provider::{ProviderKind, ProviderSettings};
use oncepay_simulator::Simulator;
use oncepay_simulator::client::SimulatorClient;
use oncepay_simulator::config::Settings;
use oncepay_simulator::faults::FaultsPatch;
use secrecy::{ExposeSecret, SecretString};
use tokio_util::sync::CancellationToken;

/// A simulator under test.
pub struct Sim {
    pub simulator: Simulator,
    pub control: SimulatorClient,
    pub http: reqwest::Client,
    pub settings: Settings,
}

/// Default settings for a test: port 0, seed 7, no webhooks, fast webhook retries.
pub fn settings() -> Settings {
    let mut settings = Settings::load(None).expect("the embedded defaults load");
    settings.http.host = "127.0.0.1".into();
    settings.http.port = 0;
    settings.simulator.seed = Some(7);
    settings.simulator.webhook_backoff.base = Duration::from_millis(10);
    settings.simulator.webhook_backoff.max = Duration::from_millis(50);
    settings
}

impl Sim {
    pub async fn start() -> Self {
        Self::start_with(settings()).await
    }

    pub async fn start_with(settings: Settings) -> Self {
        let simulator =
            Simulator::start(settings.clone(), CancellationToken::new()).await.expect("the simulator starts");
        let control = SimulatorClient::new(&simulator.base_url());
        Self { simulator, control, http: reqwest::Client::new(), settings }
    }

    pub async fn with_faults(patch: FaultsPatch) -> Self {
        let sim = Self::start().await;
        sim.control.set_faults(&patch).await.expect("valid faults");
        sim
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.simulator.base_url())
    }

    pub fn api_key(&self) -> String {
        self.settings.simulator.api_key.expose_secret().to_owned()
    }

    /// `POST /v1/charges`, authenticated, with `key`.
    pub async fn post_charge(&self, key: &str, body: &CreateCharge) -> reqwest::Response {
        self.http
            .post(self.url("/v1/charges"))
            .bearer_auth(self.api_key())
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .expect("the simulator answers")
    }

    /// `POST /v1/refunds`, authenticated, with `key`.
    pub async fn post_refund(&self, key: &str, body: &CreateRefund) -> reqwest::Response {
        self.http
            .post(self.url("/v1/refunds"))
            .bearer_auth(self.api_key())
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .expect("the simulator answers")
    }

    /// A succeeded charge of `amount` EUR cents, made through the protocol under a fresh key.
    pub async fn charged(&self, amount: i64) -> Charge {
        let key = format!("charge-{}", PaymentId::generate());
        let response = self.post_charge(&key, &body(amount)).await;
        assert_eq!(response.status(), 201, "the charge to refund is made");
        response.json().await.unwrap()
    }

    /// An authenticated `GET`.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).bearer_auth(self.api_key()).send().await.expect("the simulator answers")
    }

    /// oncepay's provider client pointed at this simulator, giving up after `timeout`.
    pub fn provider(&self, timeout: Duration) -> HttpProvider {
        HttpProvider::new(&ProviderSettings {
            base_url: self.simulator.base_url(),
            api_key: SecretString::from(self.api_key()),
            connect_timeout_ms: 1_000,
            request_timeout_ms: u64::try_from(timeout.as_millis()).unwrap(),
            key_window_secs: self.settings.simulator.key_window_secs,
            key_window_margin_secs: 0,
            kind: ProviderKind::Simulator,
            stripe: None,
        })
        .unwrap()
    }
}

/// A valid charge body.
pub fn body(amount: i64) -> CreateCharge {
    CreateCharge {
        amount,
        currency: "EUR".into(),
        customer: "cus_42".into(),
        metadata: BTreeMap::from([("order".to_owned(), "A-1".to_owned())]),
        payment_method: None,
    }
}

/// What the worker would send for a new payment.
pub fn charge_request(amount: i64) -> ChargeRequest {
    ChargeRequest::for_payment(
        TenantId::generate(),
        PaymentId::generate(),
        Amount::new(amount).unwrap(),
        Currency::parse("EUR").unwrap(),
        "cus_42".into(),
        &BTreeMap::new(),
    )
}

/// What the worker would send for a new payment that names `method`.
pub fn charge_request_paying_with(amount: i64, method: &str) -> ChargeRequest {
    ChargeRequest { payment_method: Some(method.to_owned()), ..charge_request(amount) }
}

/// A valid charge body that names `method`.
pub fn body_paying_with(amount: i64, method: &str) -> CreateCharge {
    CreateCharge { payment_method: Some(method.to_owned()), ..body(amount) }
}

/// Polls `check` until it returns something, for at most 10 s: for events the test cannot be
/// notified of (a webhook reaching a receiver, a hang ending).
pub async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, check: impl FnMut() -> F) -> T {
    wait_until(what, Duration::from_secs(10), check).await.unwrap()
}

/// A valid refund body: `amount` of `charge`.
pub fn refund_body(charge: &str, amount: i64) -> CreateRefund {
    CreateRefund {
        charge: charge.to_owned(),
        amount,
        reason: Some("requested_by_customer".into()),
        metadata: BTreeMap::from([("ticket".to_owned(), "T-1".to_owned())]),
    }
}

/// What the worker would send for a new refund of `amount` of `charge`.
pub fn refund_request(charge: &str, amount: i64) -> RefundRequest {
    RefundRequest::for_refund(
        TenantId::generate(),
        PaymentId::generate(),
        RefundId::generate(),
        charge.to_owned(),
        Amount::new(amount).unwrap(),
        Currency::parse("EUR").unwrap(),
        None,
        &BTreeMap::new(),
    )
}
