//! `cargo xtask patches`: each series of `linux/series/` as `git format-patch` output with its
//! cover letter, signed off by the person who runs it, addressed with `get_maintainer.pl`,
//! checked as reviewers check it (checkpatch.pl --strict, kernel-doc, rustfmt, every new
//! public Rust item with an in-tree user: `api_users`), optionally
//! applied with `git am` to a pristine worktree on top of what it depends on and built at
//! every step. `--update-from` first exports a kernel-tree branch back into the series.

mod api_users;
mod b4;
mod build_each;
mod check;
#[cfg(test)]
mod doc_table;
mod export;
mod maintainers;
mod rdma_core;

use crate::kernel::{apply_series, commit_patches, ToCommit};
use crate::mail::{self, Ident};
use crate::series::{self, Series};
use crate::util::{heading, output, Ctx};
use anyhow::{bail, Context, Result};
use build_each::build_each;
use check::{checkpatch, file_checks, PatchCheck};
use export::export;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

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
    mail::patch_subject(&info).with_context(|| format!("{}: no Subject:", file.display()))
}

/// `get_maintainer.pl` on the series' patches (read from `git format-patch --stdout`), with
/// the lab tree's MAINTAINERS (every series applied) as the sender sends it: `mpath`, a copy
/// with the sender in the place of [`mail::SENDER_PLACEHOLDER`].
fn recipients(ctx: &Ctx, range: &str, me: &Ident, mpath: &Path) -> Result<mail::Recipients> {
    let mbox = output(git(ctx)?.args(["format-patch", "--stdout", "--no-signature", range]))?;
    let ksrc = ctx.ksrc()?;
    let maintainers = fs::read_to_string(ksrc.join("MAINTAINERS"))?;
    fs::write(mpath, mail::fill_sender(&maintainers, me))?;
    let out = mail::pipe(
        Command::new("perl")
            .current_dir(&ksrc)
            .arg(ksrc.join("scripts/get_maintainer.pl"))
            .args(["--no-rolestats", "--no-git", "--no-git-fallback", "--mpath"])
            .arg(mpath),
        &mbox,
    )
    .context("scripts/get_maintainer.pl");
    let _ = fs::remove_file(mpath);
    Ok(mail::parse_get_maintainer(&out?))
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
    /// The cover letter as b4 keeps it: subject, blank line, body.
    cover: String,
}

fn patch_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "patch") && !p.ends_with(COVER))
        .collect();
    v.sort();
    Ok(v)
}

/// Refuses emitted patch files that still have [`mail::SENDER_PLACEHOLDER`].
fn refuse_placeholder(files: &[PathBuf]) -> Result<()> {
    for f in files {
        if fs::read_to_string(f)?.contains(mail::SENDER_PLACEHOLDER) {
            bail!(
                "{} still has {} (the sender was not filled in)",
                f.display(),
                mail::SENDER_PLACEHOLDER
            );
        }
    }
    Ok(())
}

/// The commits of series `i` as its sender sends them, on `p2pbuf-base` and the series it
/// depends on: (the commit they go on, the series' commits). Each patch gets the sender's
/// sign-off, and `Cc: stable` where the series is for stable and the patch says what it fixes.
fn commit_series(ctx: &Ctx, all: &[Series], i: usize, me: &Ident) -> Result<(String, Vec<String>)> {
    let s = &all[i];
    let needs = series::needs(all, i);
    let dep_files: Vec<PathBuf> = needs.iter().flat_map(|&j| all[j].patches.clone()).collect();
    let deps = ToCommit::each(&dep_files, &[]);
    let dep_commits = commit_patches(ctx, BASE, &deps, Some(me))
        .with_context(|| format!("{}: its dependencies do not apply to {BASE}", s.id()))?;
    let under = dep_commits
        .last()
        .cloned()
        .unwrap_or_else(|| BASE.to_string());
    // `stable = true`: `Cc: stable` on each patch that says what it fixes (a `Fixes:` tag), as
    // the stable rules ask; a patch of the series without one gets only the sign-off.
    let stable = mail::emit_trailers(true, me);
    let plain = mail::emit_trailers(false, me);
    let own: Vec<ToCommit> = s
        .patches
        .iter()
        .map(|f| {
            let fixes = s.meta.stable
                && fs::read_to_string(f)
                    .map(|t| mail::has_fixes_tag(&t))
                    .unwrap_or(false);
            ToCommit {
                file: f,
                trailers: if fixes { &stable } else { &plain },
            }
        })
        .collect();
    let commits = commit_patches(ctx, &under, &own, Some(me)).with_context(|| {
        let on: Vec<String> = needs.iter().map(|&j| all[j].id()).collect();
        format!(
            "{} does not apply to {BASE}{}",
            s.id(),
            on.iter().map(|d| format!(" + {d}")).collect::<String>()
        )
    })?;
    Ok((under, commits))
}

