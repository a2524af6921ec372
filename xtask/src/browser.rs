//! Chromium and chromedriver for the console's browser tests, from Debian's `chromium` and
//! `chromium-driver` packages: installed with apt-get when either is missing, left alone otherwise.

use oncepay_devkit::browser::{DEFAULT_CHROMEDRIVER, DEFAULT_CHROMIUM};

use crate::packages;

/// Makes sure Chromium and chromedriver are installed at their Debian paths.
pub async fn install() -> anyhow::Result<()> {
    packages::ensure(
        &["chromium", "chromium-driver"],
        &[DEFAULT_CHROMIUM, DEFAULT_CHROMEDRIVER],
        "for the console's browser tests",
    )
    .await
}
