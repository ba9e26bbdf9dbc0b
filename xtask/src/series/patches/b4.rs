//! `b4 prep --check` on each emitted series, as its sender would run it: in a throwaway
//! worktree of the kernel tree, a b4 prep branch `b4/<series>` on the series' base
//! (`p2pbuf-base` and the emitted series it depends on, as `--build-each` has it), the emitted
//! patches applied with `git am`, the cover letter in b4's cover commit. b4 runs its own
//! checks (checkpatch.pl as b4 configures it: not `--strict`, in tree mode, `--mailback`);
//! xtask's own checks stay (checkpatch `--strict`, kernel-doc, rustfmt).
//!
//! The worktree (`b4-check-<kernel tree>` in the cache) and the `b4/<series>` branches are
//! removed when the checks are done, and any left by an interrupted run before they start;
//! nothing else of the kernel tree is touched (b4 keeps its settings of a prep branch in the
//! branch's section of the repository's configuration, which goes with the branch).

use super::{git, Emitted, BASE};
use crate::mail::Ident;
use crate::setup::{b4_bin, b4_ready, B4_VERSION};
use crate::util::{output, Ctx};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What `b4 prep --check` said about one series.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct B4Check {
    /// b4's summary: patches without a finding, warnings, errors.
    pub(super) success: usize,
    pub(super) warnings: usize,
    pub(super) errors: usize,
    /// Its findings, one line each (`warning: ...`, `error: ...`), after the patch they are of.
    pub(super) details: Vec<String>,
}

/// The worktree of the checks, named after the kernel tree.
fn worktree(ctx: &Ctx) -> Result<PathBuf> {
    let tree = crate::util::file_name(&ctx.ksrc()?);
    Ok(ctx.cache.join(format!("b4-check-{tree}")))
}

/// The branch b4 prepares series `id` on.
fn branch(id: &str) -> String {
    format!("b4/{id}")
}

/// `cmd` with the sender as git's `user.name`/`user.email` (b4 reads them through git, and
/// signs its cover commit with them) and without the repository's hooks, through the
/// environment: the kernel tree's configuration is left as it is.
fn as_sender<'a>(cmd: &'a mut Command, me: &Ident) -> &'a mut Command {
    let pairs = [
        ("user.name", me.name.as_str()),
        ("user.email", me.email.as_str()),
        ("core.hooksPath", "/dev/null"),
    ];
    cmd.env("GIT_CONFIG_COUNT", pairs.len().to_string());
    for (i, (k, v)) in pairs.iter().enumerate() {
        cmd.env(format!("GIT_CONFIG_KEY_{i}"), k)
            .env(format!("GIT_CONFIG_VALUE_{i}"), v);
    }
    cmd
}

/// b4's own cache (its checks' results) for a run: beside the worktree, removed with it.
fn b4_cache(wt: &Path) -> PathBuf {
    PathBuf::from(format!("{}.cache", wt.display()))
}

/// Removes the worktree, b4's cache and the `b4/<series>` branches of `series`, where they
/// exist.
fn clean(ctx: &Ctx, wt: &Path, series: &[&Emitted]) -> Result<()> {
    let _ = fs::remove_dir_all(b4_cache(wt));
    if wt.exists() {
        let _ = output(git(ctx)?.args(["worktree", "remove", "--force"]).arg(wt));
        let _ = fs::remove_dir_all(wt);
    }
    let _ = output(git(ctx)?.args(["worktree", "prune"]));
    for e in series {
        let b = branch(&e.id);
        let exists = output(git(ctx)?.args(["rev-parse", "--verify", "--quiet"]).arg(&b)).is_ok();
        if exists {
            output(git(ctx)?.args(["branch", "-D", &b]))?;
        }
    }
    Ok(())
}

