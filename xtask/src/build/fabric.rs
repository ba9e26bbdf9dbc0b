//! libfabric for the VM: Debian's source of 2.1 (the orig tarball of `libfabric 2.1.0-1.1`,
//! checked against its SHA-256), configured against the rdma-core of `cargo xtask rdma-core`
//! so that the verbs provider is built with `ibv_reg_dmabuf_mr` (`FI_MR_DMABUF`), installed
//! into its own staging root with `fi_info` and a few fabtests; `initramfs` copies it into the
//! guest and `userspace/p2pbuf-fabric` generates its bindings from its headers.
//!
//! Only the providers the lab uses are built (`--enable-only`): verbs (rxe), rxm (RDM over
//! verbs, which fabtests' RDM tests use) and tcp (a baseline). The stamp holds the version,
//! the configure flags, the fabtests list and rdma-core's own stamp, so a rebuilt rdma-core
//! rebuilds libfabric too.

use crate::util::{heading, run_step, Ctx, Stamp};
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const LIBFABRIC_VERSION: &str = "2.1.0";
/// Debian's source package version the tarball comes from.
const DEBIAN_VERSION: &str = "2.1.0-1.1";
/// SHA-256 of `libfabric_2.1.0.orig.tar.xz`, as in the package's `.dsc` (`Checksums-Sha256`).
const TARBALL_SHA256: &str = "1a66369772d5bb151737214af1c478993e969cf298e8f9ed369e7a2ab8d8c6df";
/// fabtests programs built and put into the guest (make targets under `fabtests/`).
pub const FABTESTS: &[&str] = &[
    "benchmarks/fi_rma_bw",
    "benchmarks/fi_msg_pingpong",
    "functional/fi_msg",
];
/// libfabric's utilities the guest gets.
pub const FI_TOOLS: &[&str] = &["fi_info", "fi_strerror", "fi_pingpong"];

pub fn staging(ctx: &Ctx) -> PathBuf {
    ctx.cache.join("build/libfabric-root")
}

