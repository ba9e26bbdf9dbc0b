//! rdma-core for the VM: Debian's source (pinned), with the provider patches of
//! `linux/rdma-core/` applied, built with cmake/ninja and installed into a staging root that
//! `initramfs` copies into the guest.

use crate::util::{hash_files, heading, run_step, Ctx, Stamp};
use anyhow::{Context, Result};
use std::fs;
use std::path::PathBuf;
use std::process::Command;

pub const RDMA_CORE_VERSION: &str = "65.0";

pub fn staging(ctx: &Ctx) -> PathBuf {
    ctx.cache.join("build/rdma-root")
}

fn patch_files(ctx: &Ctx) -> Result<Vec<PathBuf>> {
    let dir = ctx.root.join("linux/rdma-core");
    let mut v: Vec<PathBuf> = match fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "patch"))
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    Ok(v)
}

fn tarball(ctx: &Ctx) -> Result<PathBuf> {
    crate::setup::debian_orig_tarball(
        ctx,
        "rdma-core",
        &format!("{RDMA_CORE_VERSION}-1.1"),
        &format!("rdma-core_{RDMA_CORE_VERSION}.orig.tar.gz"),
    )
}

pub fn rdma_core(ctx: &Ctx) -> Result<()> {
    heading(&format!(
        "rdma-core {RDMA_CORE_VERSION} + linux/rdma-core patches"
    ));
    let patches = patch_files(ctx)?;
    let hash = hash_files(&patches, &[RDMA_CORE_VERSION])?;
    let stamp = Stamp(ctx.cache.join("build/rdma-core.sha256"));
    let root = staging(ctx);
    if stamp.fresh(&hash) && root.join("usr/bin/ibv_devinfo").exists() {
        println!("    rdma-core: up to date ({} patches)", patches.len());
        return Ok(());
    }
    let tb = tarball(ctx)?;
    let src = ctx.cache.join("build/rdma-core-src");
    let bld = ctx.cache.join("build/rdma-core");
    let _ = fs::remove_dir_all(&src);
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&src)?;
    run_step(
        ctx,
        "unpack rdma-core",
        "rdma-core",
        Command::new("tar")
            .arg("xzf")
            .arg(&tb)
            .arg("--strip-components=1")
            .arg("-C")
            .arg(&src),
    )?;
    for p in &patches {
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        run_step(
            ctx,
            &format!("patch rdma-core: {name}"),
            "rdma-core",
            Command::new("patch")
                .args(["-p1", "--forward", "-i"])
                .arg(p)
                .current_dir(&src),
        )
        .with_context(|| format!("{name} does not apply to rdma-core {RDMA_CORE_VERSION}"))?;
    }
    fs::create_dir_all(&bld)?;
    run_step(
        ctx,
        "cmake rdma-core",
        "rdma-core",
        Command::new("cmake")
            .current_dir(&bld)
            .args([
                "-GNinja",
                "-DNO_PYVERBS=1",
                "-DNO_MAN_PAGES=1",
                "-DENABLE_STATIC=0",
                "-DCMAKE_BUILD_TYPE=Release",
                "-DCMAKE_INSTALL_PREFIX=/usr",
                "-DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu",
                "-DCMAKE_INSTALL_SYSCONFDIR=/etc",
                "-DCMAKE_INSTALL_RUNDIR=/run",
            ])
            .arg(&src),
    )?;
    run_step(
        ctx,
        "ninja rdma-core (about 1 min)",
        "rdma-core",
        Command::new("ninja").current_dir(&bld),
    )?;
    run_step(
        ctx,
        "ninja install (staging)",
        "rdma-core",
        Command::new("ninja")
            .current_dir(&bld)
            .arg("install")
            .env("DESTDIR", &root),
    )?;
    stamp.set(&hash)?;
    Ok(())
}
