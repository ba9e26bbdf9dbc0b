//! Applying the series of `linux/series/` to the pristine kernel tree: each patch committed
//! as `git am` would, in a private index, onto the `xtask-series` branch.

use crate::util::{hash_files, output, Ctx, Stamp};
use crate::{mail, series};
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The branch xtask builds: `p2pbuf-base` plus every series of `linux/series/`, in order.
const SERIES_BRANCH: &str = "xtask-series";

/// Every stored patch of every series, in sending order: what the lab kernel applies.
pub fn series_files(ctx: &Ctx) -> Result<Vec<PathBuf>> {
    Ok(series::all_patches(&series::load(&ctx.root)?))
}

fn git(ctx: &Ctx) -> Result<Command> {
    Ok(crate::util::xtask_git(&ctx.ksrc()?))
}

/// A patch to commit with [`commit_patches`], and the trailers its message gets.
pub struct ToCommit<'a> {
    pub file: &'a Path,
    pub trailers: &'a [String],
}

impl<'a> ToCommit<'a> {
    /// Each of `files`, with the same `trailers` (none: `&[]`).
    pub fn each<P: AsRef<Path>>(files: &'a [P], trailers: &'a [String]) -> Vec<ToCommit<'a>> {
        files
            .iter()
            .map(|f| ToCommit {
                file: f.as_ref(),
                trailers,
            })
            .collect()
    }
}

/// Commits `patches` one after the other on top of `base` in the kernel tree, as `git am`
/// would (`git mailinfo`, `git apply`, `git commit-tree`), but in a private index: the work
/// tree, the index and the branches are left alone. The committer is `committer` (else
/// xtask's own identity, which stays in the lab tree), with the author's date, so the same
/// patches on the same base always give the same commits. `committer` is the sender of the
/// series: it also takes the place of [`mail::SENDER_PLACEHOLDER`] in the patches (the `M:`
/// of the MAINTAINERS entries they add), which the lab tree (`None`) keeps. Returns the new
/// commits, in order.
pub fn commit_patches(
    ctx: &Ctx,
    base: &str,
    patches: &[ToCommit],
    committer: Option<&mail::Ident>,
) -> Result<Vec<String>> {
    let tmp = ctx
        .cache
        .join(format!("build/commit-patches.{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    let result = commit_patches_in(ctx, base, patches, committer, &tmp);
    let _ = fs::remove_dir_all(&tmp);
    result
}

fn commit_patches_in(
    ctx: &Ctx,
    base: &str,
    patches: &[ToCommit],
    committer: Option<&mail::Ident>,
    tmp: &Path,
) -> Result<Vec<String>> {
    let index = tmp.join("index");
    let (msg_file, diff_file) = (tmp.join("msg"), tmp.join("patch"));
    let git_ix = || -> Result<Command> {
        let mut c = git(ctx)?;
        c.env("GIT_INDEX_FILE", &index);
        Ok(c)
    };
    output(git_ix()?.args(["read-tree", base]))?;
    let mut parent =
        output(git(ctx)?.args(["rev-parse", "--verify", &format!("{base}^{{commit}}")]))?
            .trim()
            .to_string();
    let mut commits = Vec::new();
    for (i, p) in patches.iter().enumerate() {
        let name = p.file.display();
        let mail = fs::File::open(p.file).with_context(|| format!("cannot read {name}"))?;
        let info = output(
            git(ctx)?
                .arg("mailinfo")
                .arg(&msg_file)
                .arg(&diff_file)
                .stdin(mail),
        )
        .with_context(|| format!("{name}: not a patch mail"))?;
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix(": ")))
                .map(str::to_string)
        };
        let (Some(author), Some(email), Some(subject), Some(date)) = (
            field("Author"),
            field("Email"),
            field("Subject"),
            field("Date"),
        ) else {
            bail!("{name}: no From:, Subject: or Date: header");
        };
        if let Some(me) = committer {
            let diff = fs::read_to_string(&diff_file)?;
            if diff.contains(mail::SENDER_PLACEHOLDER) {
                fs::write(&diff_file, mail::fill_sender(&diff, me))?;
            }
        }
        if let Err(e) = output(git_ix()?.args(["apply", "--cached"]).arg(&diff_file)) {
            bail!(
                "{name} does not apply to {base}{}: {e:#}",
                if i > 0 {
                    " + the patches before it"
                } else {
                    ""
                }
            );
        }
        let tree = output(git_ix()?.arg("write-tree"))?.trim().to_string();
        let body = fs::read_to_string(&msg_file)?;
        let msg = mail::pipe(git(ctx)?.arg("stripspace"), &format!("{subject}\n\n{body}"))?;
        let msg = mail::add_trailers(&msg, p.trailers)?;
        let mut ct = git(ctx)?;
        ct.args(["commit-tree", &tree, "-p", &parent])
            .env("GIT_AUTHOR_NAME", &author)
            .env("GIT_AUTHOR_EMAIL", &email)
            .env("GIT_AUTHOR_DATE", &date)
            .env("GIT_COMMITTER_DATE", &date);
        if let Some(c) = committer {
            ct.env("GIT_COMMITTER_NAME", &c.name)
                .env("GIT_COMMITTER_EMAIL", &c.email);
        }
        parent = mail::pipe(&mut ct, &msg)?.trim().to_string();
        commits.push(parent.clone());
    }
    Ok(commits)
}

