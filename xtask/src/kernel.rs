//! `cargo xtask kernel`: applies the series in `linux/series/` to the pristine tree,
//! configures it from `linux/p2pbuf.config`, and builds bzImage and modules (incrementally),
//! with the cache's Clang/LLVM (`make LLVM=<dir>/`, see [`Ctx::kernel_toolchain`]).
//! The benchmark kernel (`cargo xtask bench`) is configured from the same fragment without
//! its debug block, the KCSAN kernel (`cargo xtask test --boot kcsan`) from the fragment with
//! KCSAN instead of KASAN: each a [`Variant`] of the fragment, generated into its own build
//! directory.

use crate::util::{hash_files, heading, output, run_step, Ctx, Flavour, Stamp};
use crate::{mail, series};
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The branch xtask builds: `p2pbuf-base` plus every series of `linux/series/`, in order.
const SERIES_BRANCH: &str = "xtask-series";

pub struct KernelOpts {
    /// Build the tree as it is (a developer's branch), without applying the series.
    pub keep_tree: bool,
}

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
/// patches on the same base always give the same commits. Returns the new commits, in order.
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

/// The config fragment of the repository.
const FRAGMENT: &str = "linux/p2pbuf.config";

/// The block of [`FRAGMENT`] that the benchmark kernel leaves out: from `# BEGIN debug` to
/// `# END debug`, those lines included.
const DEBUG_BLOCK: &str = "debug";

/// What the benchmark kernel adds to the fragment: the function tracer, to find where the
/// time of a measured path goes (ftrace `function_graph` in the guest, docs/bench.md "Where
/// the time goes"). Dynamic ftrace patches the call sites to NOPs until a tracer is switched
/// on, as distribution kernels ship it; the lab kernel keeps `CONFIG_FTRACE=n`.
pub const BENCH_TRACING: &str = "\
# Bench kernel only (xtask/src/kernel.rs, BENCH_TRACING): the function(-graph) tracer.
CONFIG_FTRACE=y
CONFIG_FUNCTION_TRACER=y
CONFIG_FUNCTION_GRAPH_TRACER=y
CONFIG_DYNAMIC_FTRACE=y
";

/// What the KCSAN kernel puts in the place of the fragment's KASAN lines (the debug block
/// stays otherwise as it is). lib/Kconfig.kcsan (7.3.4): `KCSAN` depends on `HAVE_ARCH_KCSAN`
/// (x86_64), `HAVE_KCSAN_COMPILER` (Clang's `-fsanitize=thread`), `DEBUG_KERNEL` and
/// `!KASAN`, and selects `STACKTRACE`. `RUST` (init/Kconfig) has no KCSAN dependency: the Rust
/// modules load; kbuild instruments C only (scripts/Makefile.kcsan: `CFLAGS_KCSAN`, no rustc
/// flag), so a race is seen where one of its accesses is C (the dma-buf core, udmabuf, rxe,
/// umem_dmabuf, p2pdma, the Rust helpers), with the Rust callers in its stacks.
pub const KCSAN_CONFIG: &str = "\
# KCSAN kernel only (xtask/src/kernel.rs, KCSAN_CONFIG; `cargo xtask test --boot kcsan`):
# the debug block with KCSAN in the place of KASAN, which it cannot share a kernel with.
CONFIG_KASAN=n
CONFIG_KCSAN=y
# Non-strict: the default rules, which the kernel's own code is written to (no
# weak-memory modelling); strict mode reports every plain access that races a marked one.
CONFIG_KCSAN_STRICT=n
# Report a race even when the watched value did not change while the watchpoint was up:
# under TCG the watch window (KCSAN_UDELAY_TASK, 80 us) sees few changes, and a race in our
# code fails the boot whether or not the value happened to change. Other code's races are
# only listed, so the reports this adds there cost nothing but lines.
CONFIG_KCSAN_REPORT_VALUE_CHANGE_ONLY=n
# Races of a task with an interrupt on its own CPU too (rxe receives its packets in the
# network stack's softirq; dma-fence callbacks may run in interrupt context). Off by default
# upstream because some safe per-CPU patterns may be reported: a report is read, not trusted.
CONFIG_KCSAN_INTERRUPT_WATCHER=y
# One report per pair of racing functions every 3 s (the default): a race inside a test's
# loop prints a few reports, not a flood on the console.
CONFIG_KCSAN_REPORT_ONCE_IN_MS=3000
# KCSAN's boot selftest (panics if the detector does not work), enabled from early boot.
CONFIG_KCSAN_SELFTEST=y
CONFIG_KCSAN_EARLY_ENABLE=y
";

