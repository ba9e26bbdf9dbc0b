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
/// What goes into the virtual environment, each pinned: b4, and the modules of the kernel's
/// `scripts/spdxcheck.py` (ply, GitPython), which checkpatch runs in tree mode, as b4 runs it,
/// for each new file's SPDX line. `b4 prep --check` runs with the environment first on `PATH`.
const PIP_PACKAGES: &[&str] = &["b4==0.16.0", "ply==3.11", "GitPython==3.2.1"];

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

/// b4 [`B4_VERSION`] answers in the cache's environment, and spdxcheck's modules load there.
pub fn b4_ready(ctx: &Ctx) -> bool {
    let py = venv(ctx).join("bin/python3");
    output(Command::new(b4_bin(ctx)).arg("--version")).is_ok_and(|v| is_pinned(&v))
        && output(Command::new(py).args(["-c", "import ply, git"])).is_ok()
}

/// b4 [`B4_VERSION`] in `tools/b4`: nothing to do (one line) when [`b4_ready`], else a fresh
/// virtual environment and `pip install` of [`PIP_PACKAGES`] (log `setup-b4`).
pub(super) fn b4(ctx: &Ctx) -> Result<()> {
    let bin = b4_bin(ctx);
    if b4_ready(ctx) {
        println!("    b4: {B4_VERSION} ({})", bin.display());
        return Ok(());
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
        &format!("pip install {}", PIP_PACKAGES.join(" ")),
        "setup-b4",
        Command::new(dir.join("bin/python3"))
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .args(PIP_PACKAGES),
    )?;
    if !b4_ready(ctx) {
        bail!(
            "{} is not b4 {B4_VERSION} with ply and GitPython after pip install (see the log \
             setup-b4)",
            dir.display()
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
        assert!(PIP_PACKAGES.contains(&format!("b4=={B4_VERSION}").as_str()));
    }

    /// Installs b4 into a scratch cache from PyPI, then runs again, which must leave the
    /// virtual environment alone. Needs the network: `cargo test -p xtask -- --ignored b4`.
    #[test]
    #[ignore]
    fn installs_b4_once_into_a_scratch_cache() {
        let cache = std::env::temp_dir().join(format!("p2pbuf-b4-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        let ctx = Ctx::new(Some(cache.clone()), false).unwrap();
        b4(&ctx).unwrap();
        let v = output(Command::new(b4_bin(&ctx)).arg("--version")).unwrap();
        assert_eq!(v.trim(), B4_VERSION);
        let stamp = |p: PathBuf| fs::metadata(p).unwrap().modified().unwrap();
        let before = stamp(venv(&ctx).join("pyvenv.cfg"));
        b4(&ctx).unwrap();
        assert_eq!(stamp(venv(&ctx).join("pyvenv.cfg")), before);
        fs::remove_dir_all(&cache).unwrap();
    }
}
