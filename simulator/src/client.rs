//! A typed client for the control endpoints (`/_sim/*`), for tests and harnesses that drive a
//! simulator, in-process or as a process.
//!
//! It speaks only the control plane; the protocol itself is spoken by
//! `oncepay_provider::http::HttpProvider`. Every call fails on a non-2xx response.

use crate::control::{ExpiredKeys, GroundTruth, PlantCharge, RefundTruth, WebhookTarget};
use crate::faults::{Faults, FaultsPatch};
use oncepay_provider::wire::Charge;

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The simulator could not be reached, or its response could not be read.
    #[error("the simulator could not be reached: {0}")]
    Transport(#[from] reqwest::Error),
    /// It responded with an error status.
    #[error("the simulator responded with HTTP {status}: {body}")]
    Status {
        /// The status code.
        status: u16,
        /// The error body.
        body: String,
    },
}

/// A client for one simulator.
#[derive(Debug, Clone)]
pub struct SimulatorClient {
    http: reqwest::Client,
    base_url: String,
}

impl SimulatorClient {
    /// A client for the simulator at `base_url` (e.g. `http://127.0.0.1:8090`).
    pub fn new(base_url: &str) -> Self {
        oncepay_service::tls::install_provider();
        Self { http: reqwest::Client::new(), base_url: base_url.trim_end_matches('/').to_owned() }
    }

    async fn call<T: serde::de::DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> Result<T, ControlError> {
        let response = request.send().await?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(ControlError::Status { status: status.as_u16(), body });
        }
        Ok(response.json().await?)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// `GET /_sim/charges`.
    pub async fn ground_truth(&self) -> Result<GroundTruth, ControlError> {
        self.call(self.http.get(self.url("/_sim/charges"))).await
    }

    /// `GET /_sim/refunds`.
    pub async fn refund_truth(&self) -> Result<RefundTruth, ControlError> {
        self.call(self.http.get(self.url("/_sim/refunds"))).await
    }

    /// `POST /_sim/charges`.
    pub async fn plant(&self, plant: &PlantCharge) -> Result<Charge, ControlError> {
        self.call(self.http.post(self.url("/_sim/charges")).json(plant)).await
    }

    /// `GET /_sim/faults`.
    pub async fn faults(&self) -> Result<Faults, ControlError> {
        self.call(self.http.get(self.url("/_sim/faults"))).await
    }

    /// `POST /_sim/faults`; returns the faults now in force.
    pub async fn set_faults(&self, patch: &FaultsPatch) -> Result<Faults, ControlError> {
        self.call(self.http.post(self.url("/_sim/faults")).json(patch)).await
    }

    /// `POST /_sim/keys/expire`; returns how many keys were forgotten.
    pub async fn expire_keys(&self) -> Result<usize, ControlError> {
        let expired: ExpiredKeys = self.call(self.http.post(self.url("/_sim/keys/expire"))).await?;
        Ok(expired.forgotten)
    }

    /// `POST /_sim/webhook`; none stops webhooks.
    pub async fn set_webhook_url(&self, url: Option<&str>) -> Result<WebhookTarget, ControlError> {
        let target = WebhookTarget { url: url.map(str::to_owned) };
        self.call(self.http.post(self.url("/_sim/webhook")).json(&target)).await
    }
}