/// A kernel configured from a variant of [`FRAGMENT`], generated into its flavour's build
/// directory: the bench kernel and the KCSAN kernel. One generator ([`variant_fragment`]).
pub struct Variant {
    /// The generated fragment's file name, in the flavour's build directory.
    pub file: &'static str,
    /// Whether the variant leaves out the debug block.
    pub without_debug: bool,
    /// Options of the fragment the variant takes out, besides those `extra` sets.
    pub remove: &'static [&'static str],
    /// What the variant appends (and where the fragment sets one of these options, its line
    /// is taken out: the option is set once).
    pub extra: &'static str,
    /// What the variant is, after "`linux/p2pbuf.config` ", in messages.
    pub what: &'static str,
}

/// The benchmark kernel: no debug block, the function tracer.
pub const BENCH: Variant = Variant {
    file: "bench.config",
    without_debug: true,
    remove: &[],
    extra: BENCH_TRACING,
    what: "without its debug block",
};

/// The KCSAN kernel: the debug block, KASAN's lines replaced by [`KCSAN_CONFIG`].
pub const KCSAN: Variant = Variant {
    file: "kcsan.config",
    without_debug: false,
    remove: &["CONFIG_KASAN_GENERIC", "CONFIG_KASAN_INLINE"],
    extra: KCSAN_CONFIG,
    what: "with KCSAN instead of KASAN",
};

impl Flavour {
    /// How the flavour's fragment differs from the repository's (none: the lab kernel's is
    /// the repository's).
    pub fn variant(self) -> Option<&'static Variant> {
        match self {
            Flavour::Debug => None,
            Flavour::Bench => Some(&BENCH),
            Flavour::Kcsan => Some(&KCSAN),
        }
    }
}

