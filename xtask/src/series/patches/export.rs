//! `--update-from BRANCH`: a kernel-tree branch exported back into the series.

use crate::mail::{self, Ident};
use crate::series::{self, Series};
use crate::util::{output, Ctx};
use anyhow::{bail, Context, Result};
use std::fs;

use super::{git, stored_subject, BASE};

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
///
/// Over 100 lines for now: one pass over the branch's commits (read, split into the series,
/// write each series' files) on the patch path that the b4 migration of issue 30, item 5,
/// reworks; restructured then rather than twice.
pub(super) fn export(ctx: &Ctx, all: &[Series], branch: &str, me: &Ident) -> Result<()> {
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
