//! `cargo xtask patches`: each series of `linux/series/` as `git format-patch` output with its
//! cover letter, signed off by the person who runs it, addressed with `get_maintainer.pl`,
//! checked as reviewers check it (checkpatch.pl --strict, kernel-doc, rustfmt), optionally
//! applied with `git am` to a pristine worktree on top of what it depends on and built at
//! every step. `--update-from` first exports a kernel-tree branch back into the series.

use crate::kernel::{apply_series, commit_patches, toolchain_reset, ToCommit};
use crate::mail::{self, Ident};
use crate::series::{self, Series};
use crate::util::{heading, output, run_step, Ctx};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub struct PatchOpts {
    pub out: PathBuf,
    /// Export from this kernel-tree branch into linux/series first (developer workflow).
    pub update_from: Option<String>,
    /// Apply to a pristine worktree and build after every patch.
    pub build_each: bool,
    /// Restrict `--build-each` to these series (their id, e.g. `4-rust-dma-buf`); empty: all.
    pub only: Vec<String>,
    /// `Name <mail>` to sign off with, instead of `git config user.name/user.email`.
    pub signoff: Option<String>,
}

const BASE: &str = "p2pbuf-base";
const COVER: &str = "0000-cover-letter.patch";

/// git in the kernel tree. No identity is forced here: whatever these commands write carries
/// the sender's identity, passed explicitly.
fn git(ctx: &Ctx) -> Result<Command> {
    let mut c = Command::new("git");
    c.current_dir(ctx.ksrc()?)
        .args(["-c", "core.hooksPath=/dev/null"]);
    Ok(c)
}