fn tarball(ctx: &Ctx) -> Result<PathBuf> {
    let tb = crate::setup::debian_orig_tarball(
        ctx,
        "libfabric",
        DEBIAN_VERSION,
        &format!("libfabric_{LIBFABRIC_VERSION}.orig.tar.xz"),
    )?;
    let got = sha256_hex(&fs::read(&tb).with_context(|| format!("reading {}", tb.display()))?);
    if got != TARBALL_SHA256 {
        bail!(
            "{} has SHA-256 {got}, want {TARBALL_SHA256} (Debian's libfabric {DEBIAN_VERSION}): delete it and run again",
            tb.display()
        );
    }
    Ok(tb)
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// configure's arguments for the staging root `rdma` of rdma-core.
fn configure_args(rdma: &Path) -> Vec<String> {
    let lib = rdma.join("usr/lib/x86_64-linux-gnu");
    vec![
        "--prefix=/usr".into(),
        "--libdir=/usr/lib/x86_64-linux-gnu".into(),
        "--sysconfdir=/etc".into(),
        "--disable-static".into(),
        "--enable-only".into(),
        // A directory makes the verbs provider's checks (the headers, and the
        // AC_CHECK_DECL of ibv_reg_dmabuf_mr, which runs with the provider's CPPFLAGS only)
        // look in it and not in /usr/include, where Debian 12's rdma-core 44 may be.
        format!("--enable-verbs={}", rdma.join("usr").display()),
        "--enable-rxm".into(),
        "--enable-tcp".into(),
        // The libraries are under lib/x86_64-linux-gnu, which the provider's -L (lib or
        // lib64 of the directory) misses.
        format!(
            "LDFLAGS=-L{} -Wl,-rpath-link,{}",
            lib.display(),
            lib.display()
        ),
    ]
}

/// What configure decided about dma-buf MRs in the verbs provider: `Ok(line)` when
/// `VERBS_HAVE_DMABUF_MR` is 1 and the check used the staging root's headers.
pub fn dmabuf_detected(config_h: &str, config_log: &str, rdma: &Path) -> Result<String> {
    if !config_h
        .lines()
        .any(|l| l.trim() == "#define VERBS_HAVE_DMABUF_MR 1")
    {
        bail!(
            "libfabric's configure did not find ibv_reg_dmabuf_mr in rdma-core's verbs.h (config.h lacks `#define VERBS_HAVE_DMABUF_MR 1`): the verbs provider would refuse FI_MR_DMABUF with ENOSYS; see config.log"
        );
    }
    let inc = format!("-I{}", rdma.join("usr/include").display());
    let cppflags = config_log
        .lines()
        .find(|l| l.starts_with("verbs_ibverbs_CPPFLAGS="))
        .unwrap_or("");
    if !cppflags.contains(&inc) {
        bail!(
            "libfabric's verbs checks did not use the project's rdma-core ({cppflags:?} lacks {inc}): VERBS_HAVE_DMABUF_MR may come from the system's headers"
        );
    }
    Ok(format!(
        "ibv_reg_dmabuf_mr detected in {}/infiniband/verbs.h (VERBS_HAVE_DMABUF_MR 1)",
        rdma.join("usr/include").display()
    ))
}

// Over 100 lines on purpose: one sequence of logged steps (the stamp check, unpack, autogen,
// configure, the checks of config.h, make, install, fabtests), each a few lines, sharing the
// source and staging paths; read top to bottom, it is the order of the build.
pub fn libfabric(ctx: &Ctx) -> Result<()> {
    heading(&format!(
        "libfabric {LIBFABRIC_VERSION} (verbs with dma-buf MRs, rxm, tcp) + fabtests"
    ));
    let rdma = crate::rdma_core::staging(ctx);
    let rdma_stamp = fs::read_to_string(ctx.cache.join("build/rdma-core.sha256"))
        .context("rdma-core is not built: run `cargo xtask rdma-core`")?;
    let args = configure_args(&rdma);
    let mut h = Sha256::new();
    for s in [LIBFABRIC_VERSION, TARBALL_SHA256, rdma_stamp.trim()]
        .into_iter()
        .chain(args.iter().map(String::as_str))
        .chain(FABTESTS.iter().copied())
    {
        h.update(s.as_bytes());
        h.update([0]);
    }
    let hash: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let stamp = Stamp(ctx.cache.join("build/libfabric.sha256"));
    let root = staging(ctx);
    let built = root.join("usr/bin/fi_info").exists()
        && FABTESTS
            .iter()
            .all(|t| root.join("usr/bin").join(fabtest_name(t)).exists());
    if stamp.fresh(&hash) && built {
        println!("    libfabric: up to date");
        return Ok(());
    }
    stamp.clear();
    let tb = tarball(ctx)?;
    let src = ctx.cache.join("build/libfabric-src");
    let _ = fs::remove_dir_all(&src);
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&src)?;
    run_step(
        ctx,
        "unpack libfabric",
        "libfabric",
        Command::new("tar")
            .arg("xJf")
            .arg(&tb)
            .arg("--strip-components=1")
            .arg("-C")
            .arg(&src),
    )?;
    // Debian's orig tarball is a git snapshot: no configure script.
    run_step(
        ctx,
        "libfabric: autogen.sh",
        "libfabric",
        Command::new("./autogen.sh").current_dir(&src),
    )?;
    run_step(
        ctx,
        "libfabric: configure",
        "libfabric",
        Command::new("./configure").args(&args).current_dir(&src),
    )?;
    let config_h = fs::read_to_string(src.join("config.h"))?;
    let config_log = fs::read_to_string(src.join("config.log"))?;
    println!(
        "    verbs provider: {}",
        dmabuf_detected(&config_h, &config_log, &rdma)?
    );
    let jobs = format!(
        "-j{}",
        std::thread::available_parallelism().map_or(2, |n| n.get())
    );
    run_step(
        ctx,
        "libfabric: make (about 15 s)",
        "libfabric",
        Command::new("make").arg(&jobs).current_dir(&src),
    )?;
    run_step(
        ctx,
        "libfabric: make install (staging)",
        "libfabric",
        Command::new("make")
            .arg("install")
            .arg(format!("DESTDIR={}", root.display()))
            .current_dir(&src),
    )?;
    // fabtests, against the staged libfabric.
    let ft = src.join("fabtests");
    let lf_lib = root.join("usr/lib/x86_64-linux-gnu");
    let rdma_lib = rdma.join("usr/lib/x86_64-linux-gnu");
    run_step(
        ctx,
        "fabtests: autogen.sh",
        "libfabric",
        Command::new("./autogen.sh").current_dir(&ft),
    )?;
    run_step(
        ctx,
        "fabtests: configure",
        "libfabric",
        Command::new("./configure")
            .arg("--prefix=/usr")
            .arg(format!("--with-libfabric={}", root.join("usr").display()))
            .arg(format!(
                "LDFLAGS=-L{} -Wl,-rpath-link,{}:{}",
                lf_lib.display(),
                lf_lib.display(),
                rdma_lib.display()
            ))
            .current_dir(&ft),
    )?;
    run_step(
        ctx,
        &format!("fabtests: make {}", FABTESTS.join(" ")),
        "libfabric",
        Command::new("make")
            .arg(&jobs)
            .args(FABTESTS)
            .current_dir(&ft),
    )?;
    for t in FABTESTS {
        // libtool leaves the real program in .libs/ when it links a shared libfabric.
        let (dir, name) = t.rsplit_once('/').unwrap_or(("", t));
        let real = [ft.join(dir).join(".libs").join(name), ft.join(t)]
            .into_iter()
            .find(|p| p.exists())
            .with_context(|| format!("fabtests: {t} was not built"))?;
        fs::copy(&real, root.join("usr/bin").join(name))
            .with_context(|| format!("copying {}", real.display()))?;
    }
    stamp.set(&hash)?;
    Ok(())
}