/// The fragment of a variant: `text` (without its debug block where the variant says so),
/// without the lines that set an option of `v.remove` or of `v.extra`, then `v.extra`.
pub fn variant_fragment(text: &str, v: &Variant) -> Result<String> {
    let mut gone: Vec<String> = parse_config(v.extra).into_iter().map(|(k, _)| k).collect();
    gone.extend(v.remove.iter().map(|k| k.to_string()));
    let kept = if v.without_debug {
        without_block(text, DEBUG_BLOCK)?
    } else {
        text.to_string()
    };
    let mut out: String = kept
        .lines()
        .filter(|l| {
            parse_config(l)
                .first()
                .is_none_or(|(k, _)| !gone.contains(k))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(v.extra);
    Ok(out)
}

/// `text` without the lines from `# BEGIN <name>` to `# END <name>` (markers included, each
/// alone on its line); every other line kept as it is. An error if the block is missing,
/// unterminated, nested or repeated, or if an END comes without its BEGIN.
pub fn without_block(text: &str, name: &str) -> Result<String> {
    let (begin, end) = (format!("# BEGIN {name}"), format!("# END {name}"));
    let mut out = String::with_capacity(text.len());
    let mut inside: Option<usize> = None;
    let mut blocks = 0;
    for (i, line) in text.lines().enumerate() {
        let marker = line.trim_end();
        if marker == begin {
            if let Some(open) = inside {
                bail!(
                    "line {}: `{begin}` inside the block opened on line {open}",
                    i + 1
                );
            }
            if blocks > 0 {
                bail!("line {}: a second `{begin}` block", i + 1);
            }
            inside = Some(i + 1);
        } else if marker == end {
            if inside.take().is_none() {
                bail!("line {}: `{end}` without a `{begin}` before it", i + 1);
            }
            blocks += 1;
        } else if inside.is_none() {
            out.push_str(line);
            out.push('\n');
        }
    }
    if let Some(open) = inside {
        bail!("line {open}: `{begin}` has no `{end}`");
    }
    if blocks == 0 {
        bail!("no `{begin}` ... `{end}` block");
    }
    Ok(out)
}

/// The options the block `name` of a fragment turns on (`=y`), without `CONFIG_`.
pub fn block_options(text: &str, name: &str) -> Result<Vec<String>> {
    let kept = parse_config(&without_block(text, name)?);
    Ok(parse_config(text)
        .into_iter()
        .filter(|kv| kv.1 == "y" && !kept.contains(kv))
        .map(|(k, _)| k.trim_start_matches("CONFIG_").to_string())
        .collect())
}

/// The fragment the context's kernel is configured from, and a name for it in messages: the
/// repository's for the lab kernel; for the other flavours their [`Variant`] of it, written
/// to `build/<flavour>/<variant file>` (only when it changed).
fn fragment(ctx: &Ctx) -> Result<(PathBuf, String)> {
    let repo = ctx.root.join(FRAGMENT);
    let Some(v) = ctx.flavour.variant() else {
        return Ok((repo, FRAGMENT.to_string()));
    };
    let text =
        fs::read_to_string(&repo).with_context(|| format!("cannot read {}", repo.display()))?;
    let generated = variant_fragment(&text, v)
        .with_context(|| format!("{FRAGMENT}: the variant {}", v.what))?;
    let path = ctx.flavour_build().join(v.file);
    if fs::read_to_string(&path).ok().as_deref() != Some(generated.as_str()) {
        fs::create_dir_all(ctx.flavour_build())?;
        fs::write(&path, generated).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let name = format!("{FRAGMENT} {} ({})", v.what, path.display());
    Ok((path, name))
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
    let (fragment, fragment_name) = fragment(ctx)?;
    let ksrc = ctx.ksrc()?;
    // The toolchain is part of the configuration (CC_IS_CLANG, CLANG_VERSION, what KASAN and
    // Rust may select): another one reconfigures from scratch.
    let hash = hash_files(
        &[fragment.clone(), ksrc.join("Makefile")],
        &[&ctx.llvm_id()?],
    )?;
    let stamp = Stamp(ctx.kbuild().join(".p2pbuf-config.sha256"));
    let dotconfig = ctx.kbuild().join(".config");
    // The stamp alone is not proof: a configuration interrupted after `make tinyconfig` (a
    // killed run) leaves a tiny `.config` behind an older, matching stamp. So the `.config` must
    // also still honour the fragment.
    let honoured = fs::read_to_string(&dotconfig).is_ok_and(|config| {
        fs::read_to_string(&fragment).is_ok_and(|frag| config_mismatches(&frag, &config).is_empty())
    });
    if stamp.fresh(&hash) && honoured {
        println!("    config: up to date");
        return Ok(());
    }
    // Cleared first, so that an interrupted configuration is redone by the next run.
    stamp.clear();
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
        &format!("merge {fragment_name}"),
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
            "{fragment_name} asks for options that Kconfig dropped (a missing dependency?): {}",
            bad.join(", ")
        );
    }
    stamp.set(&hash)?;
    Ok(())
}

pub fn kernel(ctx: &Ctx, opts: &KernelOpts) -> Result<()> {
    heading(&format!(
        "kernel: Linux {} + the p2pbuf series{}",
        crate::setup::KERNEL_SERIES,
        ctx.flavour.note()
    ));
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

/// What the context's kernel build directory holds, in one line for reports: release, tree,
/// configuration and the SHA-256 of its `.config` (first 12 hex digits).
pub fn describe(ctx: &Ctx, keep_tree: bool) -> String {
    let kb = ctx.kbuild();
    let release = fs::read_to_string(kb.join("include/config/kernel.release"))
        .map(|r| r.trim().to_string())
        .unwrap_or_else(|_| format!("{} (release not recorded)", crate::setup::KERNEL_SERIES));
    let tree = if keep_tree {
        "the kernel tree as it was (--keep-tree)".to_string()
    } else {
        let n = series_files(ctx).map(|v| v.len()).unwrap_or(0);
        format!("the p2pbuf series ({n} patches)")
    };
    let config = match ctx.flavour {
        Flavour::Debug => format!("debug lab config ({FRAGMENT}, debug block included)"),
        Flavour::Bench => {
            let dropped = fs::read_to_string(ctx.root.join(FRAGMENT))
                .ok()
                .and_then(|t| block_options(&t, DEBUG_BLOCK).ok())
                .map(|v| v.join(", "))
                .unwrap_or_else(|| "?".into());
            format!(
                "bench config ({FRAGMENT} without its debug block: no {dropped}; \
                 with the function tracer, off unless switched on)"
            )
        }
        Flavour::Kcsan => {
            format!("KCSAN config ({FRAGMENT} with its debug block, KCSAN instead of KASAN)")
        }
    };
    // As `sha256sum .config` prints it.
    let sha: String = fs::read(kb.join(".config"))
        .map(|c| {
            Sha256::digest(c)
                .iter()
                .take(6)
                .map(|b| format!("{b:02x}"))
                .collect()
        })
        .unwrap_or_else(|_| "unknown".into());
    format!("Linux {release} + {tree}, {config}, .config sha256 {sha}")
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

    const FRAG: &str = "CONFIG_A=y\n# about the block\n# BEGIN debug\nCONFIG_KASAN=y\nCONFIG_T=30\nCONFIG_P=n\n# END debug\nCONFIG_B=y\n# CONFIG_C is not set\n";

    #[test]
    fn bench_fragment_leaves_out_the_debug_block_only() {
        assert_eq!(
            without_block(FRAG, "debug").unwrap(),
            "CONFIG_A=y\n# about the block\nCONFIG_B=y\n# CONFIG_C is not set\n"
        );
        // Markers with trailing blanks still count; the last line needs no newline.
        assert_eq!(
            without_block("X=1\n# BEGIN debug  \nY=1\n# END debug\t\nZ=1", "debug").unwrap(),
            "X=1\nZ=1\n"
        );
        assert_eq!(block_options(FRAG, "debug").unwrap(), ["KASAN"]);
    }

    #[test]
    fn bench_fragment_refuses_a_broken_block() {
        for (text, why) in [
            (
                "CONFIG_A=y\n# BEGIN debug\nCONFIG_KASAN=y\n",
                "has no `# END debug`",
            ),
            ("CONFIG_A=y\n# END debug\n", "without a `# BEGIN debug`"),
            (
                "# BEGIN debug\n# BEGIN debug\n# END debug\n# END debug\n",
                "inside the block",
            ),
            (
                "# BEGIN debug\n# END debug\n# BEGIN debug\n# END debug\n",
                "a second",
            ),
            ("CONFIG_A=y\n", "no `# BEGIN debug`"),
            // Another block's markers do not close this one.
            (
                "# BEGIN debug\nCONFIG_X=y\n# END other\n",
                "has no `# END debug`",
            ),
        ] {
            let e = without_block(text, "debug").unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_repository_fragment_has_a_debug_block() {
        let text = fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../linux/p2pbuf.config"),
        )
        .unwrap();
        let bench = without_block(&text, DEBUG_BLOCK).unwrap();
        assert!(bench.contains("CONFIG_PCI_P2PDMA=y"));
        assert!(!bench.contains("CONFIG_DMA_API_DEBUG=y"));
        assert!(!block_options(&text, DEBUG_BLOCK).unwrap().is_empty());
    }

    #[test]
    fn bench_kernel_builds_apart_and_says_what_it_is() {
        let cache = std::env::temp_dir().join(format!("p2pbuf-flavour-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        let debug = Ctx::new(Some(cache.clone()), false).unwrap();
        // The lab kernel keeps the paths it had before flavours (a warm cache stays warm).
        if std::env::var_os("P2PBUF_KBUILD").is_none() {
            assert_eq!(debug.kbuild(), cache.join("build/linux"));
        }
        // A flavour's modules and initramfs live under its build directory.
        let outputs_under = |c: &Ctx, dir: &str| {
            let build = cache.join(dir);
            assert_eq!(
                crate::modules::module_out(c, "importer"),
                build.join("importer")
            );
            let cpio = crate::initramfs::initramfs_path(c);
            assert_eq!(cpio, build.join("initramfs.cpio"));
        };
        outputs_under(&debug, "build");
        let bench = debug.with_flavour(Flavour::Bench);
        assert_eq!(bench.kbuild(), cache.join("build/bench/linux"));
        outputs_under(&bench, "build/bench");
        // The generated fragment: the repository's without its debug block.
        let (path, name) = fragment(&bench).unwrap();
        assert_eq!(path, cache.join("build/bench/bench.config"));
        assert!(name.contains("without its debug block"), "{name}");
        let repo = fs::read_to_string(bench.root.join(FRAGMENT)).unwrap();
        let generated = fs::read_to_string(&path).unwrap();
        assert_eq!(generated, variant_fragment(&repo, &BENCH).unwrap());
        assert!(generated.starts_with(&without_block(&repo, DEBUG_BLOCK).unwrap()[..40]));
        // The tracer is on, once: no `CONFIG_FTRACE=n` of the repository's left to contradict it.
        assert!(config_mismatches(&generated, &generated).is_empty());
        assert_eq!(generated.matches("CONFIG_FTRACE=").count(), 1);
        assert!(generated.ends_with(BENCH_TRACING));
        // What the results say about it.
        let kb = bench.kbuild();
        fs::create_dir_all(kb.join("include/config")).unwrap();
        fs::write(kb.join("include/config/kernel.release"), "7.3.4\n").unwrap();
        fs::write(kb.join(".config"), "CONFIG_PCI_P2PDMA=y\n").unwrap();
        let d = describe(&bench, false);
        assert!(d.starts_with("Linux 7.3.4 + the p2pbuf series ("), "{d}");
        assert!(
            d.contains("bench config (linux/p2pbuf.config without its debug block: no "),
            "{d}"
        );
        for o in block_options(&repo, DEBUG_BLOCK).unwrap() {
            assert!(d.contains(&o), "{o} missing: {d}");
        }
        // `printf 'CONFIG_PCI_P2PDMA=y\n' | sha256sum`
        assert!(d.ends_with(".config sha256 67df6ed8d708"), "{d}");
        assert!(describe(&bench, true).contains("the kernel tree as it was (--keep-tree)"));
        fs::remove_dir_all(&cache).unwrap();
    }

    #[test]
    fn kcsan_fragment_keeps_the_debug_block_and_trades_kasan_for_kcsan() {
        let frag = "CONFIG_A=y\n# BEGIN debug\nCONFIG_KASAN=y\nCONFIG_KASAN_GENERIC=y\nCONFIG_KASAN_INLINE=y\nCONFIG_T=30\n# END debug\nCONFIG_B=y\n";
        let k = variant_fragment(frag, &KCSAN).unwrap();
        assert_eq!(
            k,
            format!(
                "CONFIG_A=y\n# BEGIN debug\nCONFIG_T=30\n# END debug\nCONFIG_B=y\n{KCSAN_CONFIG}"
            )
        );
        let set: std::collections::HashMap<String, String> = parse_config(&k).into_iter().collect();
        assert_eq!(set["CONFIG_KASAN"], "n");
        assert_eq!(set["CONFIG_KCSAN"], "y");
        assert_eq!(set["CONFIG_KCSAN_STRICT"], "n");
        assert!(!set.contains_key("CONFIG_KASAN_GENERIC"));
    }

    #[test]
    fn the_repository_fragment_makes_a_kcsan_kernel() {
        let repo = fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../linux/p2pbuf.config"),
        )
        .unwrap();
        let k = variant_fragment(&repo, &KCSAN).unwrap();
        let set: Vec<(String, String)> = parse_config(&k);
        let get = |o: &str| {
            let v: Vec<&str> = set
                .iter()
                .filter(|(key, _)| key == o)
                .map(|(_, v)| v.as_str())
                .collect();
            v
        };
        // KASAN off once, KCSAN on; no KASAN line of the repository's left to contradict it.
        assert_eq!(get("CONFIG_KASAN"), ["n"]);
        assert!(get("CONFIG_KASAN_GENERIC").is_empty());
        assert!(get("CONFIG_KASAN_INLINE").is_empty());
        assert_eq!(get("CONFIG_KCSAN"), ["y"]);
        assert!(config_mismatches(&k, &k).is_empty());
        // Every other option of the debug block stays (the race tests need SW_SYNC, vivid,
        // fault injection; the checkers still check), and what KCSAN needs is there.
        for o in block_options(&repo, DEBUG_BLOCK).unwrap() {
            let want: &[&str] = match o.as_str() {
                "KASAN" => &["n"],
                _ if o.starts_with("KASAN_") => &[],
                _ => &["y"],
            };
            assert_eq!(get(&format!("CONFIG_{o}")), want, "{o}");
        }
        for o in [
            "CONFIG_DEBUG_KERNEL",
            "CONFIG_RUST",
            "CONFIG_STACKTRACE",
            "CONFIG_KALLSYMS",
        ] {
            assert_eq!(get(o), ["y"], "{o}");
        }
        // The tracer stays off, as on the lab kernel.
        assert_eq!(get("CONFIG_FTRACE"), ["n"]);
    }

    #[test]
    fn kcsan_kernel_builds_apart_and_says_what_it_is() {
        let cache = std::env::temp_dir().join(format!("p2pbuf-kcsan-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        let debug = Ctx::new(Some(cache.clone()), false).unwrap();
        let kcsan = debug.flavoured(Flavour::Kcsan);
        assert_eq!(debug.flavour, Flavour::Debug);
        let build = cache.join("build/kcsan");
        assert_eq!(kcsan.kbuild(), build.join("linux"));
        assert_eq!(
            crate::modules::module_out(&kcsan, "exporter-kmod"),
            build.join("exporter-kmod")
        );
        assert_eq!(
            crate::initramfs::initramfs_path(&kcsan),
            build.join("initramfs.cpio")
        );
        let (path, name) = fragment(&kcsan).unwrap();
        assert_eq!(path, build.join("kcsan.config"));
        assert!(name.contains("with KCSAN instead of KASAN"), "{name}");
        let repo = fs::read_to_string(kcsan.root.join(FRAGMENT)).unwrap();
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            variant_fragment(&repo, &KCSAN).unwrap()
        );
        let d = describe(&kcsan, false);
        assert!(
            d.contains(
                "KCSAN config (linux/p2pbuf.config with its debug block, KCSAN instead of KASAN)"
            ),
            "{d}"
        );
        fs::remove_dir_all(&cache).unwrap();
    }

    /// `commit_patches` gives what `git am` gives (tree, author, date, message), in a private
    /// index: the tree's HEAD, index and files stay as they were.
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
        fs::write(tree.join("b.c"), "new\n").unwrap();
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