/// Puts the tree at `p2pbuf-base` + the series. The commits are made apart from the work tree
/// ([`commit_patches`]), then checked out from where the tree is: only files that differ are
/// written, so a change to the patch files that leaves the tree as it was (their layout, a
/// commit message) rebuilds nothing. Local changes are stashed, never dropped.
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
    // A `git am` that an earlier run (or a developer) left half done would block the checkout.
    let _ = output(git(ctx)?.args(["am", "--abort"]));
    let todo = ToCommit::each(&files, &[]);
    let commits = commit_patches(ctx, "p2pbuf-base", &todo, None)
        .context("the series in linux/series do not apply to the pristine tree")?;
    let tip = commits.last().map_or("p2pbuf-base", String::as_str);
    let tip_tree = output(git(ctx)?.args(["rev-parse", &format!("{tip}^{{tree}}")]))?;
    output(git(ctx)?.args(["checkout", "-q", "-f", "-B", SERIES_BRANCH, tip]))?;
    tree_stamp.set(tip_tree.trim())?;
    stamp.set(&hash)?;
    let same = if tip_tree.trim() == head_tree.trim() {
        " (the same tree as before: no file rewritten)"
    } else {
        ""
    };
    println!(
        "    series: {} patches applied on p2pbuf-base{same}",
        files.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `commit_patches` gives what `git am` gives (tree, author, date, message), in a private
    /// index: the tree's HEAD, index and files stay as they were.
    ///
    /// Over 100 lines on purpose: one scratch repository and its patches serve every case
    /// (what `git am` would give, the same commits twice, the tree untouched, the sender's
    /// trailers, the filled-in placeholder, a series on another base); its setup is a third.
    #[test]
    fn commits_patches_as_git_am_does_without_touching_the_tree() {
        if std::env::var_os("P2PBUF_KSRC").is_some() {
            return; // The kernel tree is named by the environment, not by the test's cache.
        }
        let cache = std::env::temp_dir().join(format!("p2pbuf-commit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        let ctx = Ctx::new(Some(cache.clone()), false).unwrap();
        let tree = cache.join("linux");
        fs::create_dir_all(&tree).unwrap();
        fs::write(cache.join("kernel-tree"), "linux\n").unwrap();
        let g = |args: &[&str]| {
            let mut c = Command::new("git");
            c.current_dir(&tree).args([
                "-c",
                "user.name=Ann Author",
                "-c",
                "user.email=ann@kernel.org",
            ]);
            output(c.args(args)).unwrap()
        };
        g(&["init", "-q"]);
        fs::write(tree.join("a.c"), "one\n").unwrap();
        g(&["add", "a.c"]);
        g(&["commit", "-q", "-m", "base"]);
        g(&["tag", "p2pbuf-base"]);
        fs::write(tree.join("a.c"), "two\n").unwrap();
        g(&[
            "commit",
            "-q",
            "-a",
            "-m",
            "a: two\n\nWhy.\n\nLink: https://l\n",
        ]);
        fs::write(tree.join("b.c"), "M:\t@SENDER@\n").unwrap();
        g(&["add", "b.c"]);
        g(&["commit", "-q", "-m", "b: add"]);
        let want = g(&["log", "--format=%T %an %ae %ad%n%B", "p2pbuf-base.."]);
        let dir = cache.join("out");
        g(&[
            "format-patch",
            "-q",
            "-o",
            dir.to_str().unwrap(),
            "p2pbuf-base..",
        ]);
        g(&["reset", "-q", "--hard", "p2pbuf-base"]);
        let mut files: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let todo = ToCommit::each(&files, &[]);
        let commits = commit_patches(&ctx, "p2pbuf-base", &todo, None).unwrap();
        assert_eq!(commits.len(), 2);
        let tip = commits[1].as_str();
        let got = g(&[
            "log",
            "--format=%T %an %ae %ad%n%B",
            &format!("p2pbuf-base..{tip}"),
        ]);
        assert_eq!(got, want);
        // Same patches, same base: the same commits.
        assert_eq!(
            commit_patches(&ctx, "p2pbuf-base", &todo, None).unwrap(),
            commits
        );
        // The tree itself was not touched.
        assert_eq!(g(&["rev-parse", "HEAD"]), g(&["rev-parse", "p2pbuf-base"]));
        assert_eq!(fs::read_to_string(tree.join("a.c")).unwrap(), "one\n");
        assert!(g(&["status", "--porcelain"]).is_empty());
        // Trailers for the sender, after the patch's own.
        let me = mail::parse_ident("Jane Sender <jane@kernel.org>").unwrap();
        let t = mail::emit_trailers(true, &me);
        let signed = [ToCommit {
            file: &files[0],
            trailers: &t,
        }];
        let c = commit_patches(&ctx, "p2pbuf-base", &signed, Some(&me)).unwrap();
        assert_eq!(
            g(&["log", "-1", "--format=%B%cn <%ce>|%an <%ae>", &c[0]]),
            "a: two\n\nWhy.\n\nLink: https://l\nCc: stable@vger.kernel.org\nSigned-off-by: \
             Jane Sender <jane@kernel.org>\nJane Sender <jane@kernel.org>|Ann Author \
             <ann@kernel.org>\n"
        );
        // The lab keeps the sender's placeholder; the sender's emission fills it in.
        assert_eq!(g(&["show", &format!("{tip}:b.c")]), "M:\t@SENDER@\n");
        let second = [ToCommit {
            file: &files[1],
            trailers: &t,
        }];
        let c2 = commit_patches(&ctx, &commits[0], &second, Some(&me)).unwrap();
        assert_eq!(
            g(&["show", &format!("{}:b.c", c2[0])]),
            "M:\tJane Sender <jane@kernel.org>\n"
        );
        // A patch that does not apply is named.
        let second_alone = [ToCommit {
            file: &files[0],
            trailers: &[],
        }];
        let e = commit_patches(&ctx, &commits[0], &second_alone, None).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains("0001-a-two.patch does not apply to"), "{e}");
        fs::remove_dir_all(&cache).unwrap();
    }
}
