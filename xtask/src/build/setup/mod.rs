//! `cargo xtask setup`: installs what is missing, and nothing else.
//!
//! Debian packages through the system's apt (root or password-less sudo), `rust-src` through
//! rustup, `bindgen-cli` through cargo into the cache, libclang 18 from its PyPI wheel into the
//! cache, Clang/LLVM 18 (the kernel's compiler) from Debian trixie's packages unpacked into the
//! cache and the Linux 7.3 source from Debian's `linux-source-7.3` (both of these through a
//! private apt configuration in the cache: the system's sources are never edited), and b4 from
//! PyPI, pinned, into a virtual environment in the cache (`b4` below).

mod b4;
mod llvm;

use crate::util::{heading, output, run_step, run_step_status, Ctx};
use anyhow::{bail, Context, Result};
pub use b4::{b4_bin, b4_ready, B4_VERSION};
pub use llvm::LLVM_MAJOR;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian packages the lab uses (build, VM, and the real tools that go into the initramfs).
pub const DEB_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "flex",
    "bison",
    "bc",
    "libelf-dev",
    "libssl-dev",
    "cpio",
    "kmod",
    "make",
    "gcc",
    "libc6-dev",
    "python3",
    // b4's virtual environment (`python3 -m venv`).
    "python3-venv",
    "pciutils",
    "iproute2",
    "nvme-cli",
    "cmake",
    "ninja-build",
    // libfabric's source is a git snapshot (autogen.sh).
    "autoconf",
    "automake",
    "libtool",
    "pkg-config",
    "libnl-3-dev",
    "libnl-route-3-dev",
    "libudev-dev",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "libibverbs-dev",
    "librdmacm-dev",
    // bindgen's libclang for userspace/scripts/install.sh (a cluster node's build: no cache).
    "libclang1-14",
    "perftest",
    "jq",
];

/// The kernel series the lab builds: Debian's `linux-source-<KERNEL_SERIES>`.
pub const KERNEL_SERIES: &str = "7.3";
/// The pinned kernel: Debian's `linux-source-7.3` at this version (trixie-backports); any other
/// 7.3.y the archive still has is taken when this one is gone.
pub const KERNEL_PIN: &str = "7.3.4-1~bpo13+1";
const BINDGEN_VERSION: &str = "0.73.2";
const LIBCLANG_WHEEL: &str = "libclang==18.1.1";

pub fn setup(ctx: &Ctx) -> Result<()> {
    heading("setup: host prerequisites");
    debian_packages(ctx)?;
    rust_src(ctx)?;
    bindgen(ctx)?;
    libclang(ctx)?;
    llvm::llvm(ctx)?;
    b4::b4(ctx)?;
    heading(&format!("setup: Linux {KERNEL_SERIES} source"));
    kernel_source(ctx)?;
    Ok(())
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u"))
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
}