fn fabtest_name(t: &str) -> &str {
    t.rsplit_once('/').map_or(t, |(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG_OK: &str = "ac_cv_have_decl_ibv_reg_dmabuf_mr=yes\nverbs_ibverbs_CPPFLAGS=' -I/c/build/rdma-root/usr/include'\n";

    #[test]
    fn dmabuf_detection_needs_the_define_and_the_staging_headers() {
        let rdma = Path::new("/c/build/rdma-root");
        let h1 = "/* x */\n#define VERBS_HAVE_DMABUF_MR 1\n";
        let h0 = "#define VERBS_HAVE_DMABUF_MR 0\n";
        let ok = dmabuf_detected(h1, LOG_OK, rdma).unwrap();
        assert!(
            ok.contains("/c/build/rdma-root/usr/include/infiniband/verbs.h"),
            "{ok}"
        );
        let e = dmabuf_detected(h0, LOG_OK, rdma).unwrap_err().to_string();
        assert!(e.contains("VERBS_HAVE_DMABUF_MR 1"), "{e}");
        // Found, but in the system's headers.
        let sys = "verbs_ibverbs_CPPFLAGS=''\n";
        let e = dmabuf_detected(h1, sys, rdma).unwrap_err().to_string();
        assert!(e.contains("did not use the project's rdma-core"), "{e}");
    }

    #[test]
    fn configure_points_verbs_at_the_staging_root() {
        let a = configure_args(Path::new("/c/r"));
        assert!(a.contains(&"--enable-verbs=/c/r/usr".to_string()));
        assert!(a.contains(&"--enable-only".to_string()));
        assert!(a
            .iter()
            .any(|s| s.starts_with("LDFLAGS=-L/c/r/usr/lib/x86_64-linux-gnu ")));
    }

    #[test]
    fn fabtest_names() {
        assert_eq!(fabtest_name("benchmarks/fi_rma_bw"), "fi_rma_bw");
        assert_eq!(fabtest_name("fi_x"), "fi_x");
    }
}