/// The sender: `--signoff`, else `git config user.name/user.email` of the p2pbuf checkout.
fn signer(ctx: &Ctx, flag: Option<&str>) -> Result<Ident> {
    let cfg = |key: &str| {
        Command::new("git")
            .current_dir(&ctx.root)
            .args(["config", "--get", key])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let me = mail::signer(
        flag,
        cfg("user.name").as_deref(),
        cfg("user.email").as_deref(),
    )?;
    if me.is_placeholder() {
        println!(
            "    \x1b[33mwarning\x1b[0m: {me} is in a domain reserved for examples (RFC 2606): \
             fine for the lab, but a sign-off that is sent must be an address you read"
        );
    }
    Ok(me)
}

/// The subject of a stored patch, as `git am` takes it (`[PATCH ...]` stripped, decoded).
fn stored_subject(ctx: &Ctx, file: &Path) -> Result<String> {
    let mail = fs::File::open(file).with_context(|| format!("cannot read {}", file.display()))?;
    let info = output(
        git(ctx)?
            .args(["mailinfo", "/dev/null", "/dev/null"])
            .stdin(mail),
    )
    .with_context(|| format!("{}: not a patch mail", file.display()))?;
    info.lines()
        .find_map(|l| l.strip_prefix("Subject: "))
        .map(str::to_string)
        .with_context(|| format!("{}: no Subject:", file.display()))
}

/// One commit of the branch that `--update-from` exports.
struct BranchCommit {
    tree: String,
    author: Ident,
    date: String,
    subject: String,
    message: String,
}

/// `--update-from BRANCH`: the commits from `p2pbuf-base` to BRANCH, split into the series
/// ([`series::split`]), written into their directories (cover letters and series.toml kept).
/// The stored patches carry no `Signed-off-by:`; an author with a made-up address (a reserved
/// domain, as the lab's old `p2pbuf developers <dev@p2pbuf.invalid>`) becomes the exporter.
fn export(ctx: &Ctx, all: &[Series], branch: &str, me: &Ident) -> Result<()> {
    let ksrc = ctx.ksrc()?;
    if output(git(ctx)?.args([
        "rev-parse",
        "--verify",
        "--quiet",
        &format!("{branch}^{{commit}}"),
    ]))
    .is_err()
    {
        bail!(
            "--update-from: no branch or commit `{branch}` in the kernel tree {}",
            ksrc.display()
        );
    }
    if output(git(ctx)?.args(["merge-base", "--is-ancestor", BASE, branch])).is_err() {
        bail!("--update-from: {branch} does not descend from {BASE}: rebase it onto {BASE} first");
    }
    let range = format!("{BASE}..{branch}");
    if !output(git(ctx)?.args(["rev-list", "--merges", &range]))?
        .trim()
        .is_empty()
    {
        bail!("--update-from: {range} has merge commits; a series is a straight line of patches");
    }
    let log = output(git(ctx)?.args([
        "log",
        "--reverse",
        "--date=raw",
        "--format=%T%x00%an%x00%ae%x00%ad%x00%s%x00%B%x1e",
        &range,
    ]))?;
    let mut commits = Vec::new();
    for rec in log.split('\x1e').map(|r| r.trim_start_matches('\n')) {
        if rec.is_empty() {
            continue;
        }
        let f: Vec<&str> = rec.splitn(6, '\0').collect();
        let [tree, name, email, date, subject, message] = f[..] else {
            bail!("unexpected `git log` output for {range}");
        };
        commits.push(BranchCommit {
            tree: tree.into(),
            author: Ident {
                name: name.into(),
                email: email.into(),
            },
            date: date.into(),
            subject: subject.into(),
            message: message.into(),
        });
    }
    let stored = all
        .iter()
        .map(|s| s.patches.iter().map(|p| stored_subject(ctx, p)).collect())
        .collect::<Result<Vec<Vec<String>>>>()?;
    let subjects: Vec<String> = commits.iter().map(|c| c.subject.clone()).collect();
    let ranges = series::split(all, &stored, &subjects).context("--update-from")?;
    // The commits again, without sign-offs and with real authors, on the same trees.
    let mut parent = output(git(ctx)?.args(["rev-parse", &format!("{BASE}^{{commit}}")]))?
        .trim()
        .to_string();
    let mut new = Vec::new();
    let mut replaced = Vec::new();
    for c in &commits {
        let author = if c.author.is_placeholder() && c.author != *me {
            replaced.push(format!("\"{}\" ({})", c.subject, c.author));
            me
        } else {
            &c.author
        };
        let mut ct = git(ctx)?;
        ct.args(["commit-tree", &c.tree, "-p", &parent])
            .env("GIT_AUTHOR_NAME", &author.name)
            .env("GIT_AUTHOR_EMAIL", &author.email)
            .env("GIT_AUTHOR_DATE", &c.date)
            .env("GIT_COMMITTER_NAME", &me.name)
            .env("GIT_COMMITTER_EMAIL", &me.email)
            .env("GIT_COMMITTER_DATE", &c.date);
        parent = mail::pipe(&mut ct, &mail::strip_signoffs(&c.message))?
            .trim()
            .to_string();
        new.push(parent.clone());
    }
    for (s, r) in all.iter().zip(&ranges) {
        for f in &s.patches {
            fs::remove_file(f).with_context(|| format!("cannot remove {}", f.display()))?;
        }
        if r.is_empty() {
            println!("    {}: no patches left", s.dir.display());
            continue;
        }
        let from = if r.start == 0 {
            BASE.to_string()
        } else {
            new[r.start - 1].clone()
        };
        output(
            git(ctx)?
                .args([
                    "format-patch",
                    "-q",
                    "--zero-commit",
                    "--no-signature",
                    "--no-signoff",
                    "--no-numbered",
                    "--no-cover-letter",
                    "--default-prefix",
                    "-o",
                ])
                .arg(&s.dir)
                .arg(format!("{from}..{}", new[r.end - 1])),
        )?;
        println!(
            "    {}: {} patch(es) from {branch}",
            s.dir.strip_prefix(&ctx.root).unwrap_or(&s.dir).display(),
            r.len()
        );
    }
    for r in &replaced {
        println!("    author of {r} replaced by {me} (a made-up address)");
    }
    Ok(())
}

/// `get_maintainer.pl` on the series' patches (read from `git format-patch --stdout`).
fn recipients(ctx: &Ctx, range: &str) -> Result<mail::Recipients> {
    let mbox = output(git(ctx)?.args(["format-patch", "--stdout", "--no-signature", range]))?;
    let ksrc = ctx.ksrc()?;
    let out = mail::pipe(
        Command::new("perl")
            .current_dir(&ksrc)
            .arg(ksrc.join("scripts/get_maintainer.pl"))
            .args(["--no-rolestats", "--no-git", "--no-git-fallback"]),
        &mbox,
    )
    .context("scripts/get_maintainer.pl")?;
    Ok(mail::parse_get_maintainer(&out))
}

/// What the checks found in one emitted patch.
#[derive(Default)]
struct PatchCheck {
    name: String,
    errors: usize,
    warnings: usize,
    /// kernel-doc warnings the patch adds to the files it touches.
    kdoc_new: usize,
    /// rustfmt: the touched `.rs` files the patch leaves unformatted (that were formatted).
    unformatted: Vec<String>,
    details: Vec<String>,
}

fn checkpatch(ksrc: &Path, f: &Path, c: &mut PatchCheck) -> Result<()> {
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
fn file_checks(ctx: &Ctx, rev: &str, tmp: &Path, c: &mut PatchCheck) -> Result<()> {
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

/// One series, emitted: where, its patch files, who gets it, what the checks found.
struct Emitted {
    id: String,
    dir: PathBuf,
    deps: Vec<PathBuf>,
    patches: Vec<PathBuf>,
    to: usize,
    cc: usize,
    checks: Vec<PatchCheck>,
}

fn patch_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "patch") && !p.ends_with(COVER))
        .collect();
    v.sort();
    Ok(v)
}

