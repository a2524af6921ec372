//! Chromium and chromedriver for the console's browser tests, from Debian's `chromium` and
//! `chromium-driver` packages: installed with apt-get when either is missing, left alone otherwise.

use std::path::Path;

use anyhow::{Context, bail};
use oncepay_devkit::browser::{DEFAULT_CHROMEDRIVER, DEFAULT_CHROMIUM};
use tokio::process::Command;

/// Makes sure Chromium and chromedriver are installed at their Debian paths.
pub async fn install() -> anyhow::Result<()> {
    if Path::new(DEFAULT_CHROMIUM).exists() && Path::new(DEFAULT_CHROMEDRIVER).exists() {
        return Ok(());
    }
    eprintln!(
        "xtask: installing chromium and chromium-driver with apt-get, for the console's browser tests \
         ({DEFAULT_CHROMIUM} or {DEFAULT_CHROMEDRIVER} is missing)"
    );
    let status = Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends", "chromium", "chromium-driver"])
        // No questions from debconf: there is nobody to answer them.
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .await
        .context("cannot run apt-get (the browser tests need Debian's chromium and chromium-driver)")?;
    if !status.success() {
        bail!(
            "apt-get install chromium chromium-driver failed with {status}: it needs root and current package \
             lists (`apt-get update`); or install both packages yourself"
        );
    }
    for path in [DEFAULT_CHROMIUM, DEFAULT_CHROMEDRIVER] {
        if !Path::new(path).exists() {
            bail!("apt-get installed chromium and chromium-driver, but there is no {path}");
        }
    }
    Ok(())
}