/// The command prefix that gets root: nothing, or `sudo -n`; `None` if neither works.
fn root_prefix() -> Option<Vec<&'static str>> {
    if is_root() {
        return Some(vec![]);
    }
    let ok = Command::new("sudo")
        .args(["-n", "true"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ok.then(|| vec!["sudo", "-n"])
}

/// Packages of `wanted` that dpkg does not list as installed.
pub fn missing_packages(wanted: &[&str]) -> Vec<String> {
    wanted
        .iter()
        .filter(|p| {
            Command::new("dpkg-query")
                .args(["-W", "-f=${db:Status-Abbrev}", p])
                .output()
                .map(|o| !String::from_utf8_lossy(&o.stdout).starts_with("ii"))
                .unwrap_or(true)
        })
        .map(|p| p.to_string())
        .collect()
}

fn debian_packages(ctx: &Ctx) -> Result<()> {
    let missing = missing_packages(DEB_PACKAGES);
    if missing.is_empty() {
        println!("    Debian packages: all {} present", DEB_PACKAGES.len());
        return Ok(());
    }
    let list = missing.join(" ");
    let Some(prefix) = root_prefix() else {
        bail!("missing Debian packages: {list}. Install them with `sudo apt-get install {list}` (this needs root, which xtask does not have), then run again");
    };
    let apt = |args: &[&str]| {
        let mut c = Command::new(prefix.first().copied().unwrap_or("apt-get"));
        c.args(prefix.iter().skip(1));
        if !prefix.is_empty() {
            c.arg("apt-get");
        }
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    run_step(
        ctx,
        "apt-get update",
        "setup-apt",
        &mut apt(&["update", "-q"]),
    )
    .context("apt-get update failed: is the network (deb.debian.org) reachable?")?;
    let mut install = apt(&["install", "-y", "-q", "--no-install-recommends"]);
    install.args(&missing);
    run_step(
        ctx,
        &format!("apt-get install {list}"),
        "setup-apt",
        &mut install,
    )?;
    Ok(())
}

fn rust_src(ctx: &Ctx) -> Result<()> {
    let installed = output(Command::new("rustup").args(["component", "list", "--installed"]))
        .context("rustup is needed for rust-src (install Rust with rustup: https://rustup.rs)")?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        println!("    rust-src: present");
        return Ok(());
    }
    run_step(
        ctx,
        "rustup component add rust-src",
        "setup-rust",
        Command::new("rustup").args(["component", "add", "rust-src"]),
    )
}

fn bindgen(ctx: &Ctx) -> Result<()> {
    let bin = ctx.tools_bin().join("bindgen");
    if let Ok(v) = output(Command::new(&bin).arg("--version")) {
        if v.contains(BINDGEN_VERSION) {
            println!("    bindgen: {}", v.trim());
            return Ok(());
        }
    }
    run_step(
        ctx,
        &format!("cargo install bindgen-cli {BINDGEN_VERSION} (about 3 min)"),
        "setup-bindgen",
        Command::new("cargo")
            .args([
                "install",
                "--locked",
                "bindgen-cli",
                "--version",
                BINDGEN_VERSION,
                "--root",
            ])
            .arg(ctx.cache.join("tools")),
    )
}

fn libclang(ctx: &Ctx) -> Result<()> {
    let so = ctx.libclang_dir().join("libclang.so");
    if so.exists() {
        println!("    libclang: {}", so.display());
        return Ok(());
    }
    let dl = ctx.cache.join("dl");
    fs::create_dir_all(&dl)?;
    run_step(
        ctx,
        &format!("pip download {LIBCLANG_WHEEL}"),
        "setup-libclang",
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
            ])
            .arg(&dl)
            .arg(LIBCLANG_WHEEL),
    )?;
    let wheel = find_file(&dl, |n| {
        n.starts_with("libclang-18.1.1") && n.ends_with(".whl")
    })?
    .context("pip downloaded no libclang wheel")?;
    let dest = ctx.cache.join("tools/libclang");
    fs::create_dir_all(&dest)?;
    run_step(
        ctx,
        "unpack libclang wheel",
        "setup-libclang",
        Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&dest),
    )?;
    if !so.exists() {
        bail!("the libclang wheel has no {}", so.display());
    }
    Ok(())
}

pub(super) fn find_file(dir: &Path, pred: impl Fn(&str) -> bool) -> Result<Option<PathBuf>> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| pred(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    found.sort();
    Ok(found.pop())
}

/// A private apt configuration in the cache: Debian sid, trixie and trixie-backports, sid's
/// sources too. Take a package from one suite with `name/suite`.
pub fn private_apt(ctx: &Ctx) -> Result<Vec<String>> {
    let d = ctx.cache.join("apt");
    for sub in ["lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(d.join(sub))?;
    }
    let sources = d.join("sources.list");
    fs::write(&sources, PRIVATE_SOURCES)?;
    let o = |k: &str, v: &Path| format!("-o{k}={}", v.display());
    Ok(vec![
        o("Dir::Etc::SourceList", &sources),
        o("Dir::Etc::SourceParts", Path::new("/dev/null")),
        o("Dir::State::Lists", &d.join("lists")),
        o("Dir::Cache", &d.join("cache")),
        "-oDebug::NoLocking=1".into(),
        "-oAPT::Sandbox::User=root".into(),
    ])
}

const PRIVATE_SOURCES: &str = "deb http://deb.debian.org/debian sid main\n\
     deb http://deb.debian.org/debian trixie main\n\
     deb http://deb.debian.org/debian trixie-backports main\n\
     deb-src http://deb.debian.org/debian sid main\n";