/// Emits series `i` into `out/<N>-<name>/` and checks it.
fn emit(ctx: &Ctx, all: &[Series], i: usize, me: &Ident, out: &Path) -> Result<Emitted> {
    let s = &all[i];
    if s.patches.is_empty() {
        bail!("{} has no patches", s.dir.display());
    }
    let needs = series::needs(all, i);
    let dep_files: Vec<PathBuf> = needs.iter().flat_map(|&j| all[j].patches.clone()).collect();
    let deps = ToCommit::each(&dep_files, &[]);
    let dep_commits = commit_patches(ctx, BASE, &deps, Some(me))
        .with_context(|| format!("{}: its dependencies do not apply to {BASE}", s.id()))?;
    let under = dep_commits
        .last()
        .cloned()
        .unwrap_or_else(|| BASE.to_string());
    let trailers = mail::emit_trailers(s.meta.stable, me);
    let own = ToCommit::each(&s.patches, &trailers);
    let commits = commit_patches(ctx, &under, &own, Some(me)).with_context(|| {
        format!(
            "{} does not apply to {BASE}{}",
            s.id(),
            if needs.is_empty() {
                String::new()
            } else {
                format!(
                    " + {}",
                    needs
                        .iter()
                        .map(|&j| all[j].id())
                        .collect::<Vec<_>>()
                        .join(" + ")
                )
            }
        )
    })?;
    let tip = commits.last().context("no commits")?;
    let range = format!("{under}..{tip}");
    let rcpt = recipients(ctx, &range).with_context(|| format!("{}: get_maintainer.pl", s.id()))?;
    let dir = out.join(s.id());
    let mut fp = git(ctx)?;
    fp.args([
        "format-patch",
        "-q",
        "--cover-letter",
        "--zero-commit",
        "--no-signature",
        "--no-signoff",
        "--numbered",
        "--default-prefix",
    ])
    .arg(format!("--base={BASE}"))
    .arg(format!("--from={me}"))
    .arg(format!("--subject-prefix={}", s.prefix()));
    for t in &rcpt.to {
        fp.arg(format!("--to={t}"));
    }
    for c in &rcpt.cc {
        fp.arg(format!("--cc={c}"));
    }
    output(fp.arg("-o").arg(&dir).arg(&range))?;
    let cover_src = s.dir.join("cover-letter.txt");
    let (subject, body) = series::parse_cover(
        &fs::read_to_string(&cover_src)
            .with_context(|| format!("cannot read {}", cover_src.display()))?,
    )
    .with_context(|| format!("{}", cover_src.display()))?;
    let cover = dir.join(COVER);
    let text = fs::read_to_string(&cover)?
        .replace("*** SUBJECT HERE ***", &subject)
        .replace("*** BLURB HERE ***", &body);
    fs::write(&cover, text)?;
    let patches = patch_files(&dir)?;
    if patches.len() != commits.len() {
        bail!(
            "{}: git format-patch wrote {} patches for {} commits",
            s.id(),
            patches.len(),
            commits.len()
        );
    }
    let ksrc = ctx.ksrc()?;
    let tmp = out.join(format!(".check-{}", s.id()));
    let mut checks = Vec::new();
    for (f, c) in patches.iter().zip(&commits) {
        let mut pc = PatchCheck {
            name: crate::util::file_name(f),
            ..PatchCheck::default()
        };
        checkpatch(&ksrc, f, &mut pc)?;
        let _ = fs::remove_dir_all(&tmp);
        file_checks(ctx, c, &tmp, &mut pc)?;
        checks.push(pc);
    }
    let _ = fs::remove_dir_all(&tmp);
    let authors = output(git(ctx)?.args(["log", "--format=%an <%ae>", &range]))?;
    let mut others: Vec<&str> = authors.lines().filter(|a| *a != me.to_string()).collect();
    others.sort_unstable();
    others.dedup();
    for a in others {
        println!(
            "    \x1b[33mwarning\x1b[0m: {}: patches by {a} go out with an in-body From: and \
             need {a}'s own Signed-off-by before they are sent",
            s.id()
        );
    }
    Ok(Emitted {
        id: s.id(),
        dir,
        deps: needs
            .iter()
            .map(|&j| out.join(all[j].id()))
            .flat_map(|d| patch_files(&d).unwrap_or_default())
            .collect(),
        patches,
        to: rcpt.to.len(),
        cc: rcpt.cc.len(),
        checks,
    })
}

