//! `cargo xtask patches`: the kernel series as `git format-patch` output with a cover letter,
//! checked with checkpatch.pl --strict, optionally applied with `git am` to a pristine
//! worktree and built at every step.

use crate::kernel::{apply_series, series_files};
use crate::util::{heading, output, run_step, Ctx};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::PathBuf;
use std::process::Command;

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

pub fn patches(ctx: &Ctx, o: &PatchOpts) -> Result<()> {
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
        build_each(ctx, &files)?;
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
fn build_each(ctx: &Ctx, files: &[PathBuf]) -> Result<()> {
    let wt = ctx.cache.join("build/series-check-tree");
    let kb = ctx.cache.join("build/series-check");
    let _ = output(git(ctx)?.args(["worktree", "remove", "--force"]).arg(&wt));
    output(
        git(ctx)?
            .args(["worktree", "add", "--detach", "-f"])
            .arg(&wt)
            .arg("p2pbuf-base"),
    )?;
    fs::create_dir_all(&kb)?;
    fs::copy(ctx.kbuild().join(".config"), kb.join(".config"))?;
    for f in files
        .iter()
        .filter(|f| !f.ends_with("0000-cover-letter.patch"))
    {
        let name = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        run_step(
            ctx,
            &format!("git am {name}"),
            "patches",
            Command::new("git")
                .current_dir(&wt)
                .args(["am", "-q"])
                .arg(f),
        )?;
        let mut mk = Command::new("make");
        mk.current_dir(&wt)
            .arg(format!("O={}", kb.display()))
            .arg(format!("-j{}", ctx.jobs()))
            .args(["W=1", "olddefconfig", "bzImage", "modules"])
            .env("PATH", ctx.path_with_tools())
            .env("LIBCLANG_PATH", ctx.libclang_dir());
        run_step(ctx, &format!("build after {name}"), "patches", &mut mk)?;
    }
    Ok(())
}