/// `git format-patch` of `range` into `dir`, with its cover letter (`cover-letter.txt` of `s`:
/// returned as (subject, body)) and recipients.
fn format_series(
    ctx: &Ctx,
    s: &Series,
    me: &Ident,
    range: &str,
    rcpt: &mail::Recipients,
    dir: &Path,
) -> Result<(String, String)> {
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
    output(fp.arg("-o").arg(dir).arg(range))?;
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
    Ok((subject, body))
}

/// checkpatch, kernel-doc and rustfmt on each emitted patch (`patches[k]` is `commits[k]`);
/// warns about patches of other authors, who must sign them off themselves.
fn check_series(
    ctx: &Ctx,
    id: &str,
    patches: &[PathBuf],
    commits: &[String],
    range: &str,
    me: &Ident,
    out: &Path,
) -> Result<Vec<PatchCheck>> {
    let ksrc = ctx.ksrc()?;
    let tmp = out.join(format!(".check-{id}"));
    let mut checks = Vec::new();
    for (f, c) in patches.iter().zip(commits) {
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
    let authors = output(git(ctx)?.args(["log", "--format=%an <%ae>", range]))?;
    let mut others: Vec<&str> = authors.lines().filter(|a| *a != me.to_string()).collect();
    others.sort_unstable();
    others.dedup();
    for a in others {
        println!(
            "    \x1b[33mwarning\x1b[0m: {id}: patches by {a} go out with an in-body From: and \
             need {a}'s own Signed-off-by before they are sent"
        );
    }
    Ok(checks)
}

/// Emits series `i` into `out/<N>-<name>/` and checks it.
fn emit(ctx: &Ctx, all: &[Series], i: usize, me: &Ident, out: &Path) -> Result<Emitted> {
    let s = &all[i];
    if s.patches.is_empty() {
        bail!("{} has no patches", s.dir.display());
    }
    let (under, commits) = commit_series(ctx, all, i, me)?;
    let tip = commits.last().context("no commits")?;
    let range = format!("{under}..{tip}");
    let mpath = out.join(format!(".MAINTAINERS-{}", s.id()));
    let rcpt = recipients(ctx, &range, me, &mpath)
        .with_context(|| format!("{}: get_maintainer.pl", s.id()))?;
    let dir = out.join(s.id());
    let (subject, body) = format_series(ctx, s, me, &range, &rcpt, &dir)?;
    let patches = patch_files(&dir)?;
    refuse_placeholder(&patches)?;
    if patches.len() != commits.len() {
        bail!(
            "{}: git format-patch wrote {} patches for {} commits",
            s.id(),
            patches.len(),
            commits.len()
        );
    }
    let checks = check_series(ctx, &s.id(), &patches, &commits, &range, me, out)?;
    Ok(Emitted {
        id: s.id(),
        dir,
        deps: series::needs(all, i)
            .iter()
            .map(|&j| out.join(all[j].id()))
            .flat_map(|d| patch_files(&d).unwrap_or_default())
            .collect(),
        patches,
        to: rcpt.to.len(),
        cc: rcpt.cc.len(),
        checks,
        cover: format!("{subject}\n\n{body}\n"),
    })
}

/// What the API check found, in a few lines.
fn print_api(api: &api_users::Report) {
    let list = |v: &[api_users::Found]| {
        v.iter()
            .map(|f| f.item.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "    new public Rust items: {}; without an in-tree user: {} held back (unused_ok), {} \
         not",
        api.items,
        api.held.len(),
        api.unused.len()
    );
    if !api.test_only.is_empty() {
        println!("    used by KUnit tests only: {}", list(&api.test_only));
    }
    if !api.ambiguous.is_empty() {
        println!(
            "    used only through a method name other types have too (not proven): {}",
            list(&api.ambiguous)
        );
    }
    if !api.ok() {
        println!("    \x1b[33mwarning\x1b[0m: {}", api.failure().trim_end());
    }
}

/// The table of the checks, a line per series (`b4 --check` S/W/E: b4's patches without a
/// finding, warnings, errors; `-` where b4 did not run), each finding below it; returns the
/// failures: checkpatch errors, new kernel-doc warnings, unformatted Rust, b4's errors.
fn report(emitted: &[Emitted], b4: Result<&[b4::B4Check], &anyhow::Error>) -> Vec<String> {
    println!();
    println!(
        "    {:<18} {:>7} {:>14} {:>15} {:>8} {:>13} {:>4} {:>4}",
        "series",
        "patches",
        "checkpatch E/W",
        "kernel-doc new",
        "rustfmt",
        "b4 check S/W/E",
        "To",
        "Cc"
    );
    let mut failures = Vec::new();
    for (i, e) in emitted.iter().enumerate() {
        let sum = |f: fn(&PatchCheck) -> usize| e.checks.iter().map(f).sum::<usize>();
        let unformatted = sum(|c| c.unformatted.len());
        let b4 = b4.ok().and_then(|v| v.get(i));
        println!(
            "    {:<18} {:>7} {:>14} {:>15} {:>8} {:>13} {:>4} {:>4}",
            e.id,
            e.patches.len(),
            format!("{}/{}", sum(|c| c.errors), sum(|c| c.warnings)),
            sum(|c| c.kdoc_new),
            if unformatted == 0 {
                "clean".to_string()
            } else {
                format!("{unformatted} file(s)")
            },
            b4.map_or("-".to_string(), |b| format!(
                "{}/{}/{}",
                b.success, b.warnings, b.errors
            )),
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
        if let Some(b) = b4 {
            for d in &b.details {
                println!("        {}: b4: {d}", e.id);
            }
            if b.errors > 0 {
                failures.push(format!("{}: b4 prep --check: {} error(s)", e.id, b.errors));
            }
        }
    }
    failures
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
    maintainers::check(&all).context("the MAINTAINERS entries of the series")?;
    let api = api_users::check_series(&all)?;
    print_api(&api);
    // The lab tree (all series, in order) is also where get_maintainer.pl reads MAINTAINERS.
    apply_series(ctx)?;
    let _ = fs::remove_dir_all(&o.out);
    fs::create_dir_all(&o.out)?;
    let mut emitted = Vec::new();
    for i in 0..all.len() {
        emitted.push(emit(ctx, &all, i, &me, &o.out)?);
    }
    let chosen: Vec<&Emitted> = emitted.iter().collect();
    let b4 = b4::b4_checks(ctx, &chosen, &me);
    let mut failures = report(&emitted, b4.as_ref().map(Vec::as_slice));
    if let Err(e) = &b4 {
        println!("    \x1b[33mwarning\x1b[0m: b4 prep --check did not run: {e:#}");
        failures.push(format!("b4 prep --check did not run: {e:#}"));
    }
    println!();
    for e in &emitted {
        println!(
            "    send: git send-email {}/*.patch",
            e.dir.strip_prefix(&ctx.root).unwrap_or(&e.dir).display()
        );
    }
    let pr = rdma_core::emit(&ctx.root, &o.out, &me)?;
    println!(
        "    rdma-core: a pull request of {} patch(es) ({}) with its description, in {}; held \
         back in the lab: {}",
        pr.sent.len(),
        pr.sent.join(", "),
        pr.dir.strip_prefix(&ctx.root).unwrap_or(&pr.dir).display(),
        if pr.held_back.is_empty() {
            "none".to_string()
        } else {
            pr.held_back.join(", ")
        }
    );
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
            "the reviewers' checks fail ({}):\n  {}",
            failures.len(),
            failures.join("\n  ")
        );
    }
    if !api.ok() {
        bail!("every new API has an in-tree user: {}", api.failure());
    }
    Ok(())
}
