//! `--build-each`: every series applied with `git am` to a pristine worktree on top of what it
//! depends on and built at every step (with rustdoc where the series touches Rust).

use crate::kernel::toolchain_reset;
use crate::util::{output, run_step, Ctx};
use anyhow::{Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::{git, Emitted, BASE};

/// The private worktree and build directory of `--build-each` for the kernel tree `ksrc`.
///
/// Named after the tree (`linux-7.3.4`): a worktree belongs to the repository it was added from
/// and is reset to *that* repository's `p2pbuf-base`, so one left by another kernel tree (a cache
/// moved from 7.2 to 7.3) would check the series against the wrong base.
fn check_dirs(cache: &Path, ksrc: &Path) -> (PathBuf, PathBuf) {
    let tree = ksrc
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "linux".into());
    (
        cache.join(format!("build/series-check-tree-{tree}")),
        cache.join(format!("build/series-check-{tree}")),
    )
}

/// For each series, `git am` what it depends on, then each of its patches onto a pristine
/// worktree, building after each of its own.
///
/// The worktree (`build/series-check-tree-<kernel tree>`, detached, never the shared kernel tree)
/// and its build directory (`build/series-check-<kernel tree>`) are kept between runs; see
/// [`check_dirs`]. Each series starts from the
/// worktree reset to `p2pbuf-base` with `git checkout`, which rewrites only the files that
/// differ, so make rebuilds only what the series touch: the first run is a cold build (15-20
/// min on 2 cores), later ones take a few minutes per patch. Builds use `CLIPPY=1` (every Rust
/// crate goes through Clippy; `W=1` on the whole tree would make each step's count mostly
/// upstream's, see docs/abstractions.md for the W=1 check) and run at the lowest CPU priority. Each step's
/// output is in `logs/build-each-<series>-NN.log`; its compiler and Clippy warnings are counted
/// and printed. A series that touches `rust/` ends with `make rustdoc` on its last step
/// ([`rustdoc`], `logs/build-each-<series>-rustdoc.log`), counted as one more step.
///
/// Over 100 lines on purpose: one loop over the series whose state (the private worktree, the
/// configuration sync, the cache lock given up midway, the per-series warning totals) every
/// step uses; split, each piece would take all of it.
pub(super) fn build_each(
    ctx: &Ctx,
    series: &[&Emitted],
    cache_lock: Option<fs::File>,
) -> Result<()> {
    let (wt, kb) = check_dirs(&ctx.cache, &ctx.ksrc()?);
    // The worktree is private: what its `git am` commits never leaves it.
    let in_wt = || crate::util::xtask_git(&wt);
    if !wt.join(".git").exists() {
        let _ = output(git(ctx)?.args(["worktree", "prune"]));
        output(
            git(ctx)?
                .args(["worktree", "add", "--detach", "-f"])
                .arg(&wt)
                .arg(BASE),
        )?;
        println!(
            "    worktree {}: created (the first build is cold)",
            wt.display()
        );
    }
    fs::create_dir_all(&kb)?;
    toolchain_reset(ctx, &wt, &kb, "patches")?;
    // The lab's configuration, copied before every step, and only when it differs: a new
    // .config makes Kconfig regenerate its headers, and make rebuild what depends on the
    // symbols that changed. Before every step, because `olddefconfig` drops the symbols that
    // the tree does not have yet: a patch that adds a Kconfig option (the sample driver of
    // 4-rust-dma-buf) would otherwise be built with its option off, that is not at all.
    let config = fs::read(ctx.kbuild().join(".config"))
        .context("no kernel configuration yet: run `cargo xtask kernel` first")?;
    let sync_config = || -> Result<()> {
        if fs::read(kb.join(".config")).ok().as_deref() != Some(config.as_slice()) {
            fs::write(kb.join(".config"), &config)?;
        }
        Ok(())
    };
    // From here on only the private worktree and build directory are used, for many minutes:
    // let other `cargo xtask` runs (VM tests) have the cache meanwhile.
    if let Some(lock) = cache_lock {
        drop(lock);
        println!("    cache lock released: other `cargo xtask` runs may go on meanwhile");
    }
    let mut summary = Vec::new();
    for s in series {
        // Left over from the series before or an interrupted run: an `am` in progress, changes.
        let _ = in_wt().args(["am", "--abort"]).output();
        output(in_wt().args(["checkout", "-q", "-f", "--detach", BASE]))?;
        output(in_wt().args(["clean", "-fdq"]))?;
        let log = format!("build-each-{}", s.id);
        if !s.deps.is_empty() {
            run_step(
                ctx,
                &format!("{}: git am its {} dependency patches", s.id, s.deps.len()),
                &log,
                in_wt().args(["am", "-q"]).args(&s.deps),
            )
            .with_context(|| format!("{}: its dependencies do not apply to {BASE}", s.id))?;
        }
        let n = s.patches.len();
        for (i, f) in s.patches.iter().enumerate() {
            let step = i + 1;
            let name = crate::util::file_name(f);
            let title = format!("{} [{step}/{n}]", s.id);
            run_step(
                ctx,
                &format!("{title} git am {name}"),
                &log,
                in_wt().args(["am", "-q"]).arg(f),
            )
            .with_context(|| format!("{}/{name} does not apply", s.id))?;
            let log = format!("build-each-{}-{step:02}", s.id);
            let _ = fs::remove_file(ctx.log_path(&log));
            sync_config()?;
            let mut mk = Command::new("nice");
            mk.current_dir(&wt)
                .args(["-n", "19", "make"])
                .arg(format!("O={}", kb.display()))
                .arg(format!("-j{}", ctx.jobs()));
            ctx.kernel_toolchain(&mut mk)?;
            mk.args(["CLIPPY=1", "olddefconfig", "bzImage", "modules"]);
            let start = Instant::now();
            run_step(ctx, &format!("{title} build after {name}"), &log, &mut mk)
                .with_context(|| format!("{}/{name} does not build", s.id))?;
            let secs = start.elapsed().as_secs();
            let text = fs::read_to_string(ctx.log_path(&log)).unwrap_or_default();
            let warnings: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("warning:") || l.contains("warning["))
                .collect();
            println!(
                "    {title} {name}: builds ({secs} s, {} warning(s))",
                warnings.len()
            );
            for w in &warnings {
                println!("        {w}");
            }
            summary.push((secs, warnings.len()));
        }
        if touches_rust(&s.patches) {
            summary.push(rustdoc(ctx, &wt, &kb, &s.id)?);
        }
    }
    let total: u64 = summary.iter().map(|s| s.0).sum();
    let warned = summary.iter().filter(|s| s.1 > 0).count();
    println!(
        "    build-each: all {} steps build ({total} s in all; {warned} step(s) with warnings)",
        summary.len()
    );
    Ok(())
}

