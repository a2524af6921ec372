//! The test suite's npm packages: the files of a directory under `tests/` (a package.json, the
//! package-lock.json that pins every dependency, and any script that uses them) copied into the
//! target directory and installed there with `npm ci`, once, and again only when one of those files
//! changes. Nothing is installed from outside the lock.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tokio::process::Command;

/// One npm package of the test suite.
pub struct Package {
    /// What it is, for the line printed while installing it.
    what: &'static str,
    /// Its directory under `tests/`.
    source: &'static str,
    /// Its directory under the target directory.
    dir: &'static str,
    /// The files that make the installation.
    files: &'static [&'static str],
}

/// The OpenID provider for the operator sign-in tests: oidc-provider and the script that serves it.
pub const OIDC_PROVIDER: Package = Package {
    what: "the OpenID provider (oidc-provider)",
    source: "oidc",
    dir: "oidc-provider",
    files: &["package.json", "package-lock.json", "serve.mjs"],
};

/// axe-core, the accessibility checker the console's browser tests inject into each page.
pub const AXE_CORE: Package = Package {
    what: "the accessibility checker (axe-core)",
    source: "axe",
    dir: "axe-core",
    files: &["package.json", "package-lock.json"],
};

/// Makes sure `package` is installed and returns the directory it is installed in.
pub async fn install(root: &Path, target_dir: &Path, package: &Package) -> anyhow::Result<PathBuf> {
    let source = root.join("tests").join(package.source);
    let dir = target_dir.join(package.dir);
    let mut wanted = String::new();
    for file in package.files {
        let path = source.join(file);
        wanted += &std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    }
    // What was installed, so a changed file installs again.
    let stamp = dir.join("installed.txt");
    if std::fs::read_to_string(&stamp).is_ok_and(|installed| installed == wanted) && dir.join("node_modules").exists() {
        return Ok(dir);
    }
    eprintln!("xtask: installing {} from npm into {}", package.what, dir.display());
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot make {}", dir.display()))?;
    for file in package.files {
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
    Ok(dir)
}
