//! TLS for outgoing HTTPS (the provider, an OTLP collector): installs ring as rustls' process-wide
//! crypto provider, once. ring builds with a C compiler alone, unlike the default aws-lc.

use std::sync::Once;

/// Installs the provider; later calls do nothing.
pub fn install_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // Fails only if another provider was installed first, which is just as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
