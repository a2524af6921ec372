//! Where the workspace's built binaries are. The test command builds them before running the tests.

use std::path::PathBuf;

use anyhow::{Context, bail};

/// The path of a workspace binary built in the same profile as the running executable.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the running executable")?;
    let mut dir = exe.parent().context("the running executable has no directory")?.to_path_buf();
    // A test binary runs from `<target>/<profile>/deps/`; the workspace's binaries are one up.
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if !path.is_file() {
        bail!("{} is not built; run `cargo build --workspace --bins` first (the test command does)", path.display());
    }
    Ok(path)
}
