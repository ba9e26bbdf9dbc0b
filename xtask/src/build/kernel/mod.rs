//! `cargo xtask kernel`: applies the series in `linux/series/` to the pristine tree,
//! configures it from `linux/p2pbuf.config`, and builds bzImage and modules (incrementally),
//! with the cache's Clang/LLVM (`make LLVM=<dir>/`, see [`Ctx::kernel_toolchain`]).
//! The benchmark kernel (`cargo xtask bench`) is configured from the same fragment without
//! its debug block, the KCSAN kernel (`cargo xtask test --boot kcsan`) from the fragment with
//! KCSAN instead of KASAN: each a [`Variant`](config::Variant) of the fragment, generated into
//! its own build directory.

mod apply;
mod config;

use crate::util::{hash_files, heading, run_step, Ctx, Flavour, Stamp};
use anyhow::{bail, Context, Result};
use apply::series_files;
use config::{block_options, config_mismatches, variant_fragment, DEBUG_BLOCK, FRAGMENT};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use apply::{apply_series, commit_patches, ToCommit};

pub struct KernelOpts {
    /// Build the tree as it is (a developer's branch), without applying the series.
    pub keep_tree: bool,
}

/// The fragment the context's kernel is configured from, and a name for it in messages: the
/// repository's for the lab kernel; for the other flavours their [`Variant`](config::Variant)
/// of it, written to `build/<flavour>/<variant file>` (only when it changed).
fn fragment(ctx: &Ctx) -> Result<(PathBuf, String)> {
    let repo = ctx.root.join(FRAGMENT);
    let Some(v) = ctx.flavour.variant() else {
        return Ok((repo, FRAGMENT.to_string()));
    };
    let text =
        fs::read_to_string(&repo).with_context(|| format!("cannot read {}", repo.display()))?;
    let generated = variant_fragment(&text, v)
        .with_context(|| format!("{FRAGMENT}: the variant {}", v.what))?;
    let path = ctx.flavour_build().join(v.file);
    if fs::read_to_string(&path).ok().as_deref() != Some(generated.as_str()) {
        fs::create_dir_all(ctx.flavour_build())?;
        fs::write(&path, generated).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let name = format!("{FRAGMENT} {} ({})", v.what, path.display());
    Ok((path, name))
}

/// Empties a kernel build directory (`make mrproper`) that another compiler built: GCC, which
/// xtask used before it built with clang, or another Clang/LLVM. Kbuild alone would rebuild
/// most objects (their command lines changed), but this way none of the old compiler's is ever
/// linked with the new one's. The stamp in the build directory names the toolchain it is for.
pub fn toolchain_reset(ctx: &Ctx, src: &Path, kb: &Path, log: &str) -> Result<()> {
    let hash = hash_files(&[], &[&ctx.llvm_id()?])?;
    let stamp = Stamp(kb.join(".p2pbuf-toolchain.sha256"));
    if stamp.fresh(&hash) {
        return Ok(());
    }
    if kb.join(".config").exists() {
        let mut mk = Command::new("make");
        mk.current_dir(src).arg(format!("O={}", kb.display()));
        ctx.kernel_toolchain(&mut mk)?;
        mk.arg("mrproper");
        run_step(
            ctx,
            &format!(
                "make mrproper in {} (built with another compiler)",
                kb.display()
            ),
            log,
            &mut mk,
        )?;
    }
    stamp.set(&hash)
}

fn configure(ctx: &Ctx) -> Result<()> {
    let (fragment, fragment_name) = fragment(ctx)?;
    let ksrc = ctx.ksrc()?;
    // The toolchain is part of the configuration (CC_IS_CLANG, CLANG_VERSION, what KASAN and
    // Rust may select): another one reconfigures from scratch.
    let hash = hash_files(
        &[fragment.clone(), ksrc.join("Makefile")],
        &[&ctx.llvm_id()?],
    )?;
    let stamp = Stamp(ctx.kbuild().join(".p2pbuf-config.sha256"));
    let dotconfig = ctx.kbuild().join(".config");
    // The stamp alone is not proof: a configuration interrupted after `make tinyconfig` (a
    // killed run) leaves a tiny `.config` behind an older, matching stamp. So the `.config` must
    // also still honour the fragment.
    let honoured = fs::read_to_string(&dotconfig).is_ok_and(|config| {
        fs::read_to_string(&fragment).is_ok_and(|frag| config_mismatches(&frag, &config).is_empty())
    });
    if stamp.fresh(&hash) && honoured {
        println!("    config: up to date");
        return Ok(());
    }
    // Cleared first, so that an interrupted configuration is redone by the next run.
    stamp.clear();
    fs::create_dir_all(ctx.kbuild())?;
    toolchain_reset(ctx, &ksrc, &ctx.kbuild(), "kernel-config")?;
    run_step(
        ctx,
        "make rustavailable",
        "kernel-config",
        ctx.kmake()?.arg("rustavailable"),
    )
    .context("the Rust toolchain for the kernel is incomplete: run `cargo xtask setup`")?;
    run_step(
        ctx,
        "make tinyconfig",
        "kernel-config",
        ctx.kmake()?.arg("tinyconfig"),
    )?;
    run_step(
        ctx,
        "make kvm_guest.config",
        "kernel-config",
        ctx.kmake()?.arg("kvm_guest.config"),
    )?;
    run_step(
        ctx,
        &format!("merge {fragment_name}"),
        "kernel-config",
        Command::new(ksrc.join("scripts/kconfig/merge_config.sh"))
            .current_dir(&ksrc)
            .args(["-m", "-O"])
            .arg(ctx.kbuild())
            .arg(&dotconfig)
            .arg(&fragment),
    )?;
    run_step(
        ctx,
        "make olddefconfig",
        "kernel-config",
        ctx.kmake()?.arg("olddefconfig"),
    )?;
    let bad = config_mismatches(
        &fs::read_to_string(&fragment)?,
        &fs::read_to_string(&dotconfig)?,
    );
    if !bad.is_empty() {
        bail!(
            "{fragment_name} asks for options that Kconfig dropped (a missing dependency?): {}",
            bad.join(", ")
        );
    }
    stamp.set(&hash)?;
    Ok(())
}

pub fn kernel(ctx: &Ctx, opts: &KernelOpts) -> Result<()> {
    heading(&format!(
        "kernel: Linux {} + the p2pbuf series{}",
        crate::setup::KERNEL_SERIES,
        ctx.flavour.note()
    ));
    if opts.keep_tree {
        println!("    --keep-tree: building the tree as it is, series not applied");
    } else {
        apply_series(ctx)?;
    }
    configure(ctx)?;
    let j = format!("-j{}", ctx.jobs());
    run_step(
        ctx,
        "make bzImage modules (cold: 15-20 min on 2 cores)",
        "kernel-build",
        ctx.kmake()?.args([j.as_str(), "bzImage", "modules"]),
    )?;
    Ok(())
}

pub fn bzimage(ctx: &Ctx) -> PathBuf {
    ctx.kbuild().join("arch/x86/boot/bzImage")
}

/// What the context's kernel build directory holds, in one line for reports: release, tree,
/// configuration and the SHA-256 of its `.config` (first 12 hex digits).
pub fn describe(ctx: &Ctx, keep_tree: bool) -> String {
    let kb = ctx.kbuild();
    let release = fs::read_to_string(kb.join("include/config/kernel.release"))
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|_| format!("{} (release not recorded)", crate::setup::KERNEL_SERIES));
    let tree = if keep_tree {
        "the kernel tree as it was (--keep-tree)".to_string()
    } else {
        let n = series_files(ctx).map(|v| v.len()).unwrap_or(0);
        format!("the p2pbuf series ({n} patches)")
    };
    let config = match ctx.flavour {
        Flavour::Debug => format!("debug lab config ({FRAGMENT}, debug block included)"),
        Flavour::Bench => {
            let dropped = fs::read_to_string(ctx.root.join(FRAGMENT))
                .ok()
                .and_then(|t| block_options(&t, DEBUG_BLOCK).ok())
                .map(|v| v.join(", "))
                .unwrap_or_else(|| "?".into());
            format!(
                "bench config ({FRAGMENT} without its debug block: no {dropped}; \
                 with the function tracer, off unless switched on)"
            )
        }
        Flavour::Kcsan => {
            format!("KCSAN config ({FRAGMENT} with its debug block, KCSAN instead of KASAN)")
        }
    };
    // As `sha256sum .config` prints it.
    let sha: String = fs::read(kb.join(".config"))
        .map(|c| {
            Sha256::digest(c)
                .iter()
                .take(6)
                .map(|b| format!("{b:02x}"))
                .collect()
        })
        .unwrap_or_else(|_| "unknown".into());
    format!("Linux {release} + {tree}, {config}, .config sha256 {sha}")
}