/// Whether any of `patches` changes a file under `rust/`.
fn touches_rust(patches: &[PathBuf]) -> bool {
    patches.iter().any(|p| {
        fs::read_to_string(p)
            .map(|t| patch_touches_rust(&t))
            .unwrap_or(false)
    })
}

fn patch_touches_rust(text: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with("+++ b/rust/") || l.starts_with("--- a/rust/"))
}

/// `make rustdoc` on the series' last step, as `make htmldocs` builds the Rust docs: rustdoc's
/// own warnings (broken intra-doc links, bare URLs, unescaped backticks, a missing crate doc)
/// and the kernel's check that every `srctree/` link names a file. Returns (seconds,
/// warnings) for the summary.
fn rustdoc(ctx: &Ctx, wt: &Path, kb: &Path, id: &str) -> Result<(u64, usize)> {
    let log = format!("build-each-{id}-rustdoc");
    let _ = fs::remove_file(ctx.log_path(&log));
    let mut mk = Command::new("nice");
    mk.current_dir(wt)
        .args(["-n", "19", "make"])
        .arg(format!("O={}", kb.display()))
        .arg(format!("-j{}", ctx.jobs()));
    ctx.kernel_toolchain(&mut mk)?;
    mk.arg("rustdoc");
    let start = Instant::now();
    run_step(ctx, &format!("{id}: make rustdoc"), &log, &mut mk)
        .with_context(|| format!("{id}: make rustdoc fails"))?;
    let secs = start.elapsed().as_secs();
    let text = fs::read_to_string(ctx.log_path(&log)).unwrap_or_default();
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains("warning")).collect();
    println!(
        "    {id}: make rustdoc: builds ({secs} s, {} warning(s))",
        warnings.len()
    );
    for w in &warnings {
        println!("        {w}");
    }
    Ok((secs, warnings.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustdoc_runs_for_series_that_touch_rust() {
        assert!(patch_touches_rust(
            "diff --git a/rust/kernel/dma_buf/mod.rs b/rust/kernel/dma_buf/mod.rs\n--- /dev/null\n+++ b/rust/kernel/dma_buf/mod.rs\n"
        ));
        assert!(patch_touches_rust(
            "--- a/rust/kernel/lib.rs\n+++ /dev/null\n"
        ));
        assert!(!patch_touches_rust(
            "--- a/drivers/dma-buf/udmabuf.c\n+++ b/drivers/dma-buf/udmabuf.c\n+// rust/ in a comment\n"
        ));
    }

    #[test]
    fn check_dirs_belong_to_their_kernel_tree() {
        let cache = Path::new("/c");
        let (wt73, kb73) = check_dirs(cache, Path::new("/c/linux-7.3.4"));
        assert_eq!(wt73, Path::new("/c/build/series-check-tree-linux-7.3.4"));
        assert_eq!(kb73, Path::new("/c/build/series-check-linux-7.3.4"));
        // A cache that also holds the 7.2 tree keeps that tree's worktree apart.
        let (wt72, kb72) = check_dirs(cache, Path::new("/c/linux-7.2.13"));
        assert_ne!(wt72, wt73);
        assert_ne!(kb72, kb73);
    }
}
