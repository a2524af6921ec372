//! localstripe for the Stripe end-to-end suite: a virtual environment in the target directory with
//! `tests/localstripe/requirements.txt` installed from PyPI, made once and made again only when the
//! requirements change.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tokio::process::Command;

/// Makes sure localstripe is installed and returns the Python that has it.
pub async fn install(root: &Path, target_dir: &Path) -> anyhow::Result<PathBuf> {
    let requirements_path = root.join("tests").join("localstripe").join("requirements.txt");
    let requirements = std::fs::read_to_string(&requirements_path)
        .with_context(|| format!("cannot read {}", requirements_path.display()))?;
    let venv = target_dir.join("localstripe");
    let python = venv.join("bin").join("python");
    // What was installed, so a changed requirements file installs again.
    let stamp = venv.join("installed-requirements.txt");
    if std::fs::read_to_string(&stamp).is_ok_and(|installed| installed == requirements) && python.exists() {
        return Ok(python);
    }
    eprintln!("xtask: installing localstripe into {}", venv.display());
    if venv.exists() {
        std::fs::remove_dir_all(&venv).with_context(|| format!("cannot remove {}", venv.display()))?;
    }
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv), "python3 -m venv (is python3 with venv installed?)")
        .await?;
    run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input", "-r"])
            .arg(&requirements_path),
        "pip install -r tests/localstripe/requirements.txt",
    )
    .await?;
    std::fs::write(&stamp, requirements)?;
    Ok(python)
}

async fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command.status().await.with_context(|| format!("cannot run {what}"))?;
    if !status.success() {
        bail!("{what} failed with {status}");
    }
    Ok(())
}