#[cfg(test)]
mod tests {
    use super::config::{without_block, BENCH, BENCH_TRACING, KCSAN};
    use super::*;

    #[test]
    fn bench_kernel_builds_apart_and_says_what_it_is() {
        let cache = std::env::temp_dir().join(format!("p2pbuf-flavour-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        let debug = Ctx::new(Some(cache.clone()), false).unwrap();
        // The lab kernel keeps the paths it had before flavours (a warm cache stays warm).
        if std::env::var_os("P2PBUF_KBUILD").is_none() {
            assert_eq!(debug.kbuild(), cache.join("build/linux"));
        }
        // A flavour's modules and initramfs live under its build directory.
        let outputs_under = |c: &Ctx, dir: &str| {
            let build = cache.join(dir);
            assert_eq!(
                crate::modules::module_out(c, "p2pbuf-dma"),
                build.join("p2pbuf-dma")
            );
            let cpio = crate::initramfs::initramfs_path(c);
            assert_eq!(cpio, build.join("initramfs.cpio"));
        };
        outputs_under(&debug, "build");
        let bench = debug.with_flavour(Flavour::Bench);
        assert_eq!(bench.kbuild(), cache.join("build/bench/linux"));
        outputs_under(&bench, "build/bench");
        // The generated fragment: the repository's without its debug block.
        let (path, name) = fragment(&bench).unwrap();
        assert_eq!(path, cache.join("build/bench/bench.config"));
        assert!(name.contains("without its debug block"), "{name}");
        let repo = fs::read_to_string(bench.root.join(FRAGMENT)).unwrap();
        let generated = fs::read_to_string(&path).unwrap();
        assert_eq!(generated, variant_fragment(&repo, &BENCH).unwrap());
        assert!(generated.starts_with(&without_block(&repo, DEBUG_BLOCK).unwrap()[..40]));
        // The tracer is on, once: no `CONFIG_FTRACE=n` of the repository's left to contradict it.
        assert!(config_mismatches(&generated, &generated).is_empty());
        assert_eq!(generated.matches("CONFIG_FTRACE=").count(), 1);
        assert!(generated.ends_with(BENCH_TRACING));
        // What the results say about it.
        let kb = bench.kbuild();
        fs::create_dir_all(kb.join("include/config")).unwrap();
        fs::write(kb.join("include/config/kernel.release"), "7.3.4\n").unwrap();
        fs::write(kb.join(".config"), "CONFIG_PCI_P2PDMA=y\n").unwrap();
        let d = describe(&bench, false);
        assert!(d.starts_with("Linux 7.3.4 + the p2pbuf series ("), "{d}");
        assert!(
            d.contains("bench config (linux/p2pbuf.config without its debug block: no "),
            "{d}"
        );
        for o in block_options(&repo, DEBUG_BLOCK).unwrap() {
            assert!(d.contains(&o), "{o} missing: {d}");
        }
        // `printf 'CONFIG_PCI_P2PDMA=y\n' | sha256sum`
        assert!(d.ends_with(".config sha256 67df6ed8d708"), "{d}");
        assert!(describe(&bench, true).contains("the kernel tree as it was (--keep-tree)"));
        fs::remove_dir_all(&cache).unwrap();
    }

    #[test]
    fn kcsan_kernel_builds_apart_and_says_what_it_is() {
        let cache = std::env::temp_dir().join(format!("p2pbuf-kcsan-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        let debug = Ctx::new(Some(cache.clone()), false).unwrap();
        let kcsan = debug.flavoured(Flavour::Kcsan);
        assert_eq!(debug.flavour, Flavour::Debug);
        let build = cache.join("build/kcsan");
        assert_eq!(kcsan.kbuild(), build.join("linux"));
        assert_eq!(
            crate::modules::module_out(&kcsan, "exporter-kmod"),
            build.join("exporter-kmod")
        );
        assert_eq!(
            crate::initramfs::initramfs_path(&kcsan),
            build.join("initramfs.cpio")
        );
        let (path, name) = fragment(&kcsan).unwrap();
        assert_eq!(path, build.join("kcsan.config"));
        assert!(name.contains("with KCSAN instead of KASAN"), "{name}");
        let repo = fs::read_to_string(kcsan.root.join(FRAGMENT)).unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            variant_fragment(&repo, &KCSAN).unwrap()
        );
        let d = describe(&kcsan, false);
        assert!(
            d.contains(
                "KCSAN config (linux/p2pbuf.config with its debug block, KCSAN instead of KASAN)"
            ),
            "{d}"
        );
        fs::remove_dir_all(&cache).unwrap();
    }
}
