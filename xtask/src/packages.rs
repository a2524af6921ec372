//! Debian packages the tasks need: installed with apt-get when a file they provide is missing, left
//! alone otherwise.

use std::path::Path;

use anyhow::{Context, bail};
use tokio::process::Command;

/// Makes sure every one of `files` exists, installing `packages` with apt-get if one is missing;
/// `purpose` says in the messages what they are for.
pub async fn ensure(packages: &[&str], files: &[&str], purpose: &str) -> anyhow::Result<()> {
    if files.iter().all(|file| Path::new(file).exists()) {
        return Ok(());
    }
    let names = packages.join(" ");
    eprintln!("xtask: installing {names} with apt-get, {purpose} ({} is missing)", files.join(" or "));
    let status = Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(packages)
        // No questions from debconf, there is nobody to answer them; and no service started by
        // the packages' scripts (invoke-rc.d starts none in runlevel 1): the tasks start their own.
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("RUNLEVEL", "1")
        .status()
        .await
        .with_context(|| format!("cannot run apt-get to install {names}, {purpose}"))?;
    if !status.success() {
        bail!(
            "apt-get install {names} failed with {status}: it needs root and current package lists \
             (`apt-get update`); or install the packages yourself"
        );
    }
    for file in files {
        if !Path::new(file).exists() {
            bail!("apt-get installed {names}, but there is no {file}");
        }
    }
    Ok(())
}