/// `b4 prep --check` on each of `series`, in order. Refuses (with what to run) when the cache
/// has no b4 [`B4_VERSION`].
pub(super) fn b4_checks(ctx: &Ctx, series: &[&Emitted], me: &Ident) -> Result<Vec<B4Check>> {
    let b4 = b4_bin(ctx);
    if !b4_ready(ctx) {
        bail!(
            "no b4 {B4_VERSION} (with ply and GitPython) at {}: run `cargo xtask setup`",
            b4.display()
        );
    }
    let wt = worktree(ctx)?;
    clean(ctx, &wt, series)?;
    output(
        git(ctx)?
            .args(["worktree", "add", "-q", "--detach", "-f"])
            .arg(&wt)
            .arg(BASE),
    )
    .context("b4: the throwaway worktree")?;
    let mut v = Vec::new();
    let mut result = Ok(());
    for e in series {
        match check_one(&b4, &wt, e, me) {
            Ok(c) => v.push(c),
            Err(err) => {
                result = Err(err.context(format!("{}: b4 prep --check", e.id)));
                break;
            }
        }
    }
    clean(ctx, &wt, series)?;
    result.map(|()| v)
}

/// One series: its prep branch in the worktree `wt`, its cover letter, b4's check.
fn check_one(b4: &Path, wt: &Path, e: &Emitted, me: &Ident) -> Result<B4Check> {
    let git_wt = || {
        let mut c = Command::new("git");
        c.current_dir(wt);
        as_sender(&mut c, me);
        c
    };
    let _ = git_wt().args(["am", "--abort"]).output();
    output(git_wt().args(["checkout", "-q", "-f", "--detach", BASE]))?;
    if !e.deps.is_empty() {
        output(git_wt().args(["am", "-q"]).args(&e.deps))
            .context("its dependencies do not apply")?;
    }
    let under = output(git_wt().args(["rev-parse", "HEAD"]))?
        .trim()
        .to_string();
    output(git_wt().args(["checkout", "-q", "-b", &branch(&e.id)]))?;
    output(git_wt().args(["am", "-q"]).args(&e.patches)).context("its patches do not apply")?;
    // The environment's python3 first: checkpatch starts scripts/spdxcheck.py with it.
    let path = std::env::join_paths(b4.parent().into_iter().map(Path::to_path_buf).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))?;
    let b4_wt = |args: &[&str]| {
        let mut c = Command::new(b4);
        c.current_dir(wt)
            .args(args)
            .env("PATH", &path)
            .env("XDG_CACHE_HOME", b4_cache(wt));
        as_sender(&mut c, me);
        c
    };
    output(&mut b4_wt(&["prep", "-e", &under])).context("b4 prep -e")?;
    // b4's cover strategy: an empty commit first on the branch, its message the cover letter
    // (subject, blank line, body) and b4's tracking data. `--edit-cover` with `cp` as the
    // editor puts ours there, as an edit would.
    let cover = PathBuf::from(format!("{}.cover", wt.display()));
    fs::write(&cover, &e.cover)?;
    let editor = format!("cp {}", shell_quote(&cover));
    let edited = output(b4_wt(&["prep", "--edit-cover"]).env("GIT_EDITOR", editor));
    let _ = fs::remove_file(&cover);
    edited.context("b4 prep --edit-cover")?;
    let out = b4_wt(&["prep", "-C", "--check"]).output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("b4 prep --check failed ({}): {}", out.status, text.trim());
    }
    parse_check(&text).with_context(|| format!("b4 prep --check said:\n{text}"))
}

/// `'path'` for the shell words b4 splits `GIT_EDITOR` into.
fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// b4's verdict glyph (an ANSI-coloured `●`) at the start of `l`, and the text after it.
fn verdict(l: &str) -> Option<(&'static str, &str)> {
    let l = l.trim_start();
    for (code, what) in [
        ("\x1b[31;5m", "error"),
        ("\x1b[31m", "warning"),
        ("\x1b[32m", "ok"),
    ] {
        if let Some(rest) = l.strip_prefix(code) {
            let rest = rest.strip_prefix("\u{25cf}\x1b[0m")?;
            return Some((what, rest.trim()));
        }
    }
    None
}

