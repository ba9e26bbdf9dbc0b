//! `cargo xtask patches`: the kernel series as `git format-patch` output with a cover letter,
//! checked with checkpatch.pl --strict, optionally applied with `git am` to a pristine
//! worktree and built at every step.

use crate::kernel::{apply_series, series_files, toolchain_reset};
use crate::util::{heading, output, run_step, Ctx};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

pub struct PatchOpts {
    pub out: PathBuf,
    /// Export from this kernel-tree branch into linux/patches first (developer workflow).
    pub update_from: Option<String>,
    /// Apply to a pristine worktree and build after every patch.
    pub build_each: bool,
}

fn git(ctx: &Ctx) -> Result<Command> {
    let mut c = Command::new("git");
    c.current_dir(ctx.ksrc()?).args([
        "-c",
        "user.name=p2pbuf xtask",
        "-c",
        "user.email=xtask@p2pbuf.invalid",
    ]);
    Ok(c)
}

/// `cache_lock` is the cache's lock that `main` holds for this run: `--build-each` gives it up
/// once it only uses its private worktree and build directory.
pub fn patches(ctx: &Ctx, o: &PatchOpts, cache_lock: Option<fs::File>) -> Result<()> {
    heading("patches: the kernel series");
    if let Some(branch) = &o.update_from {
        let dir = ctx.root.join("linux/patches");
        for f in series_files(ctx)? {
            fs::remove_file(f)?;
        }
        output(
            git(ctx)?
                .args([
                    "format-patch",
                    "-q",
                    "--zero-commit",
                    "--no-signature",
                    "-o",
                ])
                .arg(&dir)
                .arg(format!("p2pbuf-base..{branch}")),
        )?;
        println!("    linux/patches: exported from branch {branch}");
    }
    apply_series(ctx)?;
    let n = series_files(ctx)?.len();
    if n == 0 {
        bail!("linux/patches is empty");
    }
    let _ = fs::remove_dir_all(&o.out);
    fs::create_dir_all(&o.out)?;
    output(
        git(ctx)?
            .args([
                "format-patch",
                "-q",
                "--cover-letter",
                "--zero-commit",
                "--no-signature",
                "--base=p2pbuf-base",
                "-o",
            ])
            .arg(&o.out)
            .arg("p2pbuf-base..HEAD"),
    )?;
    // The cover letter's text lives in linux/cover-letter.txt: first line subject, then body.
    let cover_src = fs::read_to_string(ctx.root.join("linux/cover-letter.txt"))
        .context("linux/cover-letter.txt")?;
    let (subject, body) = cover_src.split_once('\n').unwrap_or((&cover_src, ""));
    let cover = o.out.join("0000-cover-letter.patch");
    let text = fs::read_to_string(&cover)?
        .replace("*** SUBJECT HERE ***", subject.trim())
        .replace("*** BLURB HERE ***", body.trim());
    fs::write(&cover, text)?;
    let mut files: Vec<PathBuf> = fs::read_dir(&o.out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let ksrc = ctx.ksrc()?;
    let mut bad = 0;
    for f in files
        .iter()
        .filter(|f| !f.ends_with("0000-cover-letter.patch"))
    {
        let out = Command::new(ksrc.join("scripts/checkpatch.pl"))
            .current_dir(&ksrc)
            .args([
                "--strict",
                "--no-tree",
                "--terse",
                "--ignore",
                "FILE_PATH_CHANGES",
            ])
            .arg(f)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let errors = text.lines().filter(|l| l.contains("ERROR:")).count();
        let warnings = text
            .lines()
            .filter(|l| l.contains("WARNING:") || l.contains("CHECK:"))
            .count();
        println!(
            "    {}: checkpatch --strict: {errors} errors, {warnings} warnings/checks",
            f.file_name().unwrap_or_default().to_string_lossy()
        );
        for l in text
            .lines()
            .filter(|l| l.contains("ERROR:") || l.contains("WARNING:") || l.contains("CHECK:"))
        {
            println!("        {l}");
        }
        bad += errors;
    }
    if o.build_each {
        build_each(ctx, &files, cache_lock)?;
    }
    println!(
        "    series: {} ({n} patches + cover letter)",
        o.out.display()
    );
    if bad > 0 {
        bail!("checkpatch.pl --strict reports {bad} error(s)");
    }
    Ok(())
}

/// `git am` each patch onto a pristine worktree and build after each one.
///
/// The worktree (`build/series-check-tree`, detached, never the shared kernel tree) and its
/// build directory (`build/series-check`) are kept between runs. Each run resets the worktree to
/// `p2pbuf-base` with `git checkout`, which rewrites only the files that differ, so make rebuilds
/// only what the series touches: the first run is a cold build (15-20 min on 2 cores), later ones
/// take a few minutes per patch. Builds use `CLIPPY=1` (every Rust crate goes through Clippy) and
/// run at the lowest CPU priority. Each step's output is in `logs/build-each-NN.log`; its
/// compiler and Clippy warnings are counted and printed.
fn build_each(ctx: &Ctx, files: &[PathBuf], cache_lock: Option<fs::File>) -> Result<()> {
    let wt = ctx.cache.join("build/series-check-tree");
    let kb = ctx.cache.join("build/series-check");
    let in_wt = || {
        let mut c = Command::new("git");
        c.current_dir(&wt).args([
            "-c",
            "user.name=p2pbuf xtask",
            "-c",
            "user.email=xtask@p2pbuf.invalid",
        ]);
        c
    };
    if wt.join(".git").exists() {
        // Left over from an interrupted run: an `am` in progress, local changes.
        let _ = in_wt().args(["am", "--abort"]).output();
        output(in_wt().args(["checkout", "-q", "-f", "--detach", "p2pbuf-base"]))?;
        output(in_wt().args(["clean", "-fdq"]))?;
        println!("    worktree {}: reset to p2pbuf-base", wt.display());
    } else {
        let _ = output(git(ctx)?.args(["worktree", "prune"]));
        output(
            git(ctx)?
                .args(["worktree", "add", "--detach", "-f"])
                .arg(&wt)
                .arg("p2pbuf-base"),
        )?;
        println!(
            "    worktree {}: created (the first build is cold)",
            wt.display()
        );
    }
    fs::create_dir_all(&kb)?;
    toolchain_reset(ctx, &wt, &kb, "patches")?;
    // Copy the configuration only when it changed: a new .config makes Kconfig regenerate its
    // headers, and make rebuild whatever depends on them.
    let config = fs::read(ctx.kbuild().join(".config"))
        .context("no kernel configuration yet: run `cargo xtask kernel` first")?;
    if fs::read(kb.join(".config")).ok().as_deref() != Some(config.as_slice()) {
        fs::write(kb.join(".config"), &config)?;
    }
    let patches: Vec<&PathBuf> = files
        .iter()
        .filter(|f| !f.ends_with("0000-cover-letter.patch"))
        .collect();
    let n = patches.len();
    // From here on only the private worktree and build directory are used, for many minutes:
    // let other `cargo xtask` runs (VM tests) have the cache meanwhile.
    if let Some(lock) = cache_lock {
        drop(lock);
        println!("    cache lock released: other `cargo xtask` runs may go on meanwhile");
    }
    let mut summary = Vec::new();
    for (i, f) in patches.iter().enumerate() {
        let step = i + 1;
        let name = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        run_step(
            ctx,
            &format!("[{step}/{n}] git am {name}"),
            "patches",
            in_wt().args(["am", "-q"]).arg(f),
        )?;
        let log = format!("build-each-{step:02}");
        let _ = fs::remove_file(ctx.log_path(&log));
        let mut mk = Command::new("nice");
        mk.current_dir(&wt)
            .args(["-n", "19", "make"])
            .arg(format!("O={}", kb.display()))
            .arg(format!("-j{}", ctx.jobs()));
        ctx.kernel_toolchain(&mut mk)?;
        mk.args(["CLIPPY=1", "olddefconfig", "bzImage", "modules"]);
        let start = Instant::now();
        run_step(
            ctx,
            &format!("[{step}/{n}] build after {name}"),
            &log,
            &mut mk,
        )?;
        let secs = start.elapsed().as_secs();
        let text = fs::read_to_string(ctx.log_path(&log)).unwrap_or_default();
        let warnings: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("warning:") || l.contains("warning["))
            .collect();
        println!(
            "    [{step}/{n}] {name}: builds ({secs} s, {} warning(s))",
            warnings.len()
        );
        for w in &warnings {
            println!("        {w}");
        }
        summary.push((name, secs, warnings.len()));
    }
    let total: u64 = summary.iter().map(|s| s.1).sum();
    let warned = summary.iter().filter(|s| s.2 > 0).count();
    println!(
        "    build-each: all {n} steps build ({total} s in all; {warned} step(s) with warnings)"
    );
    Ok(())
}
