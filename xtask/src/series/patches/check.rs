//! The checks of each emitted patch, as reviewers run them: checkpatch.pl --strict,
//! kernel-doc and rustfmt on the files it touches.

use crate::mail;
use crate::util::{output, Ctx};
use anyhow::{Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::git;

/// What the checks found in one emitted patch.
#[derive(Default)]
pub(super) struct PatchCheck {
    pub(super) name: String,
    pub(super) errors: usize,
    pub(super) warnings: usize,
    /// kernel-doc warnings the patch adds to the files it touches.
    pub(super) kdoc_new: usize,
    /// rustfmt: the touched `.rs` files the patch leaves unformatted (that were formatted).
    pub(super) unformatted: Vec<String>,
    pub(super) details: Vec<String>,
}

pub(super) fn checkpatch(ksrc: &Path, f: &Path, c: &mut PatchCheck) -> Result<()> {
    let out = Command::new(ksrc.join("scripts/checkpatch.pl"))
        .current_dir(ksrc)
        .args([
            "--strict",
            "--no-tree",
            "--terse",
            "--ignore",
            "FILE_PATH_CHANGES",
        ])
        .arg(f)
        .output()
        .context("cannot run scripts/checkpatch.pl")?;
    let text = String::from_utf8_lossy(&out.stdout);
    for l in text.lines() {
        if l.contains("ERROR:") {
            c.errors += 1;
        } else if l.contains("WARNING:") || l.contains("CHECK:") {
            c.warnings += 1;
        } else {
            continue;
        }
        c.details.push(format!("checkpatch: {l}"));
    }
    Ok(())
}

/// The file `path` as commit `rev` has it, written under `dir` at the same relative path;
/// `None` where `rev` has no such file.
fn file_at(ctx: &Ctx, rev: &str, path: &str, dir: &Path) -> Result<Option<PathBuf>> {
    let Ok(text) = output(git(ctx)?.args(["show", &format!("{rev}:{path}")])) else {
        return Ok(None);
    };
    let dest = dir.join(path);
    if let Some(d) = dest.parent() {
        fs::create_dir_all(d)?;
    }
    fs::write(&dest, text)?;
    Ok(Some(dest))
}

/// `scripts/kernel-doc -none -Wall` on a file under `dir` (run there, so messages name its
/// path in the tree): its warning lines.
fn kernel_doc(ksrc: &Path, dir: &Path, path: &str) -> Result<Vec<String>> {
    let out = Command::new(ksrc.join("scripts/kernel-doc"))
        .current_dir(dir)
        .args(["-none", "-Wall", path])
        .output()
        .context("cannot run scripts/kernel-doc")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text
        .lines()
        .filter(|l| mail::is_kernel_doc_warning(l))
        .map(str::to_string)
        .collect())
}

/// Whether rustfmt (the kernel's `.rustfmt.toml`) leaves the file as it is.
fn rustfmt_clean(ksrc: &Path, file: &Path) -> Result<bool> {
    let text = fs::read_to_string(file)?;
    let formatted = mail::pipe(
        Command::new("rustfmt")
            .args(["--emit", "stdout", "--edition", "2021", "--config-path"])
            .arg(ksrc.join(".rustfmt.toml")),
        &text,
    )
    .with_context(|| format!("rustfmt on {}", file.display()))?;
    Ok(formatted == text)
}

/// kernel-doc and rustfmt on the files commit `rev` touches, against its parent.
pub(super) fn file_checks(ctx: &Ctx, rev: &str, tmp: &Path, c: &mut PatchCheck) -> Result<()> {
    let ksrc = ctx.ksrc()?;
    let files = output(git(ctx)?.args([
        "diff-tree",
        "--no-commit-id",
        "--name-only",
        "-r",
        "--diff-filter=d",
        rev,
    ]))?;
    let (after, before) = (tmp.join("after"), tmp.join("before"));
    let checked = |p: &&str| [".c", ".h", ".rs"].iter().any(|e| p.ends_with(e));
    for path in files.lines().filter(checked) {
        let Some(new) = file_at(ctx, rev, path, &after)? else {
            continue;
        };
        let old = file_at(ctx, &format!("{rev}^"), path, &before)?;
        if path.ends_with(".c") || path.ends_with(".h") {
            let now = kernel_doc(&ksrc, &after, path)?;
            let was = match &old {
                Some(_) => kernel_doc(&ksrc, &before, path)?.len(),
                None => 0,
            };
            if now.len() > was {
                c.kdoc_new += now.len() - was;
                c.details
                    .extend(now.iter().map(|l| format!("kernel-doc: {l}")));
            }
        } else if path.ends_with(".rs") && !rustfmt_clean(&ksrc, &new)? {
            let was_clean = match &old {
                Some(o) => rustfmt_clean(&ksrc, o)?,
                None => true,
            };
            if was_clean {
                c.unformatted.push(path.to_string());
                c.details.push(format!("rustfmt: {path} is not formatted"));
            }
        }
    }
    Ok(())
}