/// Refreshes the private apt lists at most once a day, and whenever the sources changed (the
/// marker holds the sources list its lists were fetched for).
pub fn private_apt_update(ctx: &Ctx, opts: &[String]) -> Result<()> {
    let marker = ctx.cache.join("apt/updated");
    let recent = fs::metadata(&marker)
        .and_then(|m| m.modified())
        .map(|t| t.elapsed().map(|e| e.as_secs() < 86400).unwrap_or(false))
        .unwrap_or(false);
    let same_sources = fs::read_to_string(&marker).is_ok_and(|s| s == PRIVATE_SOURCES);
    if recent && same_sources {
        return Ok(());
    }
    run_step(
        ctx,
        "apt-get update (private lists: sid, trixie, trixie-backports)",
        "setup-kernel",
        Command::new("apt-get").args(opts).arg("update"),
    )
    .context("could not reach deb.debian.org for the private apt lists")?;
    fs::write(marker, PRIVATE_SOURCES)?;
    Ok(())
}

/// Whether a cache directory name (`linux-7.3.4`) holds a tree of [`KERNEL_SERIES`].
fn is_series_tree(name: &str) -> bool {
    name.strip_prefix("linux-")
        .and_then(|v| v.strip_prefix(KERNEL_SERIES))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

// Over 100 lines on purpose: one sequence of logged steps (find or download the pinned .deb,
// unpack, git init, the base commit, the tag), each a few lines, sharing the package's and the
// tree's paths; read top to bottom, it is the order of the set-up.
fn kernel_source(ctx: &Ctx) -> Result<()> {
    let pkg = format!("linux-source-{KERNEL_SERIES}");
    let prefix = format!("{pkg}_");
    if let Ok(tree) = ctx.ksrc() {
        let ours = tree
            .file_name()
            .is_some_and(|n| is_series_tree(&n.to_string_lossy()));
        if ours && tree.join(".git").exists() && tree.join("Makefile").exists() {
            println!("    kernel tree: {}", tree.display());
            return Ok(());
        }
        if !ours {
            println!(
                "    kernel tree {} is not Linux {KERNEL_SERIES}: setting up {pkg} beside it",
                tree.display()
            );
        }
    }
    let dl = ctx.cache.join("dl");
    fs::create_dir_all(&dl)?;
    let is_deb = |n: &str| n.starts_with(&prefix) && n.ends_with(".deb");
    let deb = match find_file(&dl, is_deb)? {
        Some(d) => d,
        None => {
            let opts = private_apt(ctx)?;
            private_apt_update(ctx, &opts)?;
            let pinned = format!("{pkg}={KERNEL_PIN}");
            let r = run_step(
                ctx,
                &format!("apt-get download {pinned}"),
                "setup-kernel",
                Command::new("apt-get")
                    .args(&opts)
                    .arg("download")
                    .arg(&pinned)
                    .current_dir(&dl),
            );
            if r.is_err() {
                println!(
                    "    {KERNEL_PIN} is gone from the archive; taking the newest {KERNEL_SERIES}.y it has"
                );
                run_step(
                    ctx,
                    &format!("apt-get download {pkg}"),
                    "setup-kernel",
                    Command::new("apt-get")
                        .args(&opts)
                        .args(["download", &pkg])
                        .current_dir(&dl),
                )?;
            }
            find_file(&dl, is_deb)?
                .with_context(|| format!("apt-get download left no {pkg} package"))?
        }
    };
    // linux-source-7.3_7.3.4-1~bpo13+1_all.deb -> 7.3.4
    let fname = deb
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let version = fname
        .trim_start_matches(&prefix)
        .split(['-', '_'])
        .next()
        .unwrap_or(KERNEL_SERIES)
        .to_string();
    let name = format!("linux-{version}");
    let tree = ctx.cache.join(&name);
    let x = ctx.cache.join("dl/x");
    let _ = fs::remove_dir_all(&x);
    let _ = fs::remove_dir_all(&tree);
    run_step(
        ctx,
        &format!("dpkg -x {pkg}"),
        "setup-kernel",
        Command::new("dpkg").arg("-x").arg(&deb).arg(&x),
    )?;
    run_step(
        ctx,
        &format!("unpack {pkg}.tar.xz (about 30 s)"),
        "setup-kernel",
        Command::new("tar")
            .arg("xf")
            .arg(x.join(format!("usr/src/{pkg}.tar.xz")))
            .arg("-C")
            .arg(&ctx.cache),
    )?;
    fs::rename(ctx.cache.join(&pkg), &tree)?;
    let _ = fs::remove_dir_all(&x);
    // A git repository: the pristine tree, then one commit that drops Debian's top-level
    // ignore pattern (it hides new files of the series from git). The series applies on
    // `p2pbuf-base`.
    let git = |args: &[&str]| -> Command {
        let mut c = crate::util::xtask_git(&tree);
        c.args(args);
        c
    };
    run_step(
        ctx,
        "git init kernel tree",
        "setup-kernel",
        &mut git(&["init", "-q", "-b", "pristine"]),
    )?;
    run_step(
        ctx,
        "git add kernel tree (about 1 min)",
        "setup-kernel",
        &mut git(&["add", "-f", "-A"]),
    )?;
    let msg = format!("Linux {version} (Debian {fname})");
    run_step(
        ctx,
        "git commit pristine tree",
        "setup-kernel",
        &mut git(&["commit", "-q", "-m", &msg]),
    )?;
    run_step(
        ctx,
        "git tag",
        "setup-kernel",
        &mut git(&["tag", &format!("v{version}")]),
    )?;
    let gi = tree.join(".gitignore");
    let s = fs::read_to_string(&gi)?;
    if let Some(i) = s.find("#\n# Debian packaging") {
        fs::write(&gi, &s[..i])?;
        run_step(
            ctx,
            "git commit ignore fix",
            "setup-kernel",
            &mut git(&[
                "commit",
                "-q",
                "-a",
                "-m",
                "p2pbuf: drop Debian's top-level ignore so series files are tracked",
            ]),
        )?;
    }
    run_step(
        ctx,
        "git tag p2pbuf-base",
        "setup-kernel",
        &mut git(&["tag", "p2pbuf-base"]),
    )?;
    fs::write(ctx.cache.join("kernel-tree"), &name)?;
    println!("    kernel tree: {}", tree.display());
    Ok(())
}

/// The `.orig` tarball `file` of Debian source package `pkg` at `version`, downloaded into the
/// cache's `dl/` with the private apt configuration unless it is there already.
pub fn debian_orig_tarball(ctx: &Ctx, pkg: &str, version: &str, file: &str) -> Result<PathBuf> {
    let dl = ctx.cache.join("dl");
    let tb = dl.join(file);
    if tb.exists() {
        return Ok(tb);
    }
    fs::create_dir_all(&dl)?;
    let opts = private_apt(ctx)?;
    private_apt_update(ctx, &opts)?;
    // The mirror sometimes answers 404 for the .dsc (or the Debian tarball) while the orig
    // tarball downloads fine, and apt then exits non-zero: look for the tarball, not at apt's
    // exit code, and report a failure only when the tarball is not there.
    let title = format!("apt-get source --download-only {pkg}");
    let run = run_step_status(
        ctx,
        &title,
        pkg,
        Command::new("apt-get")
            .args(&opts)
            .args(["source", "--download-only", &format!("{pkg}={version}")])
            .current_dir(&dl),
    )?;
    let apt_output = step_output(&run.log_path, &title);
    match orig_fetch(run.status.success(), &apt_output, tb.exists()) {
        OrigFetch::Complete => {}
        OrigFetch::OrigOnly(why) => println!("    {pkg}: {why}"),
        OrigFetch::Missing => {
            let msg = format!(
                "could not download {} from Debian sid's source packages ({pkg} {version})",
                tb.display()
            );
            if run.status.success() {
                bail!(msg);
            }
            return Err(run.failed(&title).context(msg));
        }
    }
    Ok(tb)
}

/// What `apt-get source --download-only` left for [`debian_orig_tarball`].
#[derive(Debug, PartialEq, Eq)]
enum OrigFetch {
    /// apt fetched every file and the orig tarball is there.
    Complete,
    /// apt failed on other files, but the orig tarball is there: the build goes on, with one
    /// quiet line that says why apt failed.
    OrigOnly(&'static str),
    /// The orig tarball is not there: the build cannot go on.
    Missing,
}

/// Decides from apt's exit, its output (`Err:1 http://… sid/main rdma-core 65.0-1.1 (dsc)`
/// for each file it could not fetch) and whether the orig tarball is in `dl/`.
fn orig_fetch(apt_ok: bool, apt_output: &str, orig_present: bool) -> OrigFetch {
    if !orig_present {
        return OrigFetch::Missing;
    }
    if apt_ok {
        return OrigFetch::Complete;
    }
    let no_dsc = apt_output
        .lines()
        .any(|l| l.starts_with("Err:") && l.trim_end().ends_with(" (dsc)"));
    OrigFetch::OrigOnly(if no_dsc {
        "no .dsc on this mirror: using the orig tarball"
    } else {
        "apt-get source failed (see its log): using the orig tarball it fetched"
    })
}

/// What the step `title` wrote to its log `log_path` (the text after its last `### title`
/// header; the whole log if there is none).
fn step_output(log_path: &Path, title: &str) -> String {
    let log = fs::read_to_string(log_path).unwrap_or_default();
    let header = format!("### {title}\n");
    match log.rfind(&header) {
        Some(i) => log[i + header.len()..].to_string(),
        None => log,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `apt-get source --download-only rdma-core=65.0-1.1` on this project's mirror, as its
    /// log has it (exit status 100): the .dsc and the Debian tarball 404, the orig tarball comes.
    const APT_NO_DSC: &str = "\
Reading package lists...
NOTICE: 'rdma-core' packaging is maintained in the 'Git' version control system at:
https://salsa.debian.org/debian/rdma-core.git
Need to get 2103 kB of source archives.
Err:1 http://deb.debian.org/debian sid/main rdma-core 65.0-1.1 (dsc)
  404  Not Found [IP: 203.0.113.80 80]
Get:2 http://deb.debian.org/debian sid/main rdma-core 65.0-1.1 (tar) [2073 kB]
Err:3 http://deb.debian.org/debian sid/main rdma-core 65.0-1.1 (diff)
  404  Not Found [IP: 203.0.113.80 80]
Fetched 2073 kB in 0s (8621 kB/s)
E: Failed to fetch http://deb.debian.org/debian/pool/main/r/rdma-core/rdma-core_65.0-1.1.dsc  404  Not Found [IP: 203.0.113.80 80]
E: Failed to fetch http://deb.debian.org/debian/pool/main/r/rdma-core/rdma-core_65.0-1.1.debian.tar.xz  404  Not Found [IP: 203.0.113.80 80]
E: Failed to fetch some archives.
";

    #[test]
    fn orig_tarball_without_dsc_is_no_error() {
        // The fresh-machine case: apt fails, the orig tarball is there, the build goes on.
        assert_eq!(
            orig_fetch(false, APT_NO_DSC, true),
            OrigFetch::OrigOnly("no .dsc on this mirror: using the orig tarball")
        );
        assert_eq!(
            orig_fetch(true, "Fetched 2073 kB\n", true),
            OrigFetch::Complete
        );
        // apt failed for another reason, yet the tarball came: still quiet, but not "no .dsc".
        assert_eq!(
            orig_fetch(false, "E: Failed to fetch some archives.\n", true),
            OrigFetch::OrigOnly(
                "apt-get source failed (see its log): using the orig tarball it fetched"
            )
        );
        // No tarball: the one case that stops the build, whatever apt said.
        assert_eq!(orig_fetch(false, APT_NO_DSC, false), OrigFetch::Missing);
        assert_eq!(orig_fetch(true, "", false), OrigFetch::Missing);
    }

    #[test]
    fn step_output_is_the_last_run_of_the_step() {
        let dir = std::env::temp_dir().join(format!("xtask-step-output-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("rdma-core.log");
        let t = "apt-get source --download-only rdma-core";
        fs::write(
            &log,
            format!("\n### {t}\nold run\n### exit: 100\n\n### {t}\n### cmd\n{APT_NO_DSC}### exit: 100\n"),
        )
        .unwrap();
        let out = step_output(&log, t);
        assert!(out.starts_with("### cmd\nReading package lists"), "{out}");
        assert!(!out.contains("old run"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn series_tree_names() {
        assert_eq!(KERNEL_SERIES, "7.3");
        assert!(is_series_tree("linux-7.3.4"));
        assert!(is_series_tree("linux-7.3"));
        // A cache set up for 7.2 gets a 7.3 tree beside it.
        assert!(!is_series_tree("linux-7.2.13"));
        // 7.30 is not 7.3.
        assert!(!is_series_tree("linux-7.30.1"));
        assert!(!is_series_tree("7.3.4"));
    }
}
