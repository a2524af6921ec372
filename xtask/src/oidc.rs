//! The OpenID provider for the operator sign-in tests: `tests/oidc/` (oidc-provider from npm, pinned
//! by its package-lock.json, and the script that serves it) copied into the target directory and
//! installed there with `npm ci`, once, and again only when one of those files changes.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tokio::process::Command;

/// The files that make the installation.
const FILES: [&str; 3] = ["package.json", "package-lock.json", "serve.mjs"];

/// Makes sure the provider is installed and returns its script.
pub async fn install(root: &Path, target_dir: &Path) -> anyhow::Result<PathBuf> {
    let source = root.join("tests").join("oidc");
    let dir = target_dir.join("oidc-provider");
    let mut wanted = String::new();
    for file in FILES {
        let path = source.join(file);
        wanted += &std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    }
    let stamp = dir.join("installed.txt");
    let script = dir.join("serve.mjs");
    if std::fs::read_to_string(&stamp).is_ok_and(|installed| installed == wanted) && dir.join("node_modules").exists() {
        return Ok(script);
    }
    eprintln!("xtask: installing the OpenID provider (oidc-provider, npm) into {}", dir.display());
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot make {}", dir.display()))?;
    for file in FILES {
        std::fs::copy(source.join(file), dir.join(file)).with_context(|| format!("cannot copy {file}"))?;
    }
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&dir)
        .status()
        .await
        .context("cannot run npm (is Node.js with npm installed?)")?;
    if !status.success() {
        bail!("npm ci in {} failed with {status}", dir.display());
    }
    std::fs::write(&stamp, wanted)?;
    Ok(script)
}
