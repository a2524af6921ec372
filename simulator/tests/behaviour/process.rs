//! The real binary: configured by the environment, ready at /readyz, exits 0 on SIGTERM.

use std::time::Duration;

use oncepay_devkit::ports;
use oncepay_devkit::process::{Child, Spec};
use oncepay_provider::wire::ErrorBody;

#[tokio::test]
async fn the_binary_serves_the_protocol_and_exits_0_on_sigterm() {
    // reqwest is built without a default TLS provider; the devkit's readiness probe needs one.
    oncepay_service::tls::install_provider();
    let port = ports::reserve().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let spec = Spec::new("simulator", env!("CARGO_BIN_EXE_oncepay-simulator"), logs.path())
        .port(port)
        .setting("simulator.api_key", "sk_from_env")
        .setting("faults.decline_rate", "1.0");
    let mut simulator = Child::spawn(spec).await.unwrap();
    let base = format!("http://127.0.0.1:{port}");
    simulator.wait_until_ready(&format!("{base}/readyz"), Duration::from_secs(20)).await.unwrap();
    let http = reqwest::Client::new();

    let declined = http
        .post(format!("{base}/v1/charges"))
        .bearer_auth("sk_from_env")
        .header("Idempotency-Key", "key-1")
        .json(&serde_json::json!({"amount": 100, "currency": "EUR", "customer": "cus"}))
        .send()
        .await
        .unwrap();
    let healthz = http.get(format!("{base}/healthz")).send().await.unwrap();
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let status = simulator.terminate(Duration::from_secs(10)).await.unwrap();

    assert_eq!(declined.status(), 402, "the environment set the API key and the decline rate");
    assert!(declined.json::<ErrorBody>().await.unwrap().error.charge.is_some());
    assert_eq!(healthz.status(), 200);
    assert!(metrics.contains("oncepay_simulator_charges_total"), "{metrics}");
    assert_eq!(status.code(), Some(0), "{}", simulator.log().await.unwrap());
}
