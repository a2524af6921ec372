//! Prometheus metrics: one recorder per process, rendered at `/metrics`.
//!
//! Code records through the `metrics` facade (`metrics::counter!(...)`); names follow
//! `oncepay_<binary>_<thing>_<unit>` with `_total` for counters, and labels are low-cardinality
//! enumerations (how something ended, a class), never ids or keys. Histograms use fixed latency buckets in
//! seconds.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
/// What renders the recorder's metrics, for the binaries that keep it beside their state.
pub use metrics_exporter_prometheus::PrometheusHandle;

/// Latency buckets, in seconds: 0.5 ms to 30 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Installs the process-wide recorder on first use and returns the handle that renders it.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new();
            // The bucket list is a non-empty constant, which is all `set_buckets` checks.
            let builder = builder.set_buckets(LATENCY_BUCKETS).unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
            }
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let upkeep = handle.clone();
                runtime.spawn(async move {
                    let mut every = tokio::time::interval(Duration::from_secs(5));
                    loop {
                        every.tick().await;
                        upkeep.run_upkeep();
                    }
                });
            }
            handle
        })
        .clone()
}
