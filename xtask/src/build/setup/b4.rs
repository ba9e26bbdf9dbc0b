//! b4, the kernel's tool for preparing and sending patch series, from PyPI into a virtual
//! environment in the cache (`tools/b4`): Debian bookworm has 0.12, and `cargo xtask patches`
//! runs `b4 prep --check` of a newer one.

use crate::util::{output, run_step, Ctx};
use anyhow::{bail, Result};
use std::fs;
use std::path::PathBuf;
use std::process::Command;

/// The b4 release `setup` installs (PyPI), exactly.
pub const B4_VERSION: &str = "0.16.0";

/// The virtual environment b4 lives in.
fn venv(ctx: &Ctx) -> PathBuf {
    ctx.cache.join("tools/b4")
}

/// The b4 program of the cache's virtual environment.
pub fn b4_bin(ctx: &Ctx) -> PathBuf {
    venv(ctx).join("bin/b4")
}

/// The version `b4 --version` printed is [`B4_VERSION`].
fn is_pinned(version_output: &str) -> bool {
    version_output.trim() == B4_VERSION
}

/// b4 [`B4_VERSION`] in `tools/b4`: nothing to do (one line) when that version answers there,
/// else a fresh virtual environment and `pip install b4==B4_VERSION` (log `setup-b4`).
pub(super) fn b4(ctx: &Ctx) -> Result<()> {
    let bin = b4_bin(ctx);
    if let Ok(v) = output(Command::new(&bin).arg("--version")) {
        if is_pinned(&v) {
            println!("    b4: {B4_VERSION} ({})", bin.display());
            return Ok(());
        }
    }
    let dir = venv(ctx);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.parent().unwrap_or(&ctx.cache))?;
    run_step(
        ctx,
        "python3 -m venv tools/b4",
        "setup-b4",
        Command::new("python3").args(["-m", "venv"]).arg(&dir),
    )?;
    run_step(
        ctx,
        &format!("pip install b4=={B4_VERSION}"),
        "setup-b4",
        Command::new(dir.join("bin/python3"))
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .arg(format!("b4=={B4_VERSION}")),
    )?;
    let v = output(Command::new(&bin).arg("--version"))?;
    if !is_pinned(&v) {
        bail!(
            "{} --version says {}, not {B4_VERSION}",
            bin.display(),
            v.trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_pinned_version_counts_as_installed() {
        assert!(is_pinned("0.16.0\n"));
        assert!(!is_pinned("0.12.4\n"));
        assert!(!is_pinned("0.16.01\n"));
        assert!(!is_pinned(""));
    }
}