/// b4's report: a line per patch (`● <commit>: <subject>`), under each patch with findings a
/// line per finding, then `Success: N, Warning: N, Error: N`.
fn parse_check(text: &str) -> Result<B4Check> {
    let mut c = B4Check::default();
    let mut patch = String::new();
    for l in text.lines() {
        if let Some(s) = l.trim().strip_prefix("Success: ") {
            let n: Vec<usize> = s
                .split(", ")
                .filter_map(|f| f.rsplit(' ').next()?.parse().ok())
                .collect();
            let [ok, w, e] = n[..] else {
                bail!("cannot read b4's summary `{}`", l.trim());
            };
            (c.success, c.warnings, c.errors) = (ok, w, e);
            return Ok(c);
        }
        let Some((what, rest)) = verdict(l) else {
            continue;
        };
        if !l.starts_with(' ') {
            patch = rest.to_string();
        } else if what != "ok" {
            c.details.push(format!("{patch}: {what}: {rest}"));
        }
    }
    bail!("no summary line (`Success: N, Warning: N, Error: N`)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `b4 prep --check` (b4 0.16.0) on series 1 as emitted on 2026-12-07, shortened.
    const CHECK: &str = "Checking patches using:\n  scripts/checkpatch.pl -q --terse --no-summary --mailback --showfile \n---\n\
\x1b[31;5m\u{25cf}\x1b[0m 114d23a0aa61: dma-buf: Map each entry\n\
\x20 \x1b[31m\u{25cf}\x1b[0m checkpatch.pl: :177: WARNING: Unknown commit id '3aa31a8bb11e', maybe rebased or not pulled?\n\
\x20 \x1b[31;5m\u{25cf}\x1b[0m checkpatch.pl: drivers/dma-buf/dma-buf-mapping.c:193: ERROR: Missing Signed-off-by: line by nominal patch author 'A <a@b.org>'\n\
\x1b[32m\u{25cf}\x1b[0m 38193fedc22b: dma-buf: Fix the leak\n\
---\nSuccess: 1, Warning: 1, Error: 1\n";

    #[test]
    fn reads_b4s_report() {
        let c = parse_check(CHECK).unwrap();
        assert_eq!((c.success, c.warnings, c.errors), (1, 1, 1));
        assert_eq!(
            c.details,
            [
                "114d23a0aa61: dma-buf: Map each entry: warning: checkpatch.pl: :177: WARNING: \
                 Unknown commit id '3aa31a8bb11e', maybe rebased or not pulled?",
                "114d23a0aa61: dma-buf: Map each entry: error: checkpatch.pl: \
                 drivers/dma-buf/dma-buf-mapping.c:193: ERROR: Missing Signed-off-by: line by \
                 nominal patch author 'A <a@b.org>'"
            ]
        );
        let clean = "---\n\x1b[32m\u{25cf}\x1b[0m 1234: x\n---\nSuccess: 1, Warning: 0, Error: 0\n";
        assert_eq!(parse_check(clean).unwrap().details.len(), 0);
        assert!(parse_check("CRITICAL: not a prep branch\n").is_err());
    }

    #[test]
    fn the_sender_reaches_git_and_b4_through_the_environment() {
        let me = crate::mail::parse_ident("Jane Doe <jane@kernel.org>").unwrap();
        let dir = std::env::temp_dir();
        let mut c = Command::new("git");
        c.current_dir(&dir);
        as_sender(&mut c, &me).args(["config", "user.name"]);
        assert_eq!(output(&mut c).unwrap().trim(), "Jane Doe");
        assert_eq!(shell_quote(Path::new("/a b/it's")), "'/a b/it'\\''s'");
    }
}