/// `cache_lock` is the cache's lock that `main` holds for this run: `--build-each` gives it up
/// once it only uses its private worktree and build directory.
pub fn patches(ctx: &Ctx, o: &PatchOpts, cache_lock: Option<fs::File>) -> Result<()> {
    heading("patches: the kernel series, one per tree");
    let me = signer(ctx, o.signoff.as_deref())?;
    println!("    signed off by: {me}");
    let mut all = series::load(&ctx.root)?;
    if let Some(bad) = o.only.iter().find(|id| !all.iter().any(|s| &s.id() == *id)) {
        bail!(
            "--only {bad}: no such series (there are: {})",
            all.iter().map(Series::id).collect::<Vec<_>>().join(", ")
        );
    }
    if let Some(branch) = &o.update_from {
        export(ctx, &all, branch, &me)?;
        all = series::load(&ctx.root)?;
    }
    // The lab tree (all series, in order) is also where get_maintainer.pl reads MAINTAINERS.
    apply_series(ctx)?;
    let _ = fs::remove_dir_all(&o.out);
    fs::create_dir_all(&o.out)?;
    let mut emitted = Vec::new();
    for i in 0..all.len() {
        emitted.push(emit(ctx, &all, i, &me, &o.out)?);
    }
    println!();
    println!(
        "    {:<18} {:>7} {:>14} {:>15} {:>8} {:>4} {:>4}",
        "series", "patches", "checkpatch E/W", "kernel-doc new", "rustfmt", "To", "Cc"
    );
    let mut failures = Vec::new();
    for e in &emitted {
        let sum = |f: fn(&PatchCheck) -> usize| e.checks.iter().map(f).sum::<usize>();
        let unformatted = sum(|c| c.unformatted.len());
        println!(
            "    {:<18} {:>7} {:>14} {:>15} {:>8} {:>4} {:>4}",
            e.id,
            e.patches.len(),
            format!("{}/{}", sum(|c| c.errors), sum(|c| c.warnings)),
            sum(|c| c.kdoc_new),
            if unformatted == 0 {
                "clean".to_string()
            } else {
                format!("{unformatted} file(s)")
            },
            e.to,
            e.cc
        );
        for c in &e.checks {
            for d in &c.details {
                println!("        {}/{}: {d}", e.id, c.name);
            }
            let mut why = Vec::new();
            if c.errors > 0 {
                why.push(format!("{} checkpatch error(s)", c.errors));
            }
            if c.kdoc_new > 0 {
                why.push(format!("{} new kernel-doc warning(s)", c.kdoc_new));
            }
            if !c.unformatted.is_empty() {
                why.push(format!("rustfmt: {}", c.unformatted.join(", ")));
            }
            if !why.is_empty() {
                failures.push(format!("{}/{}: {}", e.id, c.name, why.join("; ")));
            }
        }
    }
    println!();
    for e in &emitted {
        println!(
            "    send: git send-email {}/*.patch",
            e.dir.strip_prefix(&ctx.root).unwrap_or(&e.dir).display()
        );
    }
    if o.build_each {
        let chosen: Vec<&Emitted> = emitted
            .iter()
            .filter(|e| o.only.is_empty() || o.only.contains(&e.id))
            .collect();
        build_each(ctx, &chosen, cache_lock)?;
    }
    let n: usize = emitted.iter().map(|e| e.patches.len()).sum();
    println!(
        "    series: {} ({} series, {n} patches, a cover letter each)",
        o.out.display(),
        emitted.len()
    );
    if !failures.is_empty() {
        bail!(
            "the reviewers' checks fail on {} patch(es):\n  {}",
            failures.len(),
            failures.join("\n  ")
        );
    }
    Ok(())
}

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
fn build_each(ctx: &Ctx, series: &[&Emitted], cache_lock: Option<fs::File>) -> Result<()> {
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
