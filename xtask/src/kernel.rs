//! `cargo xtask kernel`: applies the series in `linux/patches/` to the pristine tree,
//! configures it from `linux/p2pbuf.config`, and builds bzImage and modules (incrementally),
//! with the cache's Clang/LLVM (`make LLVM=<dir>/`, see [`Ctx::kernel_toolchain`]).

use crate::util::{hash_files, heading, output, run_step, Ctx, Stamp};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The branch xtask builds: `p2pbuf-base` plus `linux/patches/*.patch`.
const SERIES_BRANCH: &str = "xtask-series";

pub struct KernelOpts {
    /// Build the tree as it is (a developer's branch), without applying the series.
    pub keep_tree: bool,
}

pub fn series_files(ctx: &Ctx) -> Result<Vec<PathBuf>> {
    let dir = ctx.root.join("linux/patches");
    let mut v: Vec<PathBuf> = match fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|e| e == "patch")
                    && !p.ends_with("0000-cover-letter.patch")
            })
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    Ok(v)
}

fn git(ctx: &Ctx) -> Result<Command> {
    let mut c = Command::new("git");
    c.current_dir(ctx.ksrc()?).args([
        "-c",
        "user.name=p2pbuf xtask",
        "-c",
        "user.email=xtask@p2pbuf.invalid",
        "-c",
        "core.hooksPath=/dev/null",
    ]);
    Ok(c)
}

/// Puts the tree at `p2pbuf-base` + the series, touching only files that differ (so the
/// build stays incremental). Local changes are stashed, never dropped.
pub fn apply_series(ctx: &Ctx) -> Result<()> {
    let files = series_files(ctx)?;
    let hash = hash_files(&files, &[])?;
    let stamp = Stamp(ctx.cache.join("build/series.sha256"));
    let head_tree = output(git(ctx)?.args(["rev-parse", "HEAD^{tree}"]))?;
    let dirty = !output(git(ctx)?.args(["status", "--porcelain"]))?
        .trim()
        .is_empty();
    let tree_stamp = Stamp(ctx.cache.join("build/series.tree"));
    if stamp.fresh(&hash) && tree_stamp.fresh(head_tree.trim()) && !dirty {
        println!("    series: {} patches, already applied", files.len());
        return Ok(());
    }
    if dirty {
        output(git(ctx)?.args([
            "stash",
            "push",
            "--include-untracked",
            "-m",
            "saved by cargo xtask kernel before applying the series",
        ]))?;
        println!("    the kernel tree had local changes: saved with `git stash` (see `git -C {} stash list`)", ctx.ksrc()?.display());
    }
    stamp.clear();
    // A `git am` that an earlier run left half done would block the checkout.
    let _ = output(git(ctx)?.args(["am", "--abort"]));
    output(git(ctx)?.args(["checkout", "-q", "-f", "-B", SERIES_BRANCH, "p2pbuf-base"]))?;
    if !files.is_empty() {
        let mut am = git(ctx)?;
        am.args(["am", "-q", "--keep-cr"]).args(&files);
        if let Err(e) = run_step(
            ctx,
            &format!("git am {} patches", files.len()),
            "kernel-series",
            &mut am,
        ) {
            let _ = output(git(ctx)?.args(["am", "--abort"]));
            return Err(
                e.context("the series in linux/patches does not apply to the pristine tree")
            );
        }
    }
    let tree = output(git(ctx)?.args(["rev-parse", "HEAD^{tree}"]))?;
    tree_stamp.set(tree.trim())?;
    stamp.set(&hash)?;
    println!("    series: {} patches applied on p2pbuf-base", files.len());
    Ok(())
}

/// Parses `CONFIG_X=y` / `# CONFIG_X is not set` lines into (symbol, value) pairs.
pub fn parse_config(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            if let Some(rest) = l
                .strip_prefix("# ")
                .and_then(|r| r.strip_suffix(" is not set"))
            {
                return rest
                    .starts_with("CONFIG_")
                    .then(|| (rest.to_string(), "n".to_string()));
            }
            let (k, v) = l.split_once('=')?;
            k.starts_with("CONFIG_")
                .then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// The fragment's `=y`/`=m` and `=n` requests that the final `.config` does not honour.
pub fn config_mismatches(fragment: &str, config: &str) -> Vec<String> {
    let have: std::collections::HashMap<String, String> =
        parse_config(config).into_iter().collect();
    parse_config(fragment)
        .into_iter()
        .filter(|(k, v)| {
            let got = have.get(k).map(String::as_str).unwrap_or("n");
            match v.as_str() {
                "y" | "m" | "n" => got != v,
                _ => false,
            }
        })
        .map(|(k, v)| {
            format!(
                "{k}={v} (got {})",
                have.get(&k).map(String::as_str).unwrap_or("n")
            )
        })
        .collect()
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
    let fragment = ctx.root.join("linux/p2pbuf.config");
    let ksrc = ctx.ksrc()?;
    // The toolchain is part of the configuration (CC_IS_CLANG, CLANG_VERSION, what KASAN and
    // Rust may select): another one reconfigures from scratch.
    let hash = hash_files(
        &[fragment.clone(), ksrc.join("Makefile")],
        &[&ctx.llvm_id()?],
    )?;
    let stamp = Stamp(ctx.kbuild().join(".p2pbuf-config.sha256"));
    let dotconfig = ctx.kbuild().join(".config");
    if stamp.fresh(&hash) && dotconfig.exists() {
        println!("    config: up to date");
        return Ok(());
    }
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
        "merge linux/p2pbuf.config",
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
            "linux/p2pbuf.config asks for options that Kconfig dropped (a missing dependency?): {}",
            bad.join(", ")
        );
    }
    stamp.set(&hash)?;
    Ok(())
}

pub fn kernel(ctx: &Ctx, opts: &KernelOpts) -> Result<()> {
    heading("kernel: Linux 7.2 + the p2pbuf series");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_config_lines() {
        let c = parse_config("CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=\"x\"\n# comment\n");
        assert_eq!(
            c,
            vec![
                ("CONFIG_A".into(), "y".into()),
                ("CONFIG_B".into(), "n".into()),
                ("CONFIG_C".into(), "\"x\"".into())
            ]
        );
    }

    #[test]
    fn finds_dropped_options() {
        let frag = "CONFIG_A=y\nCONFIG_B=y\nCONFIG_C=n\n# CONFIG_D is not set\nCONFIG_N=16\n";
        let conf = "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=y\nCONFIG_N=8\n";
        assert_eq!(
            config_mismatches(frag, conf),
            vec!["CONFIG_B=y (got n)", "CONFIG_C=n (got y)"]
        );
    }
}
